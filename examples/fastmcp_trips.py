"""FastMCP 3.x-era code on FastMCP 4, through mrtr: `python examples/fastmcp_trips.py` serves it on :8000.

Give every instance the same key (`MRTR_STATE_KEY`, hex) and run as many as you like behind any
load balancer: each round of a call may land on any of them.
`ctx: FlowsContext` is FastMCP's `Context` (annotate `ctx: fastmcp.Context` if you do not run
mypy: FastMCP 4's `Context` type no longer declares `sample` and `list_roots`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fastmcp import FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.server.request_state import RequestStateSecurity

import mrtr
import mrtr.fastmcp
from mrtr.fastmcp import FlowsContext

# Without MRTR_STATE_KEY, FastMCP seals with a key only this process holds, and mrtr says so at
# start-up: fine for one instance, and a second one would reject this one's flows.
KEY = os.environ.get("MRTR_STATE_KEY")
SECURITY = RequestStateSecurity(keys=[bytes.fromhex(KEY)]) if KEY else None

mcp: FastMCP[None] = FastMCP("trips", request_state_security=SECURITY)
flows = mrtr.fastmcp.Flows(mcp)


@dataclass
class Traveller:
    name: str
    bags: int


def book(city: str, who: str) -> str:
    return f"B-{city}-{who}"  # imagine a booking API: a side effect, run once per call


@flows.tool(description="Plan a trip, asking the user as FastMCP 3.x did")
async def plan_trip(city: str, ctx: FlowsContext) -> str:
    go = await ctx.elicit(f"Go to {city}?", response_type=bool)
    if not isinstance(go, AcceptedElicitation) or not go.data:
        return "not going"
    who = await ctx.elicit("Who travels?", response_type=Traveller)
    if not isinstance(who, AcceptedElicitation):
        return "no traveller"
    booking = await mrtr.step("book", book, city, who.data.name)
    note = await ctx.sample(f"One line about {city}", max_tokens=40)
    roots = await ctx.list_roots()
    return f"{booking}: {note.text} ({len(roots)} roots)"


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=8000)
