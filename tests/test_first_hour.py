"""The first hour with mrtr: every trap a newcomer hit (issue 10) fails early, with an error that names the fix.

Each test is one bullet of the issue's "Why", with the error text asserted exactly.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr.stores.sqlite import SQLiteStore
from mrtr.task_client import CreatedTask, TasksClient, get_task, update_task
from tests.flowkit import Driver, accept, manual_client, new_server

pytestmark = pytest.mark.anyio


class Slot(BaseModel):
    ok: bool


async def _unused(*args: Any) -> Any:
    raise AssertionError("answers are given by hand")


def task_client(server: Any) -> Client:
    """Declares every capability and the tasks extension; the test answers through `tasks/update`."""
    return Client(
        server,
        extensions=[TasksClient(_unused)],
        elicitation_callback=_unused,
        sampling_callback=_unused,
        list_roots_callback=_unused,
    )


async def answer_task_until_done(client: Client, task_id: str, *, limit: int = 40) -> tuple[dict[str, Any], int]:
    """Answer every question the task asks (yes to each) until it ends; returns the task and the answers sent."""
    sent = 0
    async with asyncio.timeout(20):
        while sent < limit:
            task = await get_task(client.session, task_id)
            if task["status"] in ("completed", "failed", "cancelled"):
                return task, sent
            if task["status"] == "input_required":
                answers = {key: {"action": "accept", "content": {"ok": True}} for key in task["inputRequests"]}
                await update_task(client.session, task_id, answers)
                sent += len(answers)
                while (await get_task(client.session, task_id))["status"] == "input_required":
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.01)
    raise AssertionError(f"the task was still asking after {sent} answers")


# -- Durable tasks ignore max_rounds; a question that changes after it was answered ------------------------


def clock_server(**options: Any) -> Any:
    server = new_server("first-hour")
    flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), task_poll_interval=0.02, **options)

    @flows.tool(task="optional")
    async def book(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit(f"Slot at {time.time():.6f}?", Slot)  # the newcomer's bug: a clock in the question
        return f"booked: {answer.ok}"

    @flows.tool(task="optional")
    async def survey(ctx: mrtr.FlowContext) -> str:
        for i in range(50):  # a legitimate flow that simply asks more than the cap allows
            await ctx.elicit(f"Question {i}?", Slot)
        return "done"

    return server


async def test_an_inline_question_that_changes_after_every_answer_is_nondeterminism_not_a_round_cap() -> None:
    async with manual_client(clock_server(max_rounds=8)) as client:
        call = Driver(client, "book")
        await call.send()
        await call.send({key: accept(ok=True) for key in call.asked})  # one rewording: asked again, no error
        with pytest.raises(MCPError) as caught:
            await call.send({key: accept(ok=True) for key in call.asked})
    error = caught.value.error
    assert len(call.rounds) == 2, "caught after two wasted answers, not after max_rounds"
    assert error.code == -32603 and error.data["reason"] == "nondeterministic_flow"
    assert error.message.startswith("flow 'book' asked elicit 'Slot at ")
    assert error.message.endswith(
        "instead of the question just answered ("
        f"{next(iter(call.asked))!r}), twice in a row: the question changes between runs. Compute its changing "
        "parts (clocks, random values, I/O) in a ctx.step so every replay asks the same"
    )


async def test_a_task_whose_question_changes_fails_as_nondeterminism_after_two_answers() -> None:
    async with task_client(clock_server(max_rounds=8)) as client:
        created = await client.session.call_tool("book", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        task, sent = await answer_task_until_done(client, created.task_id)
    assert sent == 2, f"the task should stop after the second wasted answer, not after {sent}"
    assert task["status"] == "failed"
    assert task["error"]["code"] == -32603 and task["error"]["data"]["reason"] == "nondeterministic_flow"
    assert "twice in a row: the question changes between runs" in task["error"]["message"]


async def test_a_task_obeys_max_rounds_exactly_as_an_inline_flow() -> None:
    server = clock_server(max_rounds=8)
    async with manual_client(server) as client:
        call = Driver(client, "survey")
        await call.send()
        with pytest.raises(MCPError) as inline:
            for _ in range(10):
                await call.send({key: accept(ok=True) for key in call.asked})
    async with task_client(server) as client:
        created = await client.session.call_tool("survey", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        task, sent = await answer_task_until_done(client, created.task_id)
    assert sent == len(call.rounds) == 8, "both ways, eight rounds of questions and not one more"
    assert task["status"] == "failed"
    assert task["error"] == {
        "code": -32602,
        "message": "flow 'survey' needed more than 8 rounds of client input",
        "data": {"reason": "too_many_rounds", "flow": "survey"},
    }
    assert inline.value.error.message == task["error"]["message"]


async def test_a_task_obeys_its_deadline_exactly_as_an_inline_flow() -> None:
    async with task_client(clock_server(deadline=1.0)) as client:
        created = await client.session.call_tool("survey", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        async with asyncio.timeout(10):
            while (task := await get_task(client.session, created.task_id))["status"] != "input_required":
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.1)  # the user answers after the flow's deadline
        await update_task(
            client.session,
            created.task_id,
            {k: {"action": "accept", "content": {"ok": True}} for k in task["inputRequests"]},
        )
        task, _ = await answer_task_until_done(client, created.task_id)
    assert task["status"] == "failed"
    assert task["error"] == {
        "code": -32602,
        "message": "flow 'survey' passed its 1s deadline; start the call again without state",
        "data": {"reason": "flow_expired", "flow": "survey"},
    }
