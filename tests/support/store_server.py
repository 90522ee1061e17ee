"""The fleet server the store-fault tests and benchmark run: `python tests/support/store_server.py --port 0`.

The README's fleet recipe (a shared key, a Redis or PostgreSQL store, nothing else: the replay
guard and the fleet bus come from the store), with side effects that live OUTSIDE the store, so
they survive its outage and tell what really ran: every step appends one JSON line (idempotency
key, flow label, step, instance, pid, start and end) to the file STORE_AUDIT, in one `write` of
an `O_APPEND` file (lines from several processes never interleave).

Flows:
- `job(flow, n, slow)`: a durable task (`task="required"`): steps `fetch`, `work` (sleeps `slow`
  s) and `finish`; returns `2 * n + 1`. Its progress lives in the store.
- `quick(flow, n)`: an inline flow of one round and one step; returns `n + 1`. It needs no store.
- `ask(flow, n)`: an inline flow with a question (`z`); its second round goes past the replay
  guard, which lives in the store; returns `n + z`.

Also `GET /healthz` (this instance's own health: it answers without the store) for the balancer.

Environment: MRTR_STATE_KEY (hex), MRTR_INSTANCE (label), MRTR_STORE (the store URL, usually
through this instance's `tests/support/storeproxy.py`), MRTR_STORE_NAMESPACE, STORE_AUDIT (file),
STORE_PORT (port used when `--port 0` is given, so HAProxy knows it in advance), MRTR_TASK_LEASE
(seconds, default 2), STORE_SCAN_INTERVAL (seconds between task scans, default 0.25),
MRTR_GUARD_OUTAGE (`Flows(replay_guard_outage=...)`: `fail_closed`, the default, or `degrade`).
Prints `store-server ready: URL instance=LABEL` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from tests.support.chaos_server import exit_with_parent  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

READY_PREFIX = "store-server ready:"
INSTANCE = os.environ.get("MRTR_INSTANCE", "?")


class Number(BaseModel):
    value: int


def audit(flow: str, step: str, started: float) -> None:
    """One line per side effect that really ran, written in one append (atomic among processes)."""
    record = {
        "key": mrtr.current_step().idempotency_key,
        "flow": flow,
        "step": step,
        "instance": INSTANCE,
        "pid": os.getpid(),
        "start": started,
        "end": time.time(),
    }
    fd = os.open(os.environ["STORE_AUDIT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


async def effect(flow: str, step: str, value: int, seconds: float = 0.0) -> int:
    started = time.time()
    if seconds:
        await asyncio.sleep(seconds)
    audit(flow, step, started)
    return value


def build_server(key: bytes) -> tuple[MCPServer, mrtr.Flows]:
    server = MCPServer("store-fleet", request_state_security=RequestStateSecurity(keys=[key]))
    namespace = os.environ.get("MRTR_STORE_NAMESPACE", "mrtr_store_fleet")
    flows = mrtr.Flows(
        server,
        store=mrtr.open_store(os.environ["MRTR_STORE"], namespace=namespace),
        task_lease=float(os.environ.get("MRTR_TASK_LEASE", "2.0")),
        task_scan_interval=float(os.environ.get("STORE_SCAN_INTERVAL", "0.25")),
        task_poll_interval=0.1,
        replay_guard_outage="degrade" if os.environ.get("MRTR_GUARD_OUTAGE") == "degrade" else "fail_closed",
    )

    @flows.tool(task="required")
    async def job(flow: str, n: int, slow: float, ctx: mrtr.FlowContext) -> int:
        """A durable task of three steps; its progress is checkpointed in the store."""
        fetched = await ctx.step("fetch", effect, flow, "fetch", n)
        worked = await ctx.step("work", effect, flow, "work", fetched * 2, slow)
        return await ctx.step("finish", effect, flow, "finish", worked + 1)

    @flows.tool()
    async def quick(flow: str, n: int, ctx: mrtr.FlowContext) -> int:
        """One round, no step: it has nothing a resend could run twice, so it needs no store, even
        joined to its resends by `FlowClient`'s key (a step would wait for the store: `ask`)."""
        return n + 1

    @flows.tool()
    async def ask(flow: str, n: int, ctx: mrtr.FlowContext) -> int:
        """A question, then a step: the answer's round is checked by the replay guard."""
        z = await ctx.elicit(f"{flow} z?", Number, key="z")
        return await ctx.step("add", effect, flow, "add", n + z.value)

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> JSONResponse:
        """The balancer's health check: this process is up (the store's health is not asked)."""
        return JSONResponse({"ok": True, "instance": INSTANCE})

    return server, flows


def main() -> None:
    exit_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    port = args.port or int(os.environ.get("STORE_PORT", "0"))
    _, flows = build_server(bytes.fromhex(os.environ["MRTR_STATE_KEY"]))
    asyncio.run(serve_http(flows.streamable_http_app(), port, READY_PREFIX, ready_suffix=f"instance={INSTANCE}"))


if __name__ == "__main__":
    main()
