"""A wizard's "Back" with the replay guard on, on both hosts, over HTTP, with the official `mcp.Client`.

The client goes back the way a stock client does: it sends an earlier round's `requestState`
again with other answers. Where no step finished after that round, the new answers are taken
and the branch left behind is superseded (its later states are refused: one branch); where a
step finished, the re-answer stays a fork and is refused (`mrtr._guard`).
"""

from __future__ import annotations

import os
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as t
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr._guard import ReplayGuard
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import SHARED_KEY, accept, manual_client, new_server, served, text_of
from tests.support.storekit import REDIS_URL, drop_namespace, service_problem

pytestmark = pytest.mark.anyio


class Name(BaseModel):
    name: str


class Colour(BaseModel):
    colour: str


class Confirm(BaseModel):
    yes: bool


def wizard(host: str, guard: ReplayGuard, runs: Counter[str]) -> Any:
    """Two questions, a step that saves both, a confirmation: a 4-round wizard on `host`."""
    if host == "sdk":
        server: Any = new_server()
        flows: Any = mrtr.Flows(server, replay_guard=guard)
    else:
        from fastmcp import FastMCP

        from mrtr.fastmcp import Flows as FastMCPFlows

        server = FastMCP("fm-back", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
        flows = FastMCPFlows(server, replay_guard=guard)

    def save(name: str, colour: str) -> str:
        runs[f"{name}/{colour}"] += 1
        return f"{name}/{colour}"

    @flows.tool()
    async def signup(ctx: mrtr.FlowContext) -> str:
        """Ask a name, then a colour that depends on it; save; confirm."""
        name = (await ctx.elicit("Your name?", Name, key="name")).name
        colour = (await ctx.elicit(f"Favourite colour, {name}?", Colour, key="colour")).colour
        saved = await ctx.step("save", save, name, colour)
        ok = await ctx.elicit(f"Keep {saved}?", Confirm, key="keep")
        return f"{saved} kept={ok.yes}"

    return server


@pytest.fixture(params=["sdk", "fastmcp"])
def host(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.needs_redis)])
async def guard(request: pytest.FixtureRequest) -> AsyncIterator[ReplayGuard]:
    """The guard on a ledger: a SQLite one, and the Redis store a fleet shares."""
    if request.param == "sqlite":
        guard = ReplayGuard(SQLiteStore(":memory:"))
        yield guard
        await guard.close()
        return
    problem = await service_problem("redis")
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"redis unreachable ({problem}); CI is set, so the guard on Redis must be tested")
        pytest.skip(f"redis unreachable ({problem})")
    namespace = f"back_{secrets.token_hex(4)}"
    guard = ReplayGuard(mrtr.open_store(REDIS_URL, namespace=namespace))  # type: ignore[arg-type]
    try:
        yield guard
    finally:
        await guard.close()
        await drop_namespace("redis", namespace)


async def _send(client: Any, state: str | None, answers: dict[str, Any] | None = None) -> Any:
    return await client.session.call_tool(
        "signup", {}, input_responses=answers, request_state=state, allow_input_required=True
    )


def _asked(result: Any) -> str:
    assert isinstance(result, t.InputRequiredResult), result
    ((_, ask),) = (result.input_requests or {}).items()
    return str(ask.params.message)  # type: ignore[union-attr]


async def test_back_before_any_step_takes_the_new_answers_and_supersedes_the_branch_left(
    host: str, guard: ReplayGuard
) -> None:
    runs: Counter[str] = Counter()
    server = wizard(host, guard, runs)
    async with served(server) as url, manual_client(streamable_http_client(url)) as client:
        first = await _send(client, None)
        assert _asked(first) == "Your name?"
        alice = await _send(client, first.request_state, {"name": accept(name="alice")})
        assert _asked(alice) == "Favourite colour, alice?"
        # Back: the name page again, answered differently. No step ran after it: taken.
        bob = await _send(client, first.request_state, {"name": accept(name="bob")})
        assert _asked(bob) == "Favourite colour, bob?", "the dependent question is asked again"
        # the branch left behind is refused, before any flow code runs ...
        with pytest.raises(MCPError) as left:
            await _send(client, alice.request_state, {"colour": accept(colour="red")})
        assert left.value.error.code == -32602
        assert left.value.error.data == {"reason": "request_state_superseded", "flow": "signup"}
        # ... Back again, to the first answer: Back all the same; both branches before it are left
        carol = await _send(client, first.request_state, {"name": accept(name="carol")})
        assert _asked(carol) == "Favourite colour, carol?"
        for left_state in (alice.request_state, bob.request_state):
            with pytest.raises(MCPError) as left:
                await _send(client, left_state, {"colour": accept(colour="red")})
            assert left.value.error.data == {"reason": "request_state_superseded", "flow": "signup"}
        # ... and the branch taken carries on to the end
        keep = await _send(client, carol.request_state, {"colour": accept(colour="red")})
        assert _asked(keep) == "Keep carol/red?"
        done = await _send(client, keep.request_state, {"keep": accept(yes=True)})
        assert isinstance(done, t.CallToolResult) and text_of(done) == "carol/red kept=True"
        # once its step finished, going Back before it is a fork
        with pytest.raises(MCPError) as forked:
            await _send(client, first.request_state, {"name": accept(name="dave")})
        assert forked.value.error.data == {"reason": "request_state_forked", "flow": "signup"}
    assert runs == Counter({"carol/red": 1}), "the branches left behind never saved"


async def test_back_past_a_finished_step_stays_a_fork_and_is_refused(host: str, guard: ReplayGuard) -> None:
    runs: Counter[str] = Counter()
    server = wizard(host, guard, runs)
    async with served(server) as url, manual_client(streamable_http_client(url)) as client:
        first = await _send(client, None)
        named = await _send(client, first.request_state, {"name": accept(name="alice")})
        saved = await _send(client, named.request_state, {"colour": accept(colour="red")})
        assert _asked(saved) == "Keep alice/red?"  # the step `save` finished in this round
        for state, answers in (
            (named.request_state, {"colour": accept(colour="blue")}),  # the round the step ran in
            (first.request_state, {"name": accept(name="bob")}),  # a round before it
        ):
            with pytest.raises(MCPError) as forked:
                await _send(client, state, answers)
            assert forked.value.error.code == -32602
            assert forked.value.error.data == {"reason": "request_state_forked", "flow": "signup"}
        # the same answers again are a resend: the kept outcome, nothing runs twice
        resent = await _send(client, named.request_state, {"colour": accept(colour="red")})
        assert _asked(resent) == "Keep alice/red?"
        done = await _send(client, saved.request_state, {"keep": accept(yes=True)})
        assert isinstance(done, t.CallToolResult) and text_of(done) == "alice/red kept=True"
    assert runs == Counter({"alice/red": 1})


async def test_back_can_be_turned_off() -> None:
    """`ReplayGuard(back=False)`: every re-answer is a fork, as before "Back" was allowed."""
    runs: Counter[str] = Counter()
    guard = ReplayGuard(SQLiteStore(":memory:"), back=False)
    async with manual_client(wizard("sdk", guard, runs)) as client:
        first = await _send(client, None)
        await _send(client, first.request_state, {"name": accept(name="alice")})
        with pytest.raises(MCPError) as forked:
            await _send(client, first.request_state, {"name": accept(name="bob")})
        assert forked.value.error.data == {"reason": "request_state_forked", "flow": "signup"}
    await guard.close()
