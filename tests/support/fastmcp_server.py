"""A FastMCP 4 server with mrtr flows, for the fleet tests: `python tests/support/fastmcp_server.py --port 0`.

Reads MRTR_STATE_KEY (hex; every instance of one fleet gets the same), MRTR_INSTANCE (a label,
sent back on every response as `X-Mrtr-Instance`) and MRTR_AUDIT (a file every step run appends
one JSON line to, so tests can count real side effects across processes).
Prints `fastmcp-server ready: URL` once it listens.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastmcp import Context, FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
import mrtr.fastmcp  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

SERVER_NAME = "fm-fleet"  # every instance of a fleet must have the same name (it is the state's audience)
READY_PREFIX = "fastmcp-server ready:"
INSTANCE = os.environ.get("MRTR_INSTANCE", "?")


@dataclass
class Traveller:
    name: str
    age: int


class Preferences(BaseModel):
    seat: Literal["aisle", "window"]
    meal: bool


class Approval(BaseModel):
    ok: bool


class Verdict(BaseModel):
    score: int
    reason: str


def record(step: str, tag: str) -> str:
    """The side effect of every step: one line in the shared audit file per run."""
    line = {"step": step, "tag": tag, "instance": INSTANCE, "key": mrtr.current_step().idempotency_key}
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps(line) + "\n")
    return f"{step}@{INSTANCE}"


def build() -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP(
        SERVER_NAME, request_state_security=RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])])
    )
    flows = mrtr.fastmcp.Flows(mcp)

    @flows.tool(description="FastMCP 3.x-era code: only the decorator changed")
    async def plan_trip(city: str, ctx: Context) -> str:
        go = await ctx.elicit(f"Go to {city}?", response_type=bool)
        if not isinstance(go, AcceptedElicitation) or not go.data:
            return f"{city}: not going ({go.action})"
        who = await ctx.elicit("Who travels?", response_type=Traveller)
        assert isinstance(who, AcceptedElicitation)
        await mrtr.step("book", record, "book", city)
        level = await ctx.elicit(f"Which class to {city}?", response_type=["economy", "business"])
        if not isinstance(level, AcceptedElicitation):
            return f"{city}: booked, class {level.action}"
        bags = await ctx.elicit("How many bags?", response_type=int)
        extras = await ctx.elicit("Extras?", response_type=[["meal", "wifi", "lounge"]])
        prefs = await ctx.elicit("Preferences?", response_type=Preferences)
        assert isinstance(bags, AcceptedElicitation) and isinstance(extras, AcceptedElicitation)
        assert isinstance(prefs, AcceptedElicitation)
        # FastMCP 4's `Context` no longer declares these: at run time ctx is mrtr's FlowsContext.
        note = await ctx.sample(f"One line about {city}", system_prompt="be brief", max_tokens=30)  # type: ignore[attr-defined]
        roots = await ctx.list_roots()  # type: ignore[attr-defined]
        await mrtr.step("email", record, "email", city)
        traveller: Traveller = who.data
        return (
            f"{city}: {traveller.name} ({type(traveller).__name__} {traveller.age}), {level.data}, "
            f"{bags.data} bags, extras {'+'.join(extras.data)}, {prefs.data.seat} seat, meal={prefs.data.meal}, "
            f"{note.text}, roots {[str(r.uri) for r in roots]}"
        )

    @flows.tool()
    async def pay(amount: int, payee: str, ctx: mrtr.FlowContext) -> str:
        approval = await ctx.elicit(f"Pay {amount} to {payee}?", Approval)
        if not approval.ok:
            return f"{payee}: not paid"
        await ctx.step("charge", record, "charge", payee)
        return f"{payee}: paid {amount}"

    @flows.prompt()
    async def brief(topic: str, ctx: Context) -> str:
        who = await ctx.elicit(f"Brief about {topic} for whom?", response_type=str)
        await mrtr.step("draft", record, "draft", topic)
        return f"Write about {topic} for {who.data if isinstance(who, AcceptedElicitation) else 'nobody'}."

    # FastMCP 3.x's server-side sampling loop: each tool call the model makes is a step (audited).
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"facts({topic})@" + record("lookup", topic)

    async def rate(topic: str, points: int) -> int:
        record("rate", topic)
        return points * 2

    def explode(topic: str) -> str:
        record("explode", topic)
        raise ValueError(f"no {topic} today")

    @flows.tool()
    async def research(topic: str, concurrency: int | None, ctx: Context) -> str:
        verdict = await ctx.sample(  # type: ignore[attr-defined]
            f"Research {topic}",
            system_prompt="judge",
            tools=[lookup, rate, explode],
            tool_concurrency=concurrency,
            result_type=Verdict,
        )
        await mrtr.step("file", record, "file", topic)
        return f"{topic}: {verdict.result.score} {verdict.result.reason} ({len(verdict.history)} messages)"

    @flows.tool()
    async def stepwise(topic: str, ctx: mrtr.fastmcp.FlowsContext) -> str:
        messages: Any = f"Stepwise {topic}"
        while True:
            step = await ctx.sample_step(messages, tools=[lookup])
            if not step.is_tool_use:
                return f"{topic}: {step.text}"
            messages = step.history

    @flows.tool()
    async def bare_confirm(topic: str, ctx: Context) -> str:
        answer = await ctx.elicit(f"Confirm {topic}?", response_type=None)
        if isinstance(answer, AcceptedElicitation):
            await mrtr.step("confirmed", record, "confirmed", topic)
        return f"{topic}: {answer.action} {getattr(answer, 'data', None)!r}"

    return mcp


def named(app: ASGIApp) -> ASGIApp:
    """Every HTTP response says which instance served it (`X-Mrtr-Instance`)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-mrtr-instance", INSTANCE.encode())]
            await send(message)

        await app(scope, receive, send_named)

    return wrapped


def main() -> None:
    serve_main(lambda: named(build().http_app()), READY_PREFIX)


if __name__ == "__main__":
    main()
