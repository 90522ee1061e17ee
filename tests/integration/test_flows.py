"""The engine's contract, end to end through the official in-process `Client` (2026-07-28)."""

from __future__ import annotations

import asyncio
from collections import Counter

import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from tests.support.flowkit import Driver, accept, manual_client, new_server, roots, sampled, text_of

pytestmark = pytest.mark.anyio


class Target(BaseModel):
    env: str


class Confirm(BaseModel):
    yes: bool


class Pick(BaseModel):
    n: int


class Plan(BaseModel):
    id: str
    env: str


def deploy_server(runs: Counter[str], keys: list[str]):
    server = new_server()
    flows = mrtr.Flows(server)

    def make_plan(service: str, env: str) -> Plan:
        runs["plan"] += 1
        keys.append(mrtr.current_step().idempotency_key)
        return Plan(id=f"{service}-{env}", env=env)

    async def apply_plan(plan: Plan) -> str:
        runs["apply"] += 1
        return f"applied {plan.id}"

    @flows.tool()
    async def deploy(service: str, ctx: mrtr.FlowContext) -> str:
        """Deploy a service after asking where, and confirming."""
        target = await ctx.elicit(f"Deploy {service} where?", Target)
        plan = await ctx.step("plan", make_plan, service, target.env)
        assert isinstance(plan, Plan)  # annotated steps come back typed, on every round
        ok, risk = await ctx.gather(
            ctx.elicit(f"Apply {plan.id}?", Confirm),
            ctx.sample(f"One-line risk of {plan.id}", max_tokens=50),
        )
        if not ok.yes:
            return "cancelled by user"
        folders = await ctx.list_roots()
        applied = await ctx.step("apply", apply_plan, plan)
        return f"{applied}; risk: {risk.content.text}; roots: {[str(r.uri) for r in folders]}"

    return server


async def test_deploy_flow_rounds_steps_and_batching() -> None:
    runs: Counter[str] = Counter()
    keys: list[str] = []
    server = deploy_server(runs, keys)
    async with manual_client(server) as client:
        call = Driver(client, "deploy", {"service": "api"})

        first = await call.send()
        assert isinstance(first, t.InputRequiredResult)
        assert first.result_type == "input_required"
        where = call.key_for_message("where?")
        assert runs == Counter()

        second = await call.send({where: accept(env="prod")})
        assert isinstance(second, t.InputRequiredResult)
        # Both asks of the gather go out in ONE round.
        methods = sorted(r.method for r in call.asked.values())
        assert methods == ["elicitation/create", "sampling/createMessage"]
        confirm = call.key_for_message("Apply api-prod?")
        risk = call.key_where(lambda r: r.method == "sampling/createMessage")
        assert runs["plan"] == 1

        third = await call.send({confirm: accept(yes=True), risk: sampled("low")})
        assert isinstance(third, t.InputRequiredResult)
        folders = call.key_where(lambda r: r.method == "roots/list")
        assert runs["plan"] == 1, "a finished step must not run again on replay"

        final = await call.send({folders: roots("file:///srv/api")})
        assert isinstance(final, t.CallToolResult) and not final.is_error
        assert text_of(final) == "applied api-prod; risk: low; roots: ['file:///srv/api']"
        assert final.structured_content == {"result": text_of(final)}
        assert runs == Counter(plan=1, apply=1)
        assert len(keys) == 1 and keys[0].endswith(":plan")
        # Every round got a fresh sealed state.
        states = [r.request_state for r in call.rounds]
        assert len(set(states)) == 3


async def test_official_client_auto_driver_completes_flow() -> None:
    runs: Counter[str] = Counter()
    server = deploy_server(runs, [])
    seen: list[str] = []

    async def on_elicit(context, params):
        seen.append(params.message)
        return accept(env="staging") if "where" in params.message else accept(yes=True)

    async def on_sample(context, params):
        return sampled("moderate")

    async def on_roots(context):
        return roots("file:///a", "file:///b")

    from mcp import Client

    for mode in ("auto", "legacy"):
        async with Client(
            server, mode=mode, elicitation_callback=on_elicit, sampling_callback=on_sample, list_roots_callback=on_roots
        ) as client:
            result = await client.call_tool("deploy", {"service": "web"})
            assert not result.is_error
            assert text_of(result).startswith("applied web-staging; risk: moderate")
    assert runs == Counter(plan=2, apply=2)  # once per flow, in each era
    assert seen == ["Deploy web where?", "Apply web-staging?"] * 2


