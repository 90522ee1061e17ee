"""The audit trail in a task's journal (#38): each ask's question, its form's title, when it was
asked and answered; bounded; absent from journals written before it, which still replay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pydantic import BaseModel, Field

import mrtr
from mrtr._engine import journal as journal_codec
from mrtr._engine.questions import CUT, QUESTION_MAX
from mrtr.client import TasksClient, update_task
from mrtr.stores import RecordSeal, SealedStore, TaskStore
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import SHARED_KEY, new_server, task_state

pytestmark = [pytest.mark.anyio, pytest.mark.in_process]


class Approve(BaseModel):
    """Release approval"""

    model_config = {"title": "Release approval"}
    ok: bool = Field(description="Ship it?")


LONG = "Approve all of: " + "x" * (QUESTION_MAX * 2)


def audited_server(path: Path) -> Any:
    server = new_server("audit-under-test")
    flows = mrtr.Flows(server, store=SQLiteStore(str(path)), task_poll_interval=0.05, task_scan_interval=0.2)

    @flows.tool(task="required")
    async def release(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("Approve release 7.1 to production?", Approve, key="approval")
        return f"approved={answer.ok}"

    @flows.tool(task="required")
    async def summarise(ctx: mrtr.FlowContext) -> str:
        reply = await ctx.sample(
            [
                {"role": "user", "content": {"type": "text", "text": "first message"}},
                {"role": "assistant", "content": {"type": "text", "text": "noted"}},
                {"role": "user", "content": {"type": "text", "text": "Summarise the incident of Tuesday"}},
            ],
            max_tokens=50,
            key="summary",
        )
        return str(reply.content)

    @flows.tool(task="required")
    async def wordy(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit(LONG, Approve, key="approval")
        return f"approved={answer.ok}"

    return server


def opened(path: Path) -> TaskStore:
    return SealedStore(SQLiteStore(str(path)), RecordSeal.from_keys([SHARED_KEY]))


async def _never(*args: Any) -> Any:
    raise AssertionError("answers go through tasks/update")


async def wait_status(session: Any, task_id: str, status: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.05)


async def journal_of(path: Path, task_id: str) -> journal_codec.Journal:
    store = opened(path)
    try:
        record = await store.load(task_id, time.time())
    finally:
        await store.close()
    assert record is not None
    return journal_codec.decode(record.journal)


async def test_each_ask_keeps_its_question_title_and_times(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with Client(
        audited_server(path), extensions=[TasksClient(_never)], elicitation_callback=_never, sampling_callback=_never
    ) as client:
        before = time.time()
        created = await client.session.call_tool("release", {}, allow_claimed=True)
        task_id = str(created.task_id)
        await wait_status(client.session, task_id, "input_required")
        asked = (await journal_of(path, task_id)).questions["approval"]
        assert asked["q"] == "Approve release 7.1 to production?" and asked["t"] == "Release approval"
        assert asked["k"] == "elicit" and before - 1 <= asked["a"] <= time.time() and "r" not in asked
        await update_task(client.session, task_id, {"approval": {"action": "accept", "content": {"ok": True}}})
        done = await wait_status(client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "approved=True"
        answered = (await journal_of(path, task_id)).questions["approval"]
        assert answered["q"] == asked["q"] and answered["a"] == asked["a"] <= answered["r"] <= time.time()

        created = await client.session.call_tool("summarise", {}, allow_claimed=True)
        sampled = str(created.task_id)
        await wait_status(client.session, sampled, "input_required")
        note = (await journal_of(path, sampled)).questions["summary"]
        assert note["k"] == "sample" and note["q"] == "Summarise the incident of Tuesday", "the last user message"

        created = await client.session.call_tool("wordy", {}, allow_claimed=True)
        long_id = str(created.task_id)
        await wait_status(client.session, long_id, "input_required")
        cut = (await journal_of(path, long_id)).questions["approval"]["q"]
        assert len(cut) == QUESTION_MAX and cut.endswith(CUT) and cut.startswith("Approve all of: xxx"), "bounded"


async def test_a_journal_written_before_questions_were_kept_still_replays(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    async with Client(
        audited_server(path), extensions=[TasksClient(_never)], elicitation_callback=_never, sampling_callback=_never
    ) as client:
        created = await client.session.call_tool("release", {}, allow_claimed=True)
        task_id = str(created.task_id)
        await wait_status(client.session, task_id, "input_required")
        # Rewrite the stored journal as an older mrtr wrote it: no "q" field at all.
        store = opened(path)
        try:
            record = await store.load(task_id, time.time())
            assert record is not None
            journal = journal_codec.decode(record.journal)
            wire = journal.to_wire()
            assert "q" in wire
            del wire["q"]
            legacy = journal_codec.Journal.from_wire(wire)
            assert legacy.questions == {} and legacy.pending == journal.pending
            assert await store.save(record.copy(journal=journal_codec.encode(legacy)))
        finally:
            await store.close()
        await update_task(client.session, task_id, {"approval": {"action": "accept", "content": {"ok": False}}})
        done = await wait_status(client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "approved=False", "the old journal replayed"
        after = (await journal_of(path, task_id)).questions["approval"]
        assert after["q"] == "Approve release 7.1 to production?" and "r" in after, "recorded when answered"
