"""Replay, driven directly: answers matched to the asks they answer, steps memoized, re-asks, budgets.

Every test runs the engine's `execute` round by round against a journal that is encoded and
decoded between rounds, exactly what travels in `requestState` (`tests/support/enginekit.py`):
no server, no client, no sealing.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY, ClientCapabilities
from pydantic import BaseModel

import mrtr
from mrtr import (
    Cancelled,
    Declined,
    FlowDefinitionError,
    FlowSuspended,
    NondeterminismError,
    StateTooLarge,
    StepResultError,
    TooManyRounds,
)
from mrtr._engine import journal as codec
from mrtr._engine import run as engine
from mrtr._engine.journal import Journal
from mrtr._engine.run import RunOptions
from mrtr._engine.spec import Limits
from tests.support.enginekit import ALL_CAPABILITIES, Rounds, accept, refuse, result_of, sampled, spec_of

pytestmark = pytest.mark.anyio


class Target(BaseModel):
    env: str


class Count(BaseModel):
    n: int


class Plan(BaseModel):
    id: str
    env: str


# -- answers matched to asks -----------------------------------------------------------


async def test_an_unanswered_ask_parks_the_flow_and_its_answer_resumes_it() -> None:
    reached: list[str] = []

    async def deploy(service: str, ctx: mrtr.FlowContext) -> str:
        reached.append("top")
        target = await ctx.elicit(f"Deploy {service} where?", Target)
        reached.append("after")
        return f"{service}@{target.env}"

    call = Rounds(deploy, {"service": "api"})
    first = await call.send()
    assert first.parked and reached == ["top"]
    (key,) = call.asked
    assert call.asked[key]["method"] == "elicitation/create"
    assert call.asked[key]["params"]["message"] == "Deploy api where?"
    assert call.journal.rounds == 1 and call.journal.pending.keys() == {key}

    assert result_of(await call.send({key: accept(env="prod")})) == "api@prod"
    assert reached == ["top", "top", "after"]  # the body ran again from the top


async def test_a_question_keeps_its_key_across_calls_and_a_reworded_one_gets_another() -> None:
    async def ask(message: str, ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit(message, Target)).env

    keys = []
    for message in ("Where?", "Where?", "Where to?"):
        call = Rounds(ask, {"message": message})
        await call.send()
        keys.append(call.only_key())
    assert keys[0] == keys[1] != keys[2]


async def test_answers_already_journaled_are_not_needed_again() -> None:
    async def two(ctx: mrtr.FlowContext) -> str:
        a = await ctx.elicit("First?", Target)
        b = await ctx.elicit("Second?", Target)
        return a.env + b.env

    call = Rounds(two)
    await call.send()
    await call.send({call.only_key(): accept(env="x")})
    # The second round's answer is in the journal: the third round carries only the new one.
    assert result_of(await call.send({call.only_key(): accept(env="y")})) == "xy"


async def test_an_answer_to_a_question_that_was_not_asked_is_ignored() -> None:
    async def ask(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target)).env

    fresh = Rounds(ask)
    await fresh.send()
    key = fresh.only_key()
    unsolicited = Rounds(ask)
    outcome = await unsolicited.send({key: accept(env="sneaky")})  # round 1: nothing was asked yet
    assert outcome.parked and unsolicited.asked.keys() == {key}
    assert key not in unsolicited.journal.answers


async def test_allow_preanswer_takes_an_answer_sent_with_the_first_call() -> None:
    async def ask(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target, key="target", allow_preanswer=True)).env

    assert result_of(await Rounds(ask).send({"target": accept(env="early")})) == "early"


async def test_allow_preanswer_without_an_explicit_key_is_refused() -> None:
    async def ask(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target, allow_preanswer=True)).env

    with pytest.raises(TypeError, match="explicit key"):
        result_of(await Rounds(ask).send())


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (accept(n=3), "Env is required"),  # in the form's words, not pydantic's report
        (accept(), "Env is required"),
        ({"action": "accept"}, "accepted without content"),
        (sampled("wrong kind"), "not an elicitation result"),
    ],
)
async def test_an_answer_that_does_not_fit_is_asked_again_with_the_reason(answer: Any, reason: str) -> None:
    async def ask(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target)).env

    call = Rounds(ask)
    await call.send()
    key = call.only_key()
    outcome = await call.send({key: answer})
    assert outcome.parked and call.asked.keys() == {key}  # the same question, under the same key
    assert reason in call.reasked[key]
    request = call.asked[key]["params"]
    assert request["message"].startswith("Where?\n\n(Asked again: ") and reason in request["message"]
    assert reason in request["_meta"]["mrtr/reaskReason"]
    assert key not in call.journal.answers
    assert result_of(await call.send({key: accept(env="ok")})) == "ok"


async def test_fields_the_form_did_not_ask_for_stay_out_of_the_journal() -> None:
    async def ask(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("Where?", Target)
        return (await ctx.elicit("Then?", Target)).env

    call = Rounds(ask)
    await call.send()
    key = call.only_key()
    await call.send({key: accept(env="prod", secret="x" * 50)})
    assert call.journal.answers[key][1] == {"action": "accept", "content": {"env": "prod"}}


@pytest.mark.parametrize(("action", "error"), [("decline", Declined), ("cancel", Cancelled)])
async def test_a_refusal_raises_in_the_flow_where_it_can_be_caught(action: str, error: type[Exception]) -> None:
    async def ask(ctx: mrtr.FlowContext) -> str:
        try:
            return (await ctx.elicit("Where?", Target)).env
        except error as exc:
            return f"refused {exc.key}"  # type: ignore[attr-defined]

    async def uncaught(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Where?", Target)).env

    call = Rounds(ask)
    await call.send()
    key = call.only_key()
    assert result_of(await call.send({key: refuse(action)})) == f"refused {key}"
    bare = Rounds(uncaught)
    await bare.send()
    with pytest.raises(error, match="Where"):
        result_of(await bare.send({key: refuse(action)}))


async def test_the_same_question_twice_in_one_run_gets_two_keys_and_two_answers() -> None:
    async def loop(ctx: mrtr.FlowContext) -> list[int]:
        return [(await ctx.elicit("Another number?", Count)).n for _ in range(3)]

    call = Rounds(loop)
    keys = []
    answers: list[int] = []
    outcome = await call.send()
    while outcome.parked:
        keys.append(call.only_key())
        answers.append(len(keys) * 10)
        outcome = await call.send({keys[-1]: accept(n=answers[-1])})
    assert result_of(outcome) == [10, 20, 30]
    assert len(set(keys)) == 3 and keys[1] == keys[0] + "_2" and keys[2] == keys[0] + "_3"


async def test_an_explicit_key_asked_twice_in_one_run_is_a_definition_error() -> None:
    async def twice(ctx: mrtr.FlowContext) -> None:
        await ctx.gather(ctx.elicit("A?", Target, key="k"), ctx.elicit("B?", Target, key="k"))

    with pytest.raises(FlowDefinitionError, match="asked twice"):
        result_of(await Rounds(twice).send())


async def test_an_explicit_key_shaped_like_a_derived_one_is_refused() -> None:
    async def mimic(ctx: mrtr.FlowContext) -> None:
        await ctx.elicit("A?", Target, key="elicit_abcdefghij")

    with pytest.raises(FlowDefinitionError, match="shape of a key mrtr derives"):
        result_of(await Rounds(mimic).send())


async def test_a_changed_question_under_an_explicit_key_is_asked_again() -> None:
    wording = ["Where?"]

    async def ask(ctx: mrtr.FlowContext) -> str:
        first = await ctx.elicit(wording[0], Target, key="target")
        await ctx.elicit("And then?", Target)
        return first.env

    call = Rounds(ask)
    await call.send()
    await call.send({"target": accept(env="old")})
    assert "target" in call.journal.answers
    wording[0] = "Where to, now?"  # a redeploy between rounds changed the question
    outcome = await call.send()
    assert outcome.parked and call.asked.keys() == {"target"}
    assert call.asked["target"]["params"]["message"] == "Where to, now?"
    assert "target" not in call.journal.answers


async def test_a_question_that_changes_every_round_is_reported_as_nondeterminism() -> None:
    runs = Counter[str]()

    async def clocky(ctx: mrtr.FlowContext) -> str:
        runs["body"] += 1
        return (await ctx.elicit(f"Deploy at {runs['body']}?", Target)).env  # a clock in the question

    call = Rounds(clocky)
    await call.send()
    await call.send({call.only_key(): accept(env="a")})  # one change: a rolling upgrade, tolerated
    with pytest.raises(NondeterminismError, match="twice in a row"):
        await call.send({call.only_key(): accept(env="b")})


async def test_one_rewording_is_tolerated_and_the_flow_finishes() -> None:
    wording = ["Where?"]

    async def ask(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit(wording[0], Target)).env

    call = Rounds(ask)
    await call.send()
    old = call.only_key()
    wording[0] = "Where to?"
    assert (await call.send({old: accept(env="x")})).parked
    assert call.only_key() != old
    assert result_of(await call.send({call.only_key(): accept(env="y")})) == "y"


async def test_an_ask_the_client_cannot_answer_fails_with_the_missing_capability() -> None:
    async def sample(ctx: mrtr.FlowContext) -> str:
        assert not ctx.client_supports("sampling")
        return await ctx.sample_text("hi", max_tokens=5)

    elicit_only = ClientCapabilities.model_validate({"elicitation": {}})
    with pytest.raises(MCPError) as caught:
        result_of(await Rounds(sample, capabilities=elicit_only).send())
    assert caught.value.error.code == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert caught.value.error.data == {"requiredCapabilities": {"sampling": {}}}


async def test_sampling_and_roots_answers_reach_the_flow() -> None:
    async def both(ctx: mrtr.FlowContext) -> tuple[str, list[str]]:
        text, roots = await ctx.gather(ctx.sample_text("Say hi", max_tokens=5), ctx.list_roots())
        return text, [str(r.uri) for r in roots]

    call = Rounds(both)
    await call.send()
    answers = {
        call.key_asking("Say hi"): sampled("hi"),
        call.key_asking("roots/list"): {"roots": [{"uri": "file:///a"}]},
    }
    assert result_of(await call.send(answers)) == ("hi", ["file:///a"])


async def test_a_flow_past_its_round_cap_fails_with_too_many_rounds() -> None:
    async def chatty(ctx: mrtr.FlowContext) -> int:
        return sum([(await ctx.elicit(f"Number {i}?", Count)).n for i in range(5)])

    call = Rounds(chatty, limits=Limits(max_rounds=2))
    await call.send()
    await call.send({call.only_key(): accept(n=1)})
    with pytest.raises(TooManyRounds, match="in 2 rounds, the most max_rounds=2 allows") as caught:
        await call.send({call.only_key(): accept(n=2)})
    assert caught.value.data == {"maxRounds": 2, "roundsUsed": 2}


# -- steps ------------------------------------------------------------------------------


async def test_a_step_runs_once_and_every_replay_gets_its_journaled_value() -> None:
    runs = Counter[str]()
    seen: list[Plan] = []

    def make_plan(env: str) -> Plan:
        runs["plan"] += 1
        return Plan(id=f"p-{env}", env=env)

    async def deploy(ctx: mrtr.FlowContext) -> str:
        plan = await ctx.step("plan", make_plan, "prod")
        seen.append(plan)
        for i in range(3):
            await ctx.elicit(f"Go {i}?", Target)
        return plan.id

    call = Rounds(deploy)
    outcome = await call.send()
    while outcome.parked:
        outcome = await call.send({call.only_key(): accept(env="y")})
    assert result_of(outcome) == "p-prod"
    assert runs["plan"] == 1 and len(seen) == 4
    assert all(plan == Plan(id="p-prod", env="prod") for plan in seen)  # typed by the annotation, every round


async def test_a_step_that_raises_is_not_journaled_and_runs_again_later() -> None:
    attempts = Counter[str]()

    def flaky() -> str:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise ConnectionError("down")
        return "up"

    async def retrying(ctx: mrtr.FlowContext) -> str:
        try:
            return await ctx.step("call", flaky)
        except ConnectionError:
            await ctx.elicit("Try again?", Target)
            raise AssertionError("unreachable: the ask parks") from None

    call = Rounds(retrying)
    assert (await call.send()).parked
    assert call.journal.steps == {}
    assert result_of(await call.send({call.only_key(): accept(env="y")})) == "up"
    assert attempts["n"] == 2


async def test_steps_of_the_same_name_are_numbered_in_order() -> None:
    async def repeat(ctx: mrtr.FlowContext) -> list[int]:
        values = [await ctx.step("tick", lambda i=i: i * 10) for i in range(3)]
        await ctx.elicit("Done?", Target)
        return values

    call = Rounds(repeat)
    await call.send()
    assert {k: v for k, (_, v) in call.journal.steps.items()} == {"tick": 0, "tick#2": 10, "tick#3": 20}
    assert result_of(await call.send({call.only_key(): accept(env="y")})) == [0, 10, 20]


async def test_a_step_called_with_other_arguments_on_replay_is_nondeterminism() -> None:
    clock = [1]

    async def drifting(ctx: mrtr.FlowContext) -> None:
        await ctx.step("stamp", lambda t: t, clock[0])  # the argument read a clock outside a step
        await ctx.elicit("Go?", Target)

    call = Rounds(drifting)
    await call.send()
    clock[0] = 2
    with pytest.raises(NondeterminismError, match="different arguments"):
        result_of(await call.send({call.only_key(): accept(env="y")}))


async def test_an_argument_without_a_json_form_is_compared_by_type_not_identity() -> None:
    class Handle:
        pass

    async def opaque(ctx: mrtr.FlowContext) -> str:
        value = await ctx.step("use", lambda h: "used", Handle())  # a new object every run
        await ctx.elicit("Go?", Target)
        return value

    call = Rounds(opaque)
    await call.send()
    assert result_of(await call.send({call.only_key(): accept(env="y")})) == "used"


@pytest.mark.parametrize("name", ["", "a#b", "a/b", "a@b"])
async def test_a_step_name_mrtr_uses_for_numbering_is_refused(name: str) -> None:
    async def named(ctx: mrtr.FlowContext) -> None:
        await ctx.step(name, lambda: 1)

    with pytest.raises(FlowDefinitionError, match="step name"):
        result_of(await Rounds(named).send())


async def test_a_step_value_without_a_json_form_is_refused() -> None:
    async def unjournalable(ctx: mrtr.FlowContext) -> None:
        await ctx.step("sock", object)

    with pytest.raises(FlowDefinitionError, match="cannot be journaled as JSON"):
        result_of(await Rounds(unjournalable).send())


async def test_a_step_value_that_does_not_match_its_annotation_names_the_step() -> None:
    def wrong() -> int:
        return "seven"  # type: ignore[return-value]

    async def typed(ctx: mrtr.FlowContext) -> int:
        return await ctx.step("count", wrong)

    with pytest.raises(StepResultError, match="step 'count'"):
        result_of(await Rounds(typed).send())


async def test_a_step_knows_its_stable_idempotency_key() -> None:
    keys: list[str] = []

    def charge() -> str:
        keys.append(mrtr.current_step().idempotency_key)
        return "ok"

    async def pay(ctx: mrtr.FlowContext) -> str:
        await ctx.step("charge", charge)
        await ctx.step("charge", charge)
        return ctx.flow_id

    flow_id = result_of(await Rounds(pay).send())
    assert keys == [f"{flow_id}:charge", f"{flow_id}:charge#2"]


async def test_ctx_used_inside_a_step_function_is_a_definition_error() -> None:
    async def nested(ctx: mrtr.FlowContext) -> None:
        async def inner() -> str:
            return (await ctx.elicit("From a step?", Target)).env

        await ctx.step("inner", inner)

    with pytest.raises(FlowDefinitionError, match="outside the flow's own tasks"):
        result_of(await Rounds(nested).send())


async def test_a_step_running_when_another_branch_parks_finishes_and_is_journaled() -> None:
    runs = Counter[str]()

    async def slow() -> str:
        await asyncio.sleep(0.05)
        runs["slow"] += 1
        return "done"

    async def racing(ctx: mrtr.FlowContext) -> tuple[str, str]:
        value, target = await ctx.gather(ctx.step("slow", slow), ctx.elicit("Where?", Target))
        return value, target.env

    call = Rounds(racing)
    assert (await call.send()).parked
    assert call.journal.steps["0/slow"][1] == "done"
    assert result_of(await call.send({call.only_key(): accept(env="x")})) == ("done", "x")
    assert runs["slow"] == 1


async def test_code_that_runs_after_the_round_settles_cannot_ask_or_step() -> None:
    seen: list[str] = []

    async def cleanup(ctx: mrtr.FlowContext) -> None:
        try:
            await ctx.elicit("Where?", Target)
        finally:
            try:
                await ctx.step("undo", lambda: "x")
            except FlowSuspended:
                seen.append("suspended")

    call = Rounds(cleanup)
    assert (await call.send()).parked
    assert seen == ["suspended"] and call.journal.steps == {}


# -- runs with options: probing, step limits, dry runs ---------------------------------


async def test_a_step_limit_runs_that_many_new_steps_and_settles() -> None:
    runs = Counter[str]()

    def work(name: str) -> str:
        runs[name] += 1
        return name

    async def three(ctx: mrtr.FlowContext) -> list[str]:
        return [await ctx.step(n, work, n) for n in ("a", "b", "c")]

    spec, journal = spec_of(three), Journal.start()
    outcomes = [await engine.execute(spec, journal, {}, None, {}, RunOptions(step_limit=1)) for _ in range(3)]
    assert [o.would_run for o in outcomes[:2]] == [["b"], ["c"]] and all(o.parked for o in outcomes[:2])
    assert outcomes[2].value == ["a", "b", "c"] and runs == Counter(a=1, b=1, c=1)


async def test_a_dry_run_reaches_new_steps_without_running_them() -> None:
    async def one(ctx: mrtr.FlowContext) -> str:
        return await ctx.step("effect", lambda: pytest.fail("a dry run ran a step"))

    outcome = await engine.execute(spec_of(one), Journal.start(), {}, None, {}, RunOptions(dry_run=True))
    assert outcome.parked and outcome.would_run == ["effect"]


async def test_a_probing_run_asks_inline_and_becomes_a_task_at_its_first_step() -> None:
    async def mixed(ctx: mrtr.FlowContext) -> str:
        target = await ctx.elicit("Where?", Target)
        return await ctx.step("deploy", lambda: pytest.fail("a probe ran a side effect"), target.env)

    spec, journal = spec_of(mixed), Journal.start()
    first = await engine.execute(spec, journal, {}, ALL_CAPABILITIES, {}, RunOptions(probe=True))
    assert first.parked and not first.became_task
    (key,) = first.replay.parked
    engine.close_round(spec, first.replay)
    second = await engine.execute(spec, journal, {key: accept(env="p")}, ALL_CAPABILITIES, {}, RunOptions(probe=True))
    assert second.became_task and journal.steps == {}


# -- versioning -------------------------------------------------------------------------


async def test_patched_is_true_for_new_flows_and_false_for_flows_the_old_code_took_past_it() -> None:
    version = ["v1"]

    async def shop(ctx: mrtr.FlowContext) -> str:
        wrapped = version[0] == "v2" and ctx.patched("gift-wrap")
        if wrapped:
            await ctx.step("wrap", lambda: "wrapped")
        target = await ctx.elicit("Ship where?", Target)
        return f"{target.env} wrapped={wrapped}"

    old = Rounds(shop)
    await old.send()  # started by v1: its journal shows it went past the patch point
    version[0] = "v2"
    assert result_of(await old.send({old.only_key(): accept(env="home")})) == "home wrapped=False"

    new = Rounds(shop)
    await new.send()
    assert "gift-wrap" in new.journal.markers
    assert result_of(await new.send({new.only_key(): accept(env="home")})) == "home wrapped=True"


# -- budgets ----------------------------------------------------------------------------


async def test_an_answer_too_large_for_the_state_budget_is_asked_again() -> None:
    class Note(BaseModel):
        text: str

    async def note(ctx: mrtr.FlowContext) -> str:
        return (await ctx.elicit("Note?", Note)).text

    call = Rounds(note, budget=600)
    await call.send()
    key = call.only_key()
    assert (await call.send({key: accept(text=os.urandom(1000).hex())})).parked
    assert "too large" in call.reasked[key]
    assert key not in call.journal.answers
    assert result_of(await call.send({key: accept(text="short")})) == "short"


async def test_a_step_value_too_large_for_the_state_budget_fails_naming_the_step() -> None:
    async def big(ctx: mrtr.FlowContext) -> None:
        await ctx.step("payload", lambda: os.urandom(2500).hex())

    with pytest.raises(StateTooLarge, match="step 'payload'"):
        result_of(await Rounds(big, budget=1000).send())


@pytest.mark.parametrize("budget", [400, 700, 1500, 4000])
async def test_what_a_run_journals_stays_within_its_budget(budget: int) -> None:
    """Admitted entries never take the encoded journal past the budget, whatever their sizes."""
    sizes = [10, 200, 30, 900, 5, 400, 60, 1200, 80, 300]

    async def many(ctx: mrtr.FlowContext) -> int:
        kept = 0
        for i, size in enumerate(sizes):
            try:
                await ctx.step(f"s{i}", lambda n=size, i=i: f"{i}:é" + os.urandom(n).hex())
                kept += 1
            except StateTooLarge:
                pass
        return kept

    journal = Journal.start()
    outcome = await engine.execute(spec_of(many), journal, {}, None, {}, RunOptions(budget=budget))
    assert 1 <= outcome.value < len(sizes)  # some fit, some were refused
    assert codec.embedded_length(codec.encode(journal)) <= budget
    assert len(journal.steps) == outcome.value


async def test_a_journal_measured_at_exactly_its_budget_encodes_within_it() -> None:
    async def one(ctx: mrtr.FlowContext) -> str:
        return await ctx.step("s", lambda: "value")

    unbounded = Journal(flow_id="f" * 16, started_at=1.0)
    await engine.execute(spec_of(one), unbounded, {}, None, {})
    budget = unbounded.size()
    journal = Journal(flow_id="f" * 16, started_at=1.0)
    outcome = await engine.execute(spec_of(one), journal, {}, None, {}, RunOptions(budget=budget))
    assert outcome.value == "value"  # admitted: the run measured it at its budget
    assert codec.embedded_length(codec.encode(journal)) <= budget