async def test_decline_and_cancel_end_the_call_as_tool_error() -> None:
    server = deploy_server(Counter(), [])
    async with manual_client(server) as client:
        for action in ("decline", "cancel"):
            call = Driver(client, "deploy", {"service": "db"})
            await call.send()
            result = await call.send({call.key_for_message("where?"): t.ElicitResult(action=action)})
            assert isinstance(result, t.CallToolResult) and result.is_error
            word = "declined" if action == "decline" else "cancelled"
            assert f"The user {word} the request: Deploy db where?" in text_of(result)


async def test_flow_can_catch_a_refusal_and_branch() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def survey(ctx: mrtr.FlowContext) -> str:
        try:
            pick = await ctx.elicit("Favourite number?", Pick)
        except mrtr.Declined as refused:
            assert refused.key.startswith("elicit_"), "the refusal names the wire key it answered"
            return "no number, fine"
        except mrtr.Cancelled:
            return "maybe later"
        return f"got {pick.n}"

    async with manual_client(server) as client:
        for answer, expected in [
            (t.ElicitResult(action="decline"), "no number, fine"),
            (t.ElicitResult(action="cancel"), "maybe later"),
            (accept(n=7), "got 7"),
        ]:
            call = Driver(client, "survey")
            await call.send()
            result = await call.send({call.key_for_message("Favourite"): answer})
            assert text_of(result) == expected and not result.is_error


async def test_a_loop_gets_a_separate_answer_each_time() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def add_three(ctx: mrtr.FlowContext) -> int:
        total = 0
        for _ in range(3):
            total += (await ctx.elicit("Pick a number", Pick)).n
        return total

    async with manual_client(server) as client:
        call = Driver(client, "add_three")
        await call.send()
        keys: list[str] = []
        result = None
        for n in (1, 10, 100):
            (key,) = call.asked
            keys.append(key)
            result = await call.send({key: accept(n=n)})
        assert isinstance(result, t.CallToolResult)
        assert result.structured_content == {"result": 111}
        assert len(set(keys)) == 3, "the same question asked three times needs three keys"


async def test_branches_follow_the_answers() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def route(ctx: mrtr.FlowContext) -> str:
        target = await ctx.elicit("Where?", Target)
        if target.env == "prod":
            ok = await ctx.elicit("Production! Sure?", Confirm)
            return "prod" if ok.yes else "aborted"
        return "staging, no questions"

    async with manual_client(server) as client:
        call = Driver(client, "route")
        await call.send()
        staging = await call.send({call.key_for_message("Where?"): accept(env="staging")})
        assert text_of(staging) == "staging, no questions"

        call = Driver(client, "route")
        await call.send()
        await call.send({call.key_for_message("Where?"): accept(env="prod")})
        done = await call.send({call.key_for_message("Sure?"): accept(yes=False)})
        assert text_of(done) == "aborted"


async def test_plain_asyncio_gather_batches_and_waits_for_running_steps() -> None:
    server = new_server()
    flows = mrtr.Flows(server)
    runs: Counter[str] = Counter()

    async def slow_lookup() -> str:
        await asyncio.sleep(0.05)
        runs["lookup"] += 1
        return "looked up"

    async def branch_with_step(ctx: mrtr.FlowContext) -> str:
        found = await ctx.step("lookup", slow_lookup)
        pick = await ctx.elicit(f"After {found}, pick", Pick)
        return f"{found}:{pick.n}"

    @flows.tool()
    async def fan_out(ctx: mrtr.FlowContext) -> str:
        a, b = await asyncio.gather(ctx.elicit("First?", Pick), branch_with_step(ctx))
        return f"{a.n}/{b}"

    async with manual_client(server) as client:
        call = Driver(client, "fan_out")
        await call.send()
        # The slow step finished and the ask behind it joined the same round.
        assert sorted(r.params.message for r in call.asked.values()) == ["After looked up, pick", "First?"]
        assert runs["lookup"] == 1
        result = await call.send(
            {call.key_for_message("First?"): accept(n=1), call.key_for_message("After"): accept(n=2)}
        )
        assert text_of(result) == "1/looked up:2"
        assert runs["lookup"] == 1


