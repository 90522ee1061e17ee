"""The upgrading guide's example: guard a changed step with `ctx.patched`, prove it in CI.

`main` runs the new flow to its end in-process; the CI loop (`check_recorded`) is type-checked
here and run for real against journals recorded by the old code in
`tests/integration/test_versioning.py`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr.testing import run_rounds

security = RequestStateSecurity(keys=[os.urandom(32)])
server = MCPServer("shop", request_state_security=security)
flows = mrtr.Flows(server)


class Qty(BaseModel):
    n: int


class Yes(BaseModel):
    yes: bool


def reserve(item: str, n: int) -> None: ...


def wrap(item: str) -> None: ...


# --8<-- [start:flow]
@flows.tool()
async def order(item: str, ctx: mrtr.FlowContext) -> str:
    qty = await ctx.elicit(f"How many {item}?", Qty)
    await ctx.step("reserve", reserve, item, qty.n)
    wrapped = False
    if ctx.patched("gift-wrap"):  # v2: new question and step
        wrapped = (await ctx.elicit("Gift wrap?", Yes)).yes
        await ctx.step("wrap", wrap, item)
    ok = await ctx.elicit("Confirm?", Yes)  # v1 flows parked here stay on the old path
    return f"{qty.n} {item}, wrapped={wrapped}, confirmed={ok.yes}"


# --8<-- [end:flow]


async def check_recorded(recorded_states: Iterable[str]) -> None:
    # --8<-- [start:ci]
    # In CI, before deploying v2: every journal v1 recorded must still replay.
    from mrtr.testing import check_replay, journal_from_state

    for token in recorded_states:  # sealed requestState, or a task record's journal
        report = await check_replay(flows, "order", journal_from_state(token, security), {"item": "mugs"})
        assert report.ok, report.explain()  # e.g. "recorded step 'reserve' never reached"
    # --8<-- [end:ci]


async def main() -> None:
    answers = {"How many": {"n": 2}, "Gift wrap?": {"yes": True}, "Confirm?": {"yes": True}}
    report = await run_rounds(flows, "order", {"item": "mugs"}, answers=answers)
    assert "2 mugs, wrapped=True, confirmed=True" in str(report.result.content[0]), report.result
    await check_recorded([])


if __name__ == "__main__":
    asyncio.run(main())
