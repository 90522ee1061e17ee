"""The lease runtime through the task seam: start, get, update, cancel, over an in-memory store.

The runtime is tested apart from its worker where it can be: `wake` (how it resumes a task
here) is replaced by a recorder, and no scanner runs.
"""

from __future__ import annotations

import time

import pytest
from mcp.shared.exceptions import MCPError

from mrtr._engine.journal import Journal
from mrtr._wire import CreateTaskResult
from mrtr.stores import TaskRecord
from mrtr.tasks._runtime import TaskRuntime, TaskSnapshot
from mrtr.tasks._seam import Creator, EngineOptions, TaskCall
from tests.support.memory_store import MemoryStore
from tests.unit.tasks.kit import COUNT, GREET, Reported, convert, fresh, settled

pytestmark = pytest.mark.anyio


class Woken:
    """Stands in for the worker's claim: records which tasks the runtime woke."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, task_id: str) -> bool:
        self.ids.append(task_id)
        return True


def runtime_over(store: MemoryStore, **options: object) -> tuple[TaskRuntime, Reported, Woken]:
    runtime = TaskRuntime(store, EngineOptions(**options))  # type: ignore[arg-type]
    runtime.register(COUNT, convert)
    runtime.register(GREET, convert)
    reported, woken = Reported(), Woken()
    runtime.on_change = reported
    runtime.wake = woken
    return runtime, reported, woken


async def test_start_creates_the_task_durably_answers_a_typed_result_and_runs_it_here() -> None:
    store = MemoryStore()
    runtime, reported, _ = runtime_over(store, ttl=120.0, poll_interval=0.25)
    try:
        created = await runtime.start(TaskCall(COUNT, {"upto": 7}, None, Journal.start()))
        assert isinstance(created, CreateTaskResult)
        assert created.status == "working" and created.ttl_ms == 120_000 and created.poll_interval_ms == 250
        assert reported.states[0] == (created.task_id, "working")
        done = await settled(store, created.task_id, "completed")
    finally:
        await runtime.close()
    assert done.owner is None and done.arguments == {"upto": 7}
    assert done.result is not None and done.result["content"][0]["text"] == "7"
    assert store.calls["create"] == 1


async def test_a_keyed_resend_gets_the_first_task_and_another_call_under_the_key_is_refused() -> None:
    store = MemoryStore()
    runtime, _, _ = runtime_over(store)
    alice = Creator(owner="alice-tag", idempotency_key="k-1")
    try:
        first = await runtime.start(TaskCall(COUNT, {"upto": 1}, None, Journal.start()), alice)
        again = await runtime.start(TaskCall(COUNT, {"upto": 1}, None, Journal.start()), alice)
        bob = await runtime.start(TaskCall(COUNT, {"upto": 1}, None, Journal.start()), Creator("bob-tag", "k-1"))
        with pytest.raises(MCPError) as refused:
            await runtime.start(TaskCall(COUNT, {"upto": 2}, None, Journal.start()), alice)
    finally:
        await runtime.close()
    assert again.task_id == first.task_id and again.created_at == first.created_at
    assert bob.task_id != first.task_id, "the key is the creator's own"
    assert refused.value.error.data == {"reason": "idempotency_key_reused"}


async def test_get_answers_a_view_not_the_row_and_none_for_an_unknown_or_expired_task() -> None:
    store = MemoryStore()
    runtime, _, _ = runtime_over(store)
    await store.create(fresh("t1", "greet", owner="tag", lease_owner="w", lease_until=time.time() + 60))
    await store.create(fresh("old", "greet", created_at=time.time() - 10, ttl_ms=1000))
    view = await runtime.get("t1")
    assert isinstance(view, TaskSnapshot) and not isinstance(view, TaskRecord)
    assert (view.task_id, view.flow, view.status, view.owner, view.version) == ("t1", "greet", "working", "tag", 0)
    assert not hasattr(view, "journal") and not hasattr(view, "lease_owner")
    assert await runtime.get("nope") is None and await runtime.get("old") is None
    many = await runtime.get_many(["t1", "nope"])
    assert [None if v is None else v.task_id for v in many] == ["t1", None]


async def parked(store: MemoryStore, runtime: TaskRuntime) -> TaskSnapshot:
    request = {"method": "elicitation/create", "params": {"message": "Who?"}}
    await store.create(fresh("t1", "greet", status="input_required", input_requests={"who": request}))
    view = await runtime.get("t1")
    assert view is not None
    return view


async def test_update_with_the_view_just_read_needs_no_second_read_and_wakes_the_task_here() -> None:
    store = MemoryStore()
    runtime, reported, woken = runtime_over(store)
    view = await parked(store, runtime)
    loads = store.calls["load"]
    answer = {"action": "accept", "content": {"name": "Ada"}}
    await runtime.update("t1", {"who": answer}, view.input_requests, known=view)
    assert store.calls["load"] == loads, "the compare-and-set starts from the row the view came from"
    record = await store.load("t1", time.time())
    assert record is not None and record.status == "working" and record.responses == {"who": answer}
    assert woken.ids == ["t1"] and reported.states == [("t1", "working")]


async def test_an_update_that_answers_nothing_outstanding_changes_nothing() -> None:
    store = MemoryStore()
    runtime, reported, woken = runtime_over(store)
    view = await parked(store, runtime)
    await runtime.update("t1", {"other": {"action": "accept"}}, {"other": {}}, known=view)
    await runtime.update("t1", {"who": {"action": "accept"}}, {"who": {"method": "something else"}}, known=view)
    record = await store.load("t1", time.time())
    assert record is not None and record.version == 0 and woken.ids == [] and reported.states == []


async def test_a_stale_view_is_retried_from_a_fresh_read() -> None:
    store = MemoryStore()
    runtime, _, woken = runtime_over(store)
    view = await parked(store, runtime)
    record = await store.load("t1", time.time())
    assert record is not None and await store.save(record.copy(status_message="touched"))  # someone wrote
    await runtime.update(
        "t1", {"who": {"action": "accept", "content": {"name": "Ada"}}}, view.input_requests, known=view
    )
    kept = await store.load("t1", time.time())
    assert kept is not None and kept.status == "working" and kept.status_message == "touched"
    assert woken.ids == ["t1"]


async def test_cancel_of_a_parked_task_cancels_it_and_is_idempotent() -> None:
    store = MemoryStore()
    runtime, reported, _ = runtime_over(store)
    view = await parked(store, runtime)
    loads = store.calls["load"]
    await runtime.cancel("t1", known=view)
    assert store.calls["load"] == loads
    await runtime.cancel("t1")
    await runtime.cancel("unknown")
    record = await store.load("t1", time.time())
    assert record is not None and record.status == "cancelled" and record.version == 1
    assert reported.states == [("t1", "cancelled")]


async def test_configure_takes_callbacks_and_the_seal_but_keeps_the_options_it_was_built_with() -> None:
    from mrtr.stores import RecordSeal

    runtime = TaskRuntime(MemoryStore(), EngineOptions(ttl=5.0, lease=2.0))
    ring = RecordSeal.from_keys([b"k" * 32])
    runtime.configure(EngineOptions(ttl=99.0, lease=50.0, seal=ring))
    assert runtime.options.ttl == 5.0 and runtime.context.lease == 2.0
    assert runtime.options.seal is ring and runtime.context.seal is ring


async def test_an_answer_that_resumes_the_task_here_takes_its_lease_in_the_same_write() -> None:
    """No read of the task back and no claim write of its own (issue 49): the update's one write
    carries this instance's lease, and the run it launches finishes the task."""
    store = MemoryStore()
    runtime = TaskRuntime(store, EngineOptions())
    runtime.register(GREET, convert)
    try:
        await store.create(fresh("t1", "greet"))
        assert await runtime.worker.try_claim("t1")
        asked = await settled(store, "t1", "input_required")
        view = await runtime.get("t1")
        loads, saves = store.calls["load"], store.calls["save"]
        answer = {"action": "accept", "content": {"name": "Ada"}}
        await runtime.update("t1", dict.fromkeys(asked.input_requests, answer), asked.input_requests, known=view)
        assert (store.calls["load"], store.calls["save"]) == (loads, saves + 1)
        resumed = await store.load("t1", time.time())
        assert resumed is not None and resumed.lease_owner == runtime.worker.worker_id
        done = await settled(store, "t1", "completed")
    finally:
        await runtime.close()
    assert done.result is not None and done.result["content"][0]["text"] == "hello Ada"