async def test_missing_answer_is_asked_again_with_the_same_key() -> None:
    server = deploy_server(Counter(), [])
    async with manual_client(server) as client:
        call = Driver(client, "deploy", {"service": "x"})
        await call.send()
        first_keys = set(call.asked)
        again = await call.send({"some_other_key": accept(env="prod")})
        assert isinstance(again, t.InputRequiredResult)
        assert set(call.asked) == first_keys


async def test_partial_answers_are_kept_and_only_the_rest_reasked() -> None:
    server = deploy_server(Counter(), [])
    async with manual_client(server) as client:
        call = Driver(client, "deploy", {"service": "x"})
        await call.send()
        await call.send({call.key_for_message("where?"): accept(env="prod")})
        risk = call.key_where(lambda r: r.method == "sampling/createMessage")
        confirm = call.key_for_message("Apply")
        await call.send({risk: sampled("high")})  # only one of the two
        assert list(call.asked) == [confirm]
        await call.send({confirm: accept(yes=True)})
        assert [r.method for r in call.asked.values()] == ["roots/list"]


async def test_unsolicited_answers_are_ignored() -> None:
    server = deploy_server(Counter(), [])
    async with manual_client(server) as client:
        # Round 1 with a guessed key and no state: nothing was asked yet, so it is ignored.
        probe = Driver(client, "deploy", {"service": "x"})
        await probe.send()
        key = probe.key_for_message("where?")
        call = Driver(client, "deploy", {"service": "x"})
        result = await call.send({key: accept(env="prod")})
        assert isinstance(result, t.InputRequiredResult)
        assert key in call.asked

        # An answer to a question the server has not asked *yet* is ignored too.
        probe2 = Driver(client, "deploy", {"service": "x"})
        await probe2.send()
        await probe2.send({key: accept(env="prod")})
        later = probe2.key_for_message("Apply")
        call2 = Driver(client, "deploy", {"service": "x"})
        await call2.send()
        await call2.send({key: accept(env="prod"), later: accept(yes=True)})
        assert later in call2.asked, "a pre-answer to a later question must not be used"


async def test_explicit_key_can_opt_in_to_preanswers() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    class Name(BaseModel):
        name: str

    @flows.tool()
    async def greet(ctx: mrtr.FlowContext) -> str:
        who = await ctx.elicit("Your name?", Name, key="user_name", allow_preanswer=True)
        return f"Hello, {who.name}!"

    async with manual_client(server) as client:
        call = Driver(client, "greet")
        result = await call.send({"user_name": accept(name="Alice")})
        assert text_of(result) == "Hello, Alice!"
        call = Driver(client, "greet")
        await call.send()
        assert list(call.asked) == ["user_name"]


async def test_a_wrong_schema_form_is_asked_again_and_a_wrong_kind_sampling_answer_is_an_error() -> None:
    server = deploy_server(Counter(), [])
    async with manual_client(server) as client:
        call = Driver(client, "deploy", {"service": "x"})
        await call.send()
        await call.send({call.key_for_message("where?"): accept(env="prod")})
        confirm = call.key_for_message("Apply")
        risk = call.key_where(lambda r: r.method == "sampling/createMessage")
        bad = await call.send({confirm: accept(yes="definitely not a bool")})  # fails the requested schema
        assert isinstance(bad, t.InputRequiredResult)
        assert set(call.asked) == {confirm, risk}
        empty_accept = await call.send({confirm: t.ElicitResult(action="accept"), risk: sampled("ok")})
        assert isinstance(empty_accept, t.InputRequiredResult)
        assert list(call.asked) == [confirm]

        # A person can answer a form again; a client's code would send the same sampling answer again.
        again = Driver(client, "deploy", {"service": "y"})
        await again.send()
        await again.send({again.key_for_message("where?"): accept(env="prod")})
        risk = again.key_where(lambda r: r.method == "sampling/createMessage")
        with pytest.raises(MCPError) as caught:
            await again.send({risk: accept(text="an elicitation result where a sampling result belongs")})
        assert caught.value.error.code == t.INVALID_PARAMS
        assert caught.value.error.message.startswith(f"inputResponses[{risk!r}] is not a valid sampling/createMessage")


