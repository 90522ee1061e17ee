"""The interop fixture: one mrtr server whose single flow every foreign client must complete.

`shopping_list` touches everything a multi round-trip flow can ask of a client, so one
run per client shows the whole surface works with that peer:

1. an elicitation and the client's roots, gathered into one round;
2. a loop of elicitations, one item per round, until the user ticks "done";
3. a step (a side effect journaled once; the final text says how often it really ran);
4. sampling (the client's "LLM" names the list);

and a decline path: a declined elicitation is left uncaught, so mrtr ends the call with a
tool error saying the user declined. Questions and the final text come from
`scenario.py`, so each client can check its result exactly.

Usage:
    python tests/external/interop/server.py --port 0     # streamable HTTP at 127.0.0.1:PORT/mcp (0: any free port)
    python tests/external/interop/server.py --stdio      # stdio

Over HTTP it prints `tests.support.servers.READY_PREFIX URL` once it listens, so the colleague's
spawn helpers in `tests/support/servers.py` can wait for it. The state key comes from
`MRTR_STATE_KEY` (hex) when set, else a random one (each process is its own fleet).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.request_state import RequestStateSecurity  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

import mrtr  # noqa: E402
from tests.external.interop import scenario  # noqa: E402
from tests.support.servers import READY_PREFIX  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

SERVER_NAME = "mrtr-interop"
MAX_ITEMS = 10

SAVES: Counter[str] = Counter()
"""flow id -> how many times the `save` step really ran in this process (must end at 1)."""


class Owner(BaseModel):
    name: str = Field(description="Who the list is for")


class Item(BaseModel):
    item: str = Field(default="", description="One thing to buy (leave empty when done)")
    done: bool = Field(default=False, description="Tick when the list is complete")


class Keep(BaseModel):
    keep: bool = Field(description="Keep what the model said")


def save_list(items: list[str]) -> str:
    """The side effect: stands in for writing the list somewhere; counted, so a re-run shows."""
    step = mrtr.current_step()
    SAVES[step.flow_id] += 1
    return f"list-{len(items)}"


def build_server(key: bytes) -> MCPServer:
    """The fixture server with its one flow."""
    server = MCPServer(SERVER_NAME, request_state_security=RequestStateSecurity(keys=[key]))
    flows = mrtr.Flows(server)

    @flows.tool()
    async def shopping_list(store: str, ctx: mrtr.FlowContext) -> str:
        """Build a shopping list with the user: who it is for, then one item per question."""
        # Keys are left to mrtr (derived from each question): foreign clients must treat them as opaque.
        owner, roots = await ctx.gather(ctx.elicit(scenario.owner_question(store), Owner), ctx.list_roots())
        items: list[str] = []
        for n in range(1, MAX_ITEMS + 1):
            pick = await ctx.elicit(scenario.item_question(n, owner.name, store, items), Item)  # Declined: uncaught
            if pick.item.strip():
                items.append(pick.item.strip())
            if pick.done or not pick.item.strip():
                break
        await ctx.step("save", save_list, items)
        completion = await ctx.sample(scenario.title_prompt(items), max_tokens=20)
        title = completion.content.text if completion.content.type == "text" else "(not text)"
        root = str(roots[0].uri) if roots else "(none)"
        # Reading SAVES here is a test probe, not flow logic: it is only used in the final answer.
        return scenario.final_text(title, owner.name, items, root, SAVES[ctx.flow_id])

    @flows.tool()
    async def echo_and_confirm(word: str, ctx: mrtr.FlowContext) -> str:
        """Sample first (the client's "LLM" echoes a word), then ask whether to keep it; a refusal is
        caught and named, so a client whose non-interactive mode can only cancel still completes."""
        completion = await ctx.sample(scenario.echo_prompt(word), max_tokens=20)
        said = completion.content.text if completion.content.type == "text" else "(not text)"
        try:
            keep = await ctx.elicit(scenario.keep_question(said), Keep)
            verdict = "kept" if keep.keep else "dropped"
        except mrtr.InputRefused as refused:
            verdict = f"not kept: the user {refused.action} the question"
        return scenario.echo_text(said, verdict)

    @flows.tool()
    async def keep_word(word: str, ctx: mrtr.FlowContext) -> str:
        """One question and nothing else: for clients that answer forms but offer no sampling or roots."""
        keep = await ctx.elicit(scenario.keep_question(word), Keep)
        return scenario.keep_text(word, "kept" if keep.keep else "dropped")

    return server


def load_key() -> bytes:
    """`MRTR_STATE_KEY` (hex) if given, so several processes could share flows; else a fresh key."""
    raw = os.environ.get("MRTR_STATE_KEY")
    return bytes.fromhex(raw) if raw else os.urandom(32)


async def serve(server: MCPServer, port: int) -> None:
    """Streamable HTTP on 127.0.0.1 only; both eras on one app (legacy clients get stateful sessions)."""
    await serve_http(server.streamable_http_app(), port, READY_PREFIX)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="serve streamable HTTP on 127.0.0.1:PORT/mcp (0: any free port)")
    where.add_argument("--stdio", action="store_true", help="serve over stdin/stdout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    server = build_server(load_key())
    if args.stdio:
        asyncio.run(server.run_stdio_async())
    else:
        asyncio.run(serve(server, args.port))


if __name__ == "__main__":
    main()
