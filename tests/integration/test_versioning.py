"""Rolling upgrades: `ctx.patched` keeps old flows on the old path; `mrtr.testing` proves it in CI."""

from __future__ import annotations

import os
from collections import Counter

import mcp_types as t
import pytest
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr.testing import check_replay, journal_from_state
from tests.support.flowkit import Driver, accept, connect, new_server, text_of

pytestmark = pytest.mark.anyio

KEY = os.urandom(32)
security = RequestStateSecurity(keys=[KEY])  # the developer's key ring, to open recorded state


class Qty(BaseModel):
    n: int


class Yes(BaseModel):
    yes: bool


def shop(version: str, runs: Counter[str]) -> tuple[mrtr.Flows, object]:
    """v1 asks quantity, reserves, confirms. v2 adds gift wrapping behind `patched`; v2-unsafe adds it bare."""
    server = new_server("shop", key=KEY)
    flows = mrtr.Flows(server)

    @flows.tool()
    async def order(item: str, ctx: mrtr.FlowContext) -> str:
        qty = await ctx.elicit(f"How many {item}?", Qty)
        await ctx.step("reserve", lambda: runs.update([f"reserve-{version}"]))
        wrapped = False
        if version == "v2-unsafe" or (version == "v2" and ctx.patched("gift-wrap")):
            wrapped = (await ctx.elicit("Gift wrap?", Yes)).yes
            await ctx.step("wrap", lambda: runs.update([f"wrap-{version}"]))
        ok = await ctx.elicit("Confirm?", Yes)
        return f"{qty.n} {item}, wrapped={wrapped}, confirmed={ok.yes}"

    return flows, server


@pytest.mark.parametrize("transport", ["memory", "http"])
async def test_a_rolling_upgrade_keeps_in_flight_flows_on_the_old_path(transport: str) -> None:
    runs: Counter[str] = Counter()
    _, old_server = shop("v1", runs)
    _, new_server_ = shop("v2", runs)
    async with connect(old_server, transport) as old, connect(new_server_, transport) as new:
        # A flow the old code carried past the change point: it finishes the old way on new code.
        in_flight = Driver(old, "order", {"item": "mugs"})
        await in_flight.send()
        await in_flight.send({in_flight.key_for_message("How many"): accept(n=2)})
        assert in_flight.key_for_message("Confirm?")
        in_flight.client = new
        done = await in_flight.send({in_flight.key_for_message("Confirm?"): accept(yes=True)})
        assert text_of(done) == "2 mugs, wrapped=False, confirmed=True"

        # A flow the old code started but had not carried that far takes the new path.
        early = Driver(old, "order", {"item": "cups"})
        await early.send()
        early.client = new
        await early.send({early.key_for_message("How many"): accept(n=1)})
        await early.send({early.key_for_message("Gift wrap?"): accept(yes=True)})
        # The decision is journaled: the next round replays it (the marker is in the state).
        done = await early.send({early.key_for_message("Confirm?"): accept(yes=True)})
        assert text_of(done) == "1 cups, wrapped=True, confirmed=True"
    assert runs == Counter({"reserve-v1": 1, "reserve-v2": 1, "wrap-v2": 1}), "no step ran twice across the upgrade"


async def test_replay_testing_accepts_patched_code_and_flags_an_unguarded_change() -> None:
    runs: Counter[str] = Counter()
    _, old_server = shop("v1", runs)
    async with connect(old_server, "memory") as old:
        call = Driver(old, "order", {"item": "mugs"})
        await call.send()
        await call.send({call.key_for_message("How many"): accept(n=2)})
        recorded = journal_from_state(call.state or "", security)
    assert list(recorded.steps) == ["reserve"]

    patched, _ = shop("v2", runs)
    report = await check_replay(patched, "order", recorded, {"item": "mugs"})
    assert report.ok, report.explain()
    assert report.would_run == [] and len(report.would_ask) == 1

    unsafe, _ = shop("v2-unsafe", runs)
    report = await check_replay(unsafe, "order", recorded, {"item": "mugs"})
    assert report.ok, "a new *question* before old progress is safe: it is simply asked"

    # A change that renames the step the old code already ran: old flows would reserve twice.
    renamed_server = new_server("shop", key=KEY)
    renamed = mrtr.Flows(renamed_server)

    @renamed.tool()
    async def order(item: str, ctx: mrtr.FlowContext) -> str:
        await ctx.elicit(f"How many {item}?", Qty)
        await ctx.step("reserve-stock", lambda: None)  # renamed: old flows would reserve twice
        return "x"

    report = await check_replay(renamed, "order", recorded, {"item": "mugs"})
    assert not report.ok
    assert "recorded step 'reserve' never reached" in report.explain()
    assert report.would_run == ["reserve-stock"]
    assert runs == Counter({"reserve-v1": 1}), "replay testing runs no step"


async def test_patched_is_true_for_a_brand_new_flow_and_journaled() -> None:
    runs: Counter[str] = Counter()
    _, server = shop("v2", runs)
    async with connect(server, "memory") as client:
        call = Driver(client, "order", {"item": "pens"})
        await call.send()
        await call.send({call.key_for_message("How many"): accept(n=3)})
        assert isinstance(call.rounds[-1], t.InputRequiredResult)
        assert call.key_for_message("Gift wrap?")
        assert journal_from_state(call.state or "", security).markers == {"gift-wrap"}