async def test_tampered_and_foreign_state_is_rejected_with_invalid_params() -> None:
    server = deploy_server(Counter(), [])
    async with manual_client(server) as client:
        call = Driver(client, "deploy", {"service": "x"})
        await call.send()
        assert call.state is not None
        for state in (call.state + "-TAMPERED", call.state[:-4] + "AAAA", "garbage", "j{}"):
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool(
                    "deploy", {"service": "x"}, request_state=state, allow_input_required=True
                )
            assert caught.value.error.code == t.INVALID_PARAMS
        # State is bound to the call's arguments: replaying it for another service fails.
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool(
                "deploy", {"service": "other"}, request_state=call.state, allow_input_required=True
            )
        assert caught.value.error.code == t.INVALID_PARAMS


async def test_deadline_counts_from_the_first_round_and_does_not_renew() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool(deadline=0.6)
    async def slowpoke(ctx: mrtr.FlowContext) -> int:
        total = 0
        for _ in range(3):
            total += (await ctx.elicit("Pick a number", Pick)).n
        return total

    async with manual_client(server) as client:
        call = Driver(client, "slowpoke")
        await call.send()
        await asyncio.sleep(0.35)
        await call.send({next(iter(call.asked)): accept(n=1)})  # a fresh round, same deadline
        await asyncio.sleep(0.35)
        with pytest.raises(MCPError) as caught:
            await call.send({next(iter(call.asked)): accept(n=2)})
        assert caught.value.error.code == t.INVALID_PARAMS
        assert caught.value.error.data["reason"] == "flow_expired"


async def test_round_cap() -> None:
    server = new_server()
    flows = mrtr.Flows(server, max_rounds=2)

    @flows.tool()
    async def chatty(ctx: mrtr.FlowContext) -> int:
        total = 0
        for _ in range(5):
            total += (await ctx.elicit("Pick a number", Pick)).n
        return total

    async with manual_client(server) as client:
        call = Driver(client, "chatty")
        await call.send()
        await call.send({next(iter(call.asked)): accept(n=1)})
        with pytest.raises(MCPError) as caught:
            await call.send({next(iter(call.asked)): accept(n=1)})
        assert caught.value.error.data["reason"] == "too_many_rounds"
        assert "in 2 rounds, the most max_rounds=2 allows" in caught.value.error.message


async def test_state_size_cap_gives_a_clear_error() -> None:
    server = new_server()
    flows = mrtr.Flows(server, max_state_bytes=4096)

    def fetch_big() -> str:
        import os

        return os.urandom(4000).hex()  # incompressible

    @flows.tool()
    async def hoarder(ctx: mrtr.FlowContext) -> str:
        blob = await ctx.step("fetch", fetch_big)
        await ctx.elicit("Keep it?", Confirm)
        return blob[:4]

    async with manual_client(server) as client:
        with pytest.raises(MCPError) as caught:
            await Driver(client, "hoarder").send()
        assert caught.value.error.code == t.INTERNAL_ERROR
        assert caught.value.error.data["reason"] == "request_state_too_large"
        assert "4,096-byte cap" in caught.value.error.message


