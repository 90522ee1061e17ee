"""Single-use rounds (`Flows(replay_guard=...)`), in process through the official `mcp.Client`.

A deploy flow asks where, applies (a counted side effect), then asks to confirm. Round 2
(state of round 1 + the answer) is what a replaying client would resend. The cross-process
version of these tests, with real HTTP instances and Redis, is in tests/fleet/test_fleet_guard.py.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from typing import Any

import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr._guard import ReplayGuard
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import Driver, accept, manual_client, new_server, text_of

pytestmark = pytest.mark.anyio


class Target(BaseModel):
    env: str


class Confirm(BaseModel):
    yes: bool


def deploy_server(runs: Counter[str], guard: Any, **options: Any) -> Any:
    server = new_server()
    flows = mrtr.Flows(server, replay_guard=guard, **options)

    async def apply(env: str) -> str:
        runs[env] += 1
        await asyncio.sleep(0.05)  # long enough for concurrent resends to arrive mid-round
        return f"applied@{env}"

    @flows.tool()
    async def deploy(ctx: mrtr.FlowContext) -> str:
        """Ask where, apply, confirm."""
        target = await ctx.elicit("Deploy where?", Target, key="where")
        applied = await ctx.step("apply", apply, target.env)
        ok = await ctx.elicit(f"Keep {applied}?", Confirm, key="keep")
        return f"{applied} kept={ok.yes}"

    return server


async def _round_two(client: Any) -> tuple[Driver, str]:
    driver = Driver(client, "deploy")
    first = await driver.send()
    assert isinstance(first, t.InputRequiredResult)
    return driver, driver.state  # type: ignore[return-value]


async def _send(client: Any, state: str, answers: dict[str, Any]) -> Any:
    return await client.session.call_tool(
        "deploy", {}, input_responses=answers, request_state=state, allow_input_required=True
    )


async def test_without_a_guard_a_replayed_round_reruns_its_steps() -> None:
    # The documented unguarded behaviour: authentic state is accepted again within its TTL.
    runs: Counter[str] = Counter()
    async with manual_client(deploy_server(runs, None)) as client:
        _, state = await _round_two(client)
        for _ in range(3):
            result = await _send(client, state, {"where": accept(env="prod")})
            assert isinstance(result, t.InputRequiredResult)
        await _send(client, state, {"where": accept(env="staging")})
    assert runs == Counter({"prod": 3, "staging": 1})


async def test_replays_of_a_round_run_its_steps_once_and_get_the_same_outcome() -> None:
    runs: Counter[str] = Counter()
    guard = ReplayGuard(SQLiteStore(":memory:"))
    async with manual_client(deploy_server(runs, guard)) as client:
        _, state = await _round_two(client)
        answers = {"where": accept(env="prod")}
        # five at once (four wait for the first run) and one after it finished
        results = await asyncio.gather(*[_send(client, state, answers) for _ in range(5)])
        results.append(await _send(client, state, answers))
        assert runs == Counter({"prod": 1})
        assert all(isinstance(r, t.InputRequiredResult) for r in results)
        assert {tuple(r.input_requests) for r in results} == {("keep",)}
        # every copy of the outcome carries on to the same end (each later round is new)
        final = await _send(client, results[3].request_state, {"keep": accept(yes=True)})
        assert isinstance(final, t.CallToolResult) and text_of(final) == "applied@prod kept=True"
        # ... and the final round, resent, gives the same final result without running anything
        again = await _send(client, results[3].request_state, {"keep": accept(yes=True)})
        assert isinstance(again, t.CallToolResult) and text_of(again) == "applied@prod kept=True"
    assert runs == Counter({"prod": 1})


@pytest.mark.parametrize("sealed", [True, False])
async def test_kept_outcomes_are_sealed_at_rest_and_a_resend_still_gets_them(tmp_path: Any, sealed: bool) -> None:
    """The ledger keeps each round's answer for resends: sealed with the server's ring, bound to its round."""
    runs: Counter[str] = Counter()
    path, env = tmp_path / "rounds.db", f"PROD{secrets.token_hex(4)}"
    guard = ReplayGuard(SQLiteStore(str(path)))
    async with manual_client(deploy_server(runs, guard, seal_at_rest=sealed)) as client:
        _, state = await _round_two(client)
        asked = await _send(client, state, {"where": accept(env=env)})
        final = await _send(client, asked.request_state, {"keep": accept(yes=True)})
        again = await _send(client, asked.request_state, {"keep": accept(yes=True)})
        assert text_of(final) == text_of(again) == f"applied@{env} kept=True", "the kept outcome opens"
    assert runs == Counter({env: 1})
    dump = b"".join(f.read_bytes() for f in tmp_path.iterdir() if f.name.startswith("rounds.db"))
    assert (f"applied@{env}".encode() in dump) is not sealed, "sealed: no answer in plain text in the ledger"


async def test_a_forked_round_is_refused_before_any_flow_code_runs() -> None:
    runs: Counter[str] = Counter()
    guard = ReplayGuard(SQLiteStore(":memory:"))
    async with manual_client(deploy_server(runs, guard)) as client:
        _, state = await _round_two(client)
        await _send(client, state, {"where": accept(env="prod")})
        with pytest.raises(MCPError) as refused:
            await _send(client, state, {"where": accept(env="staging")})
        assert refused.value.code == -32602
        assert refused.value.data == {"reason": "request_state_forked", "flow": "deploy"}
        # a concurrent fork: exactly one branch runs
        _, state2 = await _round_two(client)
        outcomes = await asyncio.gather(
            _send(client, state2, {"where": accept(env="a")}),
            _send(client, state2, {"where": accept(env="b")}),
            return_exceptions=True,
        )
        refusals = [o for o in outcomes if isinstance(o, MCPError)]
        assert len(refusals) == 1 and refusals[0].data["reason"] == "request_state_forked"
    assert runs["prod"] == 1 and runs["staging"] == 0 and runs["a"] + runs["b"] == 1


async def test_an_outcome_over_the_cap_is_not_kept_and_a_resend_is_refused() -> None:
    runs: Counter[str] = Counter()
    guard = ReplayGuard(SQLiteStore(":memory:"), max_outcome_bytes=64)
    async with manual_client(deploy_server(runs, guard)) as client:
        _, state = await _round_two(client)
        assert isinstance(await _send(client, state, {"where": accept(env="prod")}), t.InputRequiredResult)
        with pytest.raises(MCPError) as refused:
            await _send(client, state, {"where": accept(env="prod")})
        assert refused.value.data["reason"] == "request_state_consumed"
    assert runs == Counter({"prod": 1})


async def test_a_resend_while_the_round_is_still_running_gives_up_after_max_wait() -> None:
    runs: Counter[str] = Counter()
    guard = ReplayGuard(SQLiteStore(":memory:"), max_wait=0.0)
    async with manual_client(deploy_server(runs, guard)) as client:
        _, state = await _round_two(client)
        answers = {"where": accept(env="prod")}
        outcomes = await asyncio.gather(
            _send(client, state, answers), _send(client, state, answers), return_exceptions=True
        )
        refusals = [o for o in outcomes if isinstance(o, MCPError)]
        assert len(refusals) == 1 and refusals[0].data["reason"] == "request_state_in_flight"
    assert runs == Counter({"prod": 1})


async def test_an_unreachable_guard_store_fails_closed_with_a_precise_error() -> None:
    runs: Counter[str] = Counter()
    from mrtr.stores._redis import RedisStore

    guard = ReplayGuard(RedisStore("redis://127.0.0.1:1/0", socket_connect_timeout=1))  # nothing listens there
    async with manual_client(deploy_server(runs, guard)) as client:
        _, state = await _round_two(client)  # a first round carries no state: not guarded
        with pytest.raises(MCPError) as refused:
            await _send(client, state, {"where": accept(env="prod")})
        assert refused.value.code == -32603
        assert refused.value.data == {
            "reason": "replay_guard_unavailable",
            "store": "redis",
            "retryable": True,
            "flow": "deploy",
        }
    assert runs == Counter(), "no round runs unguarded"
    await guard.close()


class _FlakyLedger:
    """A SQLite round ledger that does not answer while `down` (a store outage, in process)."""

    def __init__(self) -> None:
        self.inner = SQLiteStore(":memory:")
        self.down = False

    async def claim_round(self, *args: Any) -> Any:
        if self.down:
            from mrtr import StoreUnavailable

            raise StoreUnavailable("sqlite")
        return await self.inner.claim_round(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("outage", ["fail_closed", "degrade"])
async def test_a_guard_outage_is_a_choice_per_flows(outage: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 46: `Flows(replay_guard_outage=...)`. Fail closed (the default): each answer round is
    refused, retryable, and nothing runs; degrade: the rounds run unguarded, said once per burst."""
    runs: Counter[str] = Counter()
    ledger = _FlakyLedger()
    server = deploy_server(runs, ReplayGuard(ledger), replay_guard_outage=outage)
    async with manual_client(server) as client:
        states = [(await _round_two(client))[1] for _ in range(3)]
        ledger.down = True
        with caplog.at_level(logging.WARNING, logger="mrtr.guard"):
            outcomes = [await _outcome(client, state, {"where": accept(env=f"e{i}")}) for i, state in enumerate(states)]
            ledger.down = False
            _, state = await _round_two(client)
            assert isinstance(await _send(client, state, {"where": accept(env="after")}), t.InputRequiredResult)
    lines = [r.getMessage() for r in caplog.records if r.name == "mrtr.guard"]
    if outage == "fail_closed":
        assert all(isinstance(o, MCPError) and o.data["retryable"] is True for o in outcomes), outcomes
        assert runs == Counter({"after": 1}), "no round ran unchecked"
        assert lines == []
    else:
        assert all(isinstance(o, t.InputRequiredResult) for o in outcomes), outcomes
        assert runs == Counter({"e0": 1, "e1": 1, "e2": 1, "after": 1})
        assert len(lines) == 2, lines
        assert "does not answer; rounds run unguarded until it does" in lines[0]
        assert "answers again; 3 round(s) ran unguarded meanwhile" in lines[1]


async def _outcome(client: Any, state: str, answers: dict[str, Any]) -> Any:
    try:
        return await _send(client, state, answers)
    except MCPError as exc:
        return exc


def test_an_unknown_guard_outage_policy_is_refused_at_start() -> None:
    with pytest.raises(mrtr.FlowDefinitionError, match="replay_guard_outage='open'"):
        mrtr.Flows(new_server(), replay_guard_outage="open")  # type: ignore[typeddict-item]
    with pytest.raises(mrtr.FlowDefinitionError, match="replay_guard_outage='open'"):
        mrtr.Flows(new_server(), replay_guard=ReplayGuard(SQLiteStore(":memory:")), replay_guard_outage="open")  # type: ignore[typeddict-item]
