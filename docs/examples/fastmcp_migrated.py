"""The FastMCP guide's example: a FastMCP 3.x server, migrated to FastMCP 4 through `mrtr.fastmcp`.

`main` calls it with FastMCP's own in-memory client, which answers the elicitation and the
sampling request. Run by `tests/integration/test_docs_examples.py`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastmcp import Client

# isort: split
# --8<-- [start:server]
from fastmcp import FastMCP
from mcp.server.request_state import RequestStateSecurity  # new

import mrtr  # new
import mrtr.fastmcp  # new
from mrtr.fastmcp import FlowsContext  # new: FastMCP's Context, typed with the three methods

KEY = os.urandom(32)  # in production: the same key on every instance
mcp = FastMCP("trips", request_state_security=RequestStateSecurity(keys=[KEY]))  # changed: a shared key
flows = mrtr.fastmcp.Flows(mcp)  # new


@flows.tool()  # changed: was @mcp.tool
async def plan_trip(city: str, ctx: FlowsContext) -> str:  # changed for mypy only: was `ctx: Context`
    go = await ctx.elicit(f"Go to {city}?", response_type=bool)  # FastMCP 3.x code, unchanged
    if go.action != "accept" or not go.data:
        return "not going"
    booking = await mrtr.step("book", book, city)  # changed: was `await book(city)`; runs once
    note = await ctx.sample(f"One line about {city}")  # unchanged
    return f"{booking}: {note.text}"


# --8<-- [end:server]


BOOKINGS: list[str] = []


def book(city: str) -> str:
    BOOKINGS.append(city)
    return f"B-{city}"


async def main() -> None:
    async def elicitation(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return response_type(value=True) if response_type is not None else {}

    async def sampling(messages: Any, params: Any, context: Any) -> str:
        return "sunny"

    async with Client(mcp, elicitation_handler=elicitation, sampling_handler=sampling) as client:
        result = await client.call_tool("plan_trip", {"city": "Lisbon"})
    assert result.data == "B-Lisbon: sunny", result
    assert BOOKINGS == ["Lisbon"], BOOKINGS


if __name__ == "__main__":
    asyncio.run(main())