async def test_size_estimate_never_undercounts_the_real_sealed_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is enforced on an estimate made before the SDK seals; check it against real tokens."""
    import mrtr._engine.sealing as sdk

    estimates: list[int] = []
    real_estimate = sdk.sealed_size

    plain_lengths: list[int] = []

    def spy(state: str, *args: object, **kwargs: object) -> int:
        estimate = real_estimate(state, *args, **kwargs)  # type: ignore[arg-type]
        if "target" not in kwargs:  # not the per-flow envelope the state budget measures once
            plain_lengths.append(len(state))
            estimates.append(estimate)
        return estimate

    monkeypatch.setattr(sdk, "sealed_size", spy)
    server = new_server()
    flows = mrtr.Flows(server, max_state_bytes=800)  # near enough to the cap that every round estimates

    @flows.tool()
    async def grow(ctx: mrtr.FlowContext) -> int:
        total = 0
        for i in range(7):
            total += (await ctx.elicit(f"Number {i}?", Pick)).n
        return total

    async with manual_client(server) as client:
        call = Driver(client, "grow")
        await call.send()
        tokens = [len(call.state or "")]
        for i in range(6):
            await call.send({next(iter(call.asked)): accept(n=i)})
            tokens.append(len(call.state or ""))
    assert len(estimates) == len(tokens) == 7
    for estimate, token, plain in zip(estimates, tokens, plain_lengths, strict=True):
        assert 0 <= estimate - token <= 96, (estimate, token)
        assert token <= 3 * plain + 512, "the engine skips estimating below this bound; it must hold"


async def test_capability_not_declared_gives_32021_and_flows_can_degrade() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def needs_form(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target)).env

    @flows.tool()
    async def adaptive(ctx: mrtr.FlowContext) -> str:
        if ctx.client_supports("elicitation"):
            return (await ctx.elicit("Where?", Target)).env
        answer = await ctx.sample("Pick an environment name", max_tokens=5)
        return f"model chose {answer.content.text}"

    async with manual_client(server, elicitation=False) as client:
        with pytest.raises(MCPError) as caught:
            await Driver(client, "needs_form").send()
        assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY
        assert caught.value.error.data == {"requiredCapabilities": {"elicitation": {"form": {}}}}

        call = Driver(client, "adaptive")
        await call.send()
        assert [r.method for r in call.asked.values()] == ["sampling/createMessage"]
        done = await call.send({next(iter(call.asked)): sampled("qa")})
        assert text_of(done) == "model chose qa"


async def test_nondeterminism_between_rounds_is_detected() -> None:
    server = new_server()
    flows = mrtr.Flows(server)
    ticks = iter(range(100))

    def charge(amount: int) -> str:
        return f"charged {amount}"

    @flows.tool()
    async def sloppy(ctx: mrtr.FlowContext) -> str:
        amount = next(ticks)  # reads changing state outside a step: not deterministic
        receipt = await ctx.step("charge", charge, amount)
        await ctx.elicit("Email the receipt?", Confirm)
        return receipt

    async with manual_client(server) as client:
        call = Driver(client, "sloppy")
        await call.send()
        with pytest.raises(MCPError) as caught:
            await call.send({next(iter(call.asked)): accept(yes=True)})
        assert caught.value.error.data["reason"] == "nondeterministic_flow"
        assert "step 'charge' was called with different arguments" in caught.value.error.message


async def test_reusing_an_explicit_key_is_a_clear_error() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def twice(ctx: mrtr.FlowContext) -> str:
        await ctx.gather(ctx.elicit("A?", Pick, key="n"), ctx.elicit("B?", Pick, key="n"))
        return "never"

    async with manual_client(server) as client:
        with pytest.raises(MCPError) as caught:
            await Driver(client, "twice").send()
        assert caught.value.error.data["reason"] == "invalid_flow"
        assert "key 'n' was asked twice" in caught.value.error.message


async def test_a_failed_step_is_not_journaled_and_runs_again_next_round() -> None:
    server = new_server()
    flows = mrtr.Flows(server)
    attempts: Counter[str] = Counter()

    def flaky() -> str:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise ConnectionError("upstream down")
        return "ok"

    @flows.tool()
    async def retrying(ctx: mrtr.FlowContext) -> str:
        try:
            status = await ctx.step("flaky", flaky)
        except ConnectionError:
            await ctx.elicit("Upstream is down. Retry?", Confirm)
            status = await ctx.step("flaky-retry", flaky)
        return status

    async with manual_client(server) as client:
        call = Driver(client, "retrying")
        await call.send()
        result = await call.send({next(iter(call.asked)): accept(yes=True)})
        # Round 2 replays: "flaky" is not journaled, so it runs again (and succeeds).
        assert text_of(result) == "ok"
        assert attempts["flaky"] == 2


async def test_rolling_upgrade_keeps_answers_to_questions_still_asked() -> None:
    def build(version: int):
        server = new_server("upgrade")
        flows = mrtr.Flows(server)

        @flows.tool()
        async def onboard(ctx: mrtr.FlowContext) -> str:
            gh, other = await ctx.gather(
                ctx.elicit("GitHub login?", Target, key="github_login"),
                ctx.elicit("Google login?" if version == 1 else "Microsoft login?", Target),
            )
            return f"{gh.env}+{other.env}"

        return server

    old, new = build(1), build(2)
    async with manual_client(old) as old_client, manual_client(new) as new_client:
        call = Driver(old_client, "onboard")
        await call.send()
        google = call.key_for_message("Google")
        await call.send({"github_login": accept(env="octocat")})  # partial: only GitHub answered
        assert list(call.asked) == [google]

        call.client = new_client  # the next round lands on the upgraded instance
        upgraded = await call.send({google: accept(env="ignored: that question is gone")})
        assert isinstance(upgraded, t.InputRequiredResult)
        (microsoft,) = call.asked
        assert "Microsoft" in call.asked[microsoft].params.message
        done = await call.send({microsoft: accept(env="msuser")})
        assert text_of(done) == "octocat+msuser"


async def test_state_past_the_sdk_ttl_is_rejected() -> None:
    """The SDK's per-round TTL applies on top of the flow deadline: a stale round is refused."""
    import os

    from mcp.server.mcpserver import MCPServer
    from mcp.server.request_state import RequestStateSecurity

    server = MCPServer("short-ttl", request_state_security=RequestStateSecurity(keys=[os.urandom(32)], ttl=0.3))
    flows = mrtr.Flows(server)

    @flows.tool()
    async def ask_once(ctx: mrtr.FlowContext) -> int:
        return (await ctx.elicit("Pick a number", Pick)).n

    async with manual_client(server) as client:
        call = Driver(client, "ask_once")
        await call.send()
        await asyncio.sleep(0.4)
        with pytest.raises(MCPError) as caught:
            await call.send({next(iter(call.asked)): accept(n=1)})
        assert caught.value.error.code == t.INVALID_PARAMS
        assert caught.value.error.message == "Invalid or expired requestState"


