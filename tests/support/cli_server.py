"""The server `tests/fleet/test_cli_call.py` drives `mrtr call` against: `python tests/support/cli_server.py --port 0`.

One flow, `onboard`, meets a user the way the CLI must handle: a form with every field
kind (string, bounded integer, enum, boolean with a default), a sampling request, then
(at its first side effect, `mrtr_first=True`) a durable task that asks once more. A second,
`schedule`, asks one form of string formats (email, uri, date, date-time).
Reads MRTR_STATE_KEY (hex) and MRTR_STORE (a `mrtr.open_store` URL); with CLI_SERVER_STATEFUL=1
it serves stateful streamable HTTP, so a 2025-11-25 (`mrtr call --legacy`) client keeps its
session and is asked through server->client requests. Prints `cli-server ready: URL` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import date, datetime
from pathlib import Path
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import AnyUrl, BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

READY_PREFIX = "cli-server ready:"


class Profile(BaseModel):
    name: str = Field(min_length=2, description="Full name")
    age: int = Field(ge=18, le=130, description="Age in years")
    team: Literal["infra", "data", "web"] = Field(description="Team to join")
    newsletter: bool = Field(default=True, description="Subscribe to the newsletter?")


class Meeting(BaseModel):
    contact: str = Field(description="Organiser's email", json_schema_extra={"format": "email"})
    link: AnyUrl = Field(description="Where to meet")
    day: date = Field(description="Which day")
    starts: datetime = Field(description="Start, with its UTC offset")


class Send(BaseModel):
    send: bool = Field(description="Send the welcome now?")


async def create_account(name: str, team: str) -> str:
    await asyncio.sleep(0.5)  # long enough for the CLI's live status line to show
    return f"acct-{team}-{name.lower().replace(' ', '-')}"


def build_server() -> mrtr.Flows:
    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    server = MCPServer("cli-test", request_state_security=RequestStateSecurity(keys=[key]))
    flows = mrtr.Flows(
        server, store=mrtr.open_store(os.environ["MRTR_STORE"]), task_poll_interval=0.1, task_scan_interval=0.2
    )

    @flows.tool(task="optional", mrtr_first=True)
    async def onboard(ctx: mrtr.FlowContext, greeting: str = "Welcome") -> str:
        """Onboard a colleague: a form, a sampled welcome line, then an account created as a task."""
        profile = await ctx.elicit("Who is joining?", Profile, key="profile")
        line = await ctx.sample(
            f"Write a one-line welcome for {profile.name} of team {profile.team}", key="welcome", max_tokens=60
        )
        welcome = line.content.text if line.content.type == "text" else "(no text)"
        account = await ctx.step("create_account", create_account, profile.name, profile.team)
        answer = await ctx.elicit(f"Send '{greeting}, {welcome}' to {account}?", Send, key="send")
        news = "with newsletter" if profile.newsletter else "no newsletter"
        verdict = "sent" if answer.send else "kept"
        return f"{account} (age {profile.age}, {news}): welcome {verdict}: {greeting}, {welcome}"

    @flows.tool()
    async def schedule(ctx: mrtr.FlowContext) -> str:
        """Schedule a meeting: one form of formatted strings."""
        meeting = await ctx.elicit("When and where?", Meeting, key="meeting")
        return f"{meeting.contact} meets at {meeting.link} on {meeting.day}, from {meeting.starts.isoformat()}"

    return flows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    flows = build_server()
    stateless = os.environ.get("CLI_SERVER_STATEFUL", "") in ("", "0")
    asyncio.run(serve_http(flows.streamable_http_app(stateless_http=stateless), args.port, READY_PREFIX))


if __name__ == "__main__":
    main()
