"""One flow, every dialect: `python tests/dialects/server.py --port 0`.

Reads MRTR_STATE_KEY (hex; the fleet shares it), MRTR_INSTANCE (label) and MRTR_AUDIT (a
file each step appends a JSON line to, so tests count real side effects). Serves `/mcp`
(2026-07-28, and the saga and incomplete dialects), `/mcp/sketch` and `/mcp/draft`.
Prints `dialect-server ready: URL` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from tests.serving import serve_http  # noqa: E402

READY_PREFIX = "dialect-server ready:"
INSTANCE = os.environ.get("MRTR_INSTANCE", "?")


class Login(BaseModel):
    name: str


class Confirm(BaseModel):
    send: bool


def lookup(location: str) -> str:
    """The flow's side effect: must run once per flow, whichever instance serves the round."""
    key = mrtr.current_step().idempotency_key
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps({"step": "lookup", "instance": INSTANCE, "key": key}) + "\n")
    return f"72F and partly cloudy in {location}"


def build_server() -> tuple[MCPServer, mrtr.Flows]:
    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    server = MCPServer("weather", request_state_security=RequestStateSecurity(keys=[key]))
    flows = mrtr.Flows(server, dialects=["sketch", "draft", "incomplete", "saga"])

    @flows.tool()
    async def get_weather(location: str, ctx: mrtr.FlowContext) -> str:
        """Three rounds: who is asking, then the client's LLM, then a confirmation."""
        login = await ctx.elicit("Please provide your GitHub username", Login, key="github_login")
        weather = await ctx.step("lookup", lookup, location)
        advice = await ctx.sample(f"What to wear in {weather}?", max_tokens=100, key="what_to_wear")
        text = advice.content.text if advice.content.type == "text" else "?"
        ok = await ctx.elicit(f"Send the forecast to {login.name}?", Confirm, key="confirm")
        if not ok.send:
            return "not sent"
        return f"{login.name}: {weather}. {text} [flow {ctx.flow_id}]"

    @server.tool()
    def ping_tool() -> str:
        """A plain SDK tool: dialects pass non-flow calls through unchanged."""
        return "pong"

    return server, flows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    _, flows = build_server()
    asyncio.run(serve_http(flows.streamable_http_app(), args.port, READY_PREFIX))


if __name__ == "__main__":
    main()