async def test_a_round_leaves_no_reference_cycle_for_the_garbage_collector() -> None:
    """Every round is freed by reference counting alone: a cycle per round (run, tasks, contexts,
    coroutines, an exception's frames) would leave the collector more work than the round itself."""
    import gc

    from mcp_types import ClientCapabilities

    from mrtr._engine import journal as codec
    from mrtr._engine import run as engine
    from mrtr._engine.journal import Journal

    flows = mrtr.Flows(new_server())

    @flows.tool()
    async def deploy(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target)).env

    spec = flows.specs["deploy"]
    capabilities = ClientCapabilities.model_validate({"elicitation": {"form": {}}})
    first = await engine.execute(spec, Journal.start(), {}, capabilities, {})
    engine.close_round(spec, first.replay)
    state, (key,) = codec.encode(first.replay.journal), list(first.replay.parked)
    del first
    # What exists now is not this test's: frozen, the collections below look only at what the
    # rounds make, not at the rest of the suite's heap (seconds per collection late in a run).
    gc.freeze()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(20):
            parked = await engine.execute(spec, Journal.start(), {}, capabilities, {})
            done = await engine.execute(spec, codec.decode(state), {key: accept(env="a")}, capabilities, {})
            assert parked.parked and done.value == "a"
        del parked, done
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()
        gc.enable()
    assert left == [], f"objects only the cycle collector could free: {sorted(set(left))}"
