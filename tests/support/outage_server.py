"""One server instance for the store-outage tests: `python tests/support/outage_server.py --port 0`.

MRTR_HOST picks the host: `sdk` (`mrtr.Flows` on the SDK's MCPServer, default) or `fastmcp`
(`mrtr.fastmcp.Flows`). Built as the README's fleet recipe (a shared key and a shared store;
the replay guard and the fleet bus come from the store). Side effects live outside the store,
so they survive its outage and tell what really ran: every step appends one JSON line
(`tag`, `step`, `phase`, idempotency `key`) to MRTR_AUDIT in one `O_APPEND` write.

Flows:
- `job(tag, slow)`: a durable task (`task="required"`): steps `one` and `two` (sleeps `slow` s);
  returns `"<tag>:done"`.
- `hello(tag)`: an inline flow of one round and one step: it needs no store.
- `ask(tag)`: an inline flow with a question; its second round passes the replay guard, in the store.

Environment: MRTR_STATE_KEY (hex), MRTR_STORE (URL), MRTR_STORE_NAMESPACE, MRTR_AUDIT (file),
MRTR_LEASE (seconds, default 2), MRTR_GUARD_OUTAGE (`Flows(replay_guard_outage=...)`: `fail_closed`,
the default, or `degrade`). `GET /healthz` answers without the store.
Prints `outage-server ready: URL` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

READY = "outage-server ready:"


class Number(BaseModel):
    value: int


def audit(tag: str, step: str, phase: str) -> None:
    line = {"tag": tag, "step": step, "phase": phase, "key": mrtr.current_step().idempotency_key}
    fd = os.open(os.environ["MRTR_AUDIT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


async def effect(tag: str, step: str, seconds: float = 0.0) -> str:
    audit(tag, step, "start")
    if seconds:
        await asyncio.sleep(seconds)
    audit(tag, step, "end")
    return step


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def _options() -> dict[str, Any]:
    namespace = os.environ.get("MRTR_STORE_NAMESPACE", "mrtr_outage")
    return {
        "store": mrtr.open_store(os.environ["MRTR_STORE"], namespace=namespace),
        "task_lease": float(os.environ.get("MRTR_LEASE", "2.0")),
        "task_scan_interval": 0.2,
        "task_poll_interval": 0.1,
        "replay_guard_outage": "degrade" if os.environ.get("MRTR_GUARD_OUTAGE") == "degrade" else "fail_closed",
    }


def sdk_app() -> Any:
    from mcp.server.mcpserver import MCPServer

    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    server = MCPServer("outage", request_state_security=RequestStateSecurity(keys=[key]))
    flows = mrtr.Flows(server, **_options())

    @flows.tool(task="required")
    async def job(tag: str, slow: float, ctx: mrtr.FlowContext) -> str:
        await ctx.step("one", effect, tag, "one")
        await ctx.step("two", effect, tag, "two", slow)
        return f"{tag}:done"

    @flows.tool()
    async def hello(tag: str, ctx: mrtr.FlowContext) -> str:
        return f"hello {await ctx.step('greet', effect, tag, 'greet')}"

    @flows.tool()
    async def ask(tag: str, ctx: mrtr.FlowContext) -> str:
        z = await ctx.elicit(f"{tag} z?", Number, key="z")
        return f"{tag}:{await ctx.step('add', effect, tag, 'add')}:{z.value}"

    server.custom_route("/healthz", methods=["GET"])(healthz)
    return flows.streamable_http_app(stateless_http=True)


def fastmcp_app() -> Any:
    from fastmcp import FastMCP

    import mrtr.fastmcp

    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    mcp: Any = FastMCP("outage", request_state_security=RequestStateSecurity(keys=[key]))
    flows = mrtr.fastmcp.Flows(mcp, **_options())

    @flows.tool(task="required")
    async def job(tag: str, slow: float) -> str:
        await mrtr.step("one", effect, tag, "one")
        await mrtr.step("two", effect, tag, "two", slow)
        return f"{tag}:done"

    @flows.tool()
    async def hello(tag: str) -> str:
        return f"hello {await mrtr.step('greet', effect, tag, 'greet')}"

    mcp.custom_route("/healthz", methods=["GET"])(healthz)
    return flows.http_app()


if __name__ == "__main__":
    serve_main(fastmcp_app if os.environ.get("MRTR_HOST") == "fastmcp" else sdk_app, READY)
