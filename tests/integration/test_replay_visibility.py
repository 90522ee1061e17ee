"""Issue 27, item 5: code outside `ctx.step` runs once per round; mrtr makes that visible.

A DEBUG line on logger `mrtr.replay` for every re-run of a body (WARNING under
`Flows(strict=True)`), and `mrtr.testing.run_rounds`, which drives a flow round by round with
the official client and reports the side effects that ran more than once.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import mcp_types as t
import pytest
from pydantic import BaseModel

import mrtr
from mrtr.testing import Effects, run_rounds
from tests.support.flowkit import new_server, text_of

pytestmark = pytest.mark.anyio


class Ok(BaseModel):
    ok: bool = True


def four_round_flows(**options: Any) -> tuple[mrtr.Flows, list[str]]:
    """A flow of three questions (four rounds) that sends an email outside any step."""
    outbox: list[str] = []
    flows = mrtr.Flows(new_server("replays"), **options)

    @flows.tool()
    async def expense(ctx: mrtr.FlowContext, amount: int) -> str:
        outbox.append(f"approval requested for {amount}")  # the mistake: not in a step
        for who in ("manager", "finance", "director"):
            await ctx.elicit(f"Does the {who} approve {amount}?", Ok)
        return "approved"

    return flows, outbox


def replay_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "mrtr.replay" and "replaying the body" in r.getMessage()]


async def test_each_replayed_round_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    flows, outbox = four_round_flows()
    with caplog.at_level(logging.DEBUG, logger="mrtr.replay"):
        report = await run_rounds(flows, "expense", {"amount": 120}, answers={"approve": Ok()})
    assert report.rounds == 4 and text_of(report.result) == "approved"
    assert len(outbox) == 4  # what the log makes visible
    records = replay_records(caplog)
    assert [r.levelno for r in records] == [logging.DEBUG] * 3  # rounds 2-4; round 1 is no replay
    messages = [r.getMessage() for r in records]
    for n, message in zip((2, 3, 4), messages, strict=True):
        assert message.startswith("flow expense (")
        assert message.endswith(
            f"replaying the body for round {n}; code outside ctx.step runs again (its 0 journaled step(s) do not)"
        )


async def test_quiet_by_default_and_loud_under_strict(caplog: pytest.LogCaptureFixture) -> None:
    quiet, _ = four_round_flows()
    with caplog.at_level(logging.INFO, logger="mrtr.replay"):
        await run_rounds(quiet, "expense", {"amount": 1}, answers={"approve": Ok()})
    assert replay_records(caplog) == []

    strict, _ = four_round_flows(strict=True)
    assert strict.specs["expense"].strict
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mrtr.replay"):
        await run_rounds(strict, "expense", {"amount": 1}, answers={"approve": Ok()})
    records = replay_records(caplog)
    assert [r.levelno for r in records] == [logging.WARNING] * 3
    assert ["round 2" in records[0].getMessage(), "round 4" in records[2].getMessage()] == [True, True]


async def test_run_rounds_reports_a_tracked_effect_that_repeats() -> None:
    effects = Effects()
    sent: list[str] = []

    def send_email(to: str, subject: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    send = effects.track(send_email)
    flows = mrtr.Flows(new_server("tracked"))

    @flows.tool()
    async def approve(ctx: mrtr.FlowContext, amount: int) -> str:
        send("audit@example.com", subject=f"expense {amount}")  # outside a step: every round
        answer = await ctx.elicit(f"Approve {amount}?", Ok)
        await ctx.step("notify", send, "boss@example.com", "approved")  # once
        await ctx.elicit("Archive it?", Ok, key="archive")
        return f"approved={answer.ok}"

    report = await run_rounds(
        flows, "approve", {"amount": 7}, answers={"Approve": {"ok": True}, "archive": "accept"}, effects=effects
    )
    assert report.rounds == 3
    assert text_of(report.result) == "approved=True" and not report.result.is_error
    outside = "send_email('audit@example.com', subject='expense 7')"
    assert report.effects == {outside: [1, 2, 3], "send_email('boss@example.com', 'approved')": [2]}
    assert report.repeated == {outside: [1, 2, 3]}
    assert not report.ok
    assert f"{outside}: 3 times, in rounds [1, 2, 3]" in report.explain()
    assert sent.count("boss@example.com") == 1


async def test_run_rounds_reads_a_counter_and_answers_every_kind() -> None:
    counts: Counter[str] = Counter()
    flows = mrtr.Flows(new_server("counted"))

    @flows.tool()
    async def plan(ctx: mrtr.FlowContext) -> str:
        counts["body"] += 1
        await ctx.step("charge", lambda: counts.update(["charge"]))
        draft = await ctx.sample("Draft a plan", max_tokens=50)
        roots = await ctx.list_roots()
        form = await ctx.elicit("Ship it?", Ok, key="ship")
        text = draft.content.text if isinstance(draft.content, t.TextContent) else ""
        return f"{text} / {len(roots)} root(s) / {form.ok}"

    def answer(key: str, request: t.InputRequest) -> Any:
        if request.method == "sampling/createMessage":
            return "a plan"
        if request.method == "roots/list":
            return ["file:///repo"]
        assert key == "ship"
        return Ok(ok=False)

    report = await run_rounds(flows, "plan", answers=answer, effects=counts)
    assert text_of(report.result) == "a plan / 1 root(s) / False"
    assert report.rounds == 4
    assert report.effects == {"body": [1, 2, 3, 4], "charge": [1]}
    assert report.repeated == {"body": [1, 2, 3, 4]}

    # The same flow, answered from a mapping by method and by key; a callable returning counts.
    counts.clear()
    again = await run_rounds(
        flows,
        "plan",
        answers={"sampling/createMessage": "v2", "roots/list": [], "ship": {"ok": True}},
        effects=lambda: {"bodies": counts["body"]},
    )
    assert text_of(again.result) == "v2 / 0 root(s) / True"
    assert again.repeated == {"bodies": [1, 2, 3, 4]}


async def test_run_rounds_names_an_unanswered_ask() -> None:
    flows, _ = four_round_flows()
    with pytest.raises(LookupError, match=r"no answer for ask '.*': elicitation/create 'Does the manager approve 3\?'"):
        await run_rounds(flows, "expense", {"amount": 3}, answers={"nothing": "accept"})


async def test_run_rounds_names_an_answer_the_flow_refuses() -> None:
    flows, _ = four_round_flows()
    with pytest.raises(ValueError, match=r"the flow asked '.*' again: it did not accept the answer given"):
        await run_rounds(flows, "expense", {"amount": 3}, answers={"approve": {"ok": "not a bool"}})
