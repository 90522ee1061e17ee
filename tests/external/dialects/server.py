"""One flow, every dialect: `python tests/external/dialects/server.py --port 0`.

Reads MRTR_STATE_KEY (hex; the fleet shares it), MRTR_INSTANCE (label) and MRTR_AUDIT (a
file each step appends a JSON line to, so tests count real side effects). Serves `/mcp`
(2026-07-28, and the saga and incomplete dialects), `/mcp/sketch` and `/mcp/draft`.
Optional: MRTR_STORE (a task store URL, e.g. sqlite:///path, shared by the fleet: seed 001's
persistent workflow, the `echo` task) and MRTR_TOKENS (`name=token,...`: bearer auth, one
principal per token, as in `tests/support/task_server.py`).
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
from mcp_types import ModelHint, ModelPreferences
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from mrtr.stores import open_store  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402
from tests.support.task_server import token_auth  # noqa: E402

READY_PREFIX = "dialect-server ready:"
INSTANCE = os.environ.get("MRTR_INSTANCE", "?")


class Login(BaseModel):
    name: str


class Confirm(BaseModel):
    send: bool


class Target(BaseModel):
    target: str


class EchoInput(BaseModel):
    input: str


SEED_000_WEATHER = "Current weather in New York:\nTemperature: 72\u00c2\u00b0F\nConditions: Partly cloudy"
"""Seed 000's final result text, byte for byte (its mojibake included)."""


def lookup(location: str) -> str:
    """The flow's side effect: must run once per flow, whichever instance serves the round."""
    key = mrtr.current_step().idempotency_key
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps({"step": "lookup", "instance": INSTANCE, "key": key}) + "\n")
    return f"72F and partly cloudy in {location}"


def audited(step: str, value: str) -> str:
    """A counted side effect of seed 001's echo task."""
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps({"step": step, "instance": INSTANCE, "key": mrtr.current_step().idempotency_key}) + "\n")
    return value


def build_server() -> tuple[MCPServer, mrtr.Flows]:
    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    store_url = os.environ.get("MRTR_STORE")
    server = MCPServer("weather", request_state_security=RequestStateSecurity(keys=[key]), **token_auth())
    flows = mrtr.Flows(
        server,
        dialects=["sketch", "draft", "incomplete", "saga"],
        store=open_store(store_url) if store_url else None,
        task_lease=1.0,
        task_scan_interval=0.2,
        task_poll_interval=0.1,
    )

    if store_url:

        @flows.tool(structured_output=False, task="optional")
        async def echo(ctx: mrtr.FlowContext) -> str:
            """Seed 001's persistent example: ask for a string (the task waits), echo it back."""
            await ctx.step("echo-start", audited, "echo-start", "started")
            answer = await ctx.elicit("Please provide the input string to echo back", EchoInput, key="echo_input")
            said = await ctx.step("echo-say", audited, "echo-say", answer.input)
            return f"Echo: {said}"

        @flows.tool(structured_output=False, task="optional", mrtr_first=True)
        async def echo_first(ctx: mrtr.FlowContext) -> str:
            """Seed 001's "Interactions" section: ask inline first, become a task at the first step."""
            answer = await ctx.elicit("Please provide the input string to echo back", EchoInput, key="echo_input")
            said = await ctx.step("echo-say", audited, "echo-say", answer.input)
            return f"Echo: {said}"

    @flows.tool(structured_output=False)
    async def forecast(location: str, ctx: mrtr.FlowContext) -> str:
        """The one flow every dialect runs: an elicitation, a step, a sampling request, a confirmation."""
        login = await ctx.elicit("Please provide your GitHub username", Login, key="github_login")
        weather = await ctx.step("lookup", lookup, location)
        advice = await ctx.sample(f"What to wear in {weather}?", max_tokens=100, key="what_to_wear")
        text = advice.content.text if advice.content.type == "text" else "?"
        ok = await ctx.elicit(f"Send the forecast to {login.name}?", Confirm, key="confirm")
        if not ok.send:
            return "not sent"
        return f"{login.name}: {weather}. {text} [flow {ctx.flow_id}]"

    @flows.tool(structured_output=False)
    async def get_weather(location: str, ctx: mrtr.FlowContext) -> str:
        """Seeds 000 and 001's example: a GitHub login and the capital of France, asked together."""
        await ctx.gather(
            ctx.elicit("Please provide your GitHub username", Login, key="github_login"),
            ctx.sample(
                "What is the capital of France?",
                max_tokens=100,
                system_prompt="You are a helpful assistant.",
                model_preferences=ModelPreferences(
                    hints=[ModelHint(name="claude-3-sonnet")], intelligence_priority=0.8, speed_priority=0.5
                ),
                key="capital_of_france",
            ),
        )
        return SEED_000_WEATHER if location == "New York" else f"No weather for {location}"

    @flows.tool(structured_output=False)
    async def complex_tool(initial_arg: str, ctx: mrtr.FlowContext) -> str:
        """Seed 003's example: a deployment target, then the client's LLM, then done."""
        target = await ctx.elicit("Please provide the deployment target:", Target, key="step-elicitation-A")
        prompt = f"Is deploying to '{target.target}' safe right now?"
        await ctx.sample(prompt, max_tokens=100, key="step-sampling-B")
        return f"Deployment to {target.target} initiated successfully based on confirmation."

    @server.tool()
    def plain_tool() -> str:
        """A plain SDK tool: dialects pass non-flow calls through unchanged."""
        return "pong"

    return server, flows


def with_instance_header(app: ASGIApp) -> ASGIApp:
    """Every response says which process answered it (`X-Mrtr-Instance`), for the tests."""
    label = INSTANCE.encode()

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_labelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-mrtr-instance", label)]}
            await send(message)

        await app(scope, receive, send_labelled)

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (saga and incomplete only)")
    args = parser.parse_args()
    server, flows = build_server()
    if args.stdio:
        asyncio.run(server.run_stdio_async())
        return
    asyncio.run(serve_http(with_instance_header(flows.streamable_http_app()), args.port, READY_PREFIX))


if __name__ == "__main__":
    main()
