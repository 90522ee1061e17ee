"""A flow server for the client fault tests: `python tests/support/fault_server.py --port 0`.

Reads MRTR_STATE_KEY (hex), MRTR_INSTANCE (label), MRTR_AUDIT (a file each step appends a
JSON line to: which instance started and finished what) and, optionally, MRTR_STORE (a
`mrtr.open_store` URL: then `remember` can run as a durable task). Serves stateful HTTP
(the SDK default), so legacy clients get real sessions that other instances do not know.
Prints `fault-server ready: URL` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from mrtr.stores import open_store  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

INSTANCE = os.environ.get("MRTR_INSTANCE", "?")
READY = "fault-server ready:"


class Word(BaseModel):
    word: str


def audit(step: str, phase: str, label: str) -> None:
    line = {"step": step, "phase": phase, "label": label, "instance": INSTANCE, "pid": os.getpid()}
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps(line) + "\n")


async def work(label: str, seconds: float) -> str:
    audit("work", "start", label)
    await asyncio.sleep(seconds)
    audit("work", "end", label)
    return INSTANCE


def build_server() -> tuple[MCPServer, mrtr.Flows]:
    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    server = MCPServer("fault-fleet", request_state_security=RequestStateSecurity(keys=[key]))
    store_url = os.environ.get("MRTR_STORE")
    flows = mrtr.Flows(server, store=open_store(store_url) if store_url else None, task_poll_interval=0.1)

    @flows.tool()
    async def three_rounds(name: str, ctx: mrtr.FlowContext) -> str:
        """Two questions, one after the other: three requests, any instance each."""
        first = await ctx.elicit(f"{name}: first word?", Word)
        second = await ctx.elicit(f"{name}: second word?", Word)
        return f"{name}:{first.word}:{second.word}"

    @flows.tool()
    async def slow(label: str, seconds: float, ctx: mrtr.FlowContext) -> str:
        """One slow step (audited at start and end), so a test can kill the instance running it."""
        ran_on = await ctx.step("work", work, label, seconds)
        return f"{label} done on {ran_on}"

    @server.tool()
    async def shed(label: str, times: int, ctx: Context) -> CallToolResult | InputRequiredResult:
        """Answers its first `times` requests the way an overloaded instance does: progress only, no question."""
        done = int((ctx.request_state or "shed:0").rpartition(":")[2])
        if done < times:
            return InputRequiredResult(request_state=f"shed:{done + 1}")
        return CallToolResult(content=[TextContent(type="text", text=f"{label} resumed after {done} sheds")])

    @server.tool()
    async def chatty(text: str, ctx: Context) -> str:
        """Logs before answering: the log message travels on the same response stream, first."""
        await ctx.info(f"about to echo {text}")
        return text

    if store_url:

        @flows.tool(task="optional")
        async def remember(text: str, ctx: mrtr.FlowContext) -> str:
            """A task-capable tool: one step, no questions."""
            await ctx.step("note", work, text, 0.0)
            return f"noted {text}"

    return server, flows


def main() -> None:
    serve_main(lambda: build_server()[1].streamable_http_app(), READY)


if __name__ == "__main__":
    main()
