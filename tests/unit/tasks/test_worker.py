"""The task worker on its own: a `LeaseContext` over an in-memory store, no runtime, no server."""

from __future__ import annotations

import asyncio
import time

import pytest

from mrtr._engine.context import FlowContext
from mrtr.stores import TaskRecord
from mrtr.tasks._lease import LeaseContext
from mrtr.tasks._worker import TaskWorker
from tests.support.enginekit import spec_of
from tests.support.memory_store import MemoryStore
from tests.unit.tasks.kit import COUNT, GREET, Reported, convert, fresh, settled

pytestmark = pytest.mark.anyio


class Holding:
    """A flow that says it started, then holds until released (or cancelled)."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, ctx: FlowContext) -> str:
        self.started.set()
        await self.release.wait()
        return "released"


async def running(worker: TaskWorker, store: MemoryStore, holding: Holding) -> TaskRecord:
    """A `holding` task claimed and running on `worker`: its record once the flow has started."""
    spec = spec_of(holding, name="hold")
    worker.context.flows[spec.name] = (spec, convert)
    await store.create(fresh("t1", "hold"))
    assert await worker.try_claim("t1")
    await asyncio.wait_for(holding.started.wait(), 5)
    record = await store.load("t1", time.time())
    assert record is not None
    return record


def worker_over(store: MemoryStore, *, lease: float = 5.0) -> tuple[TaskWorker, Reported]:
    reported = Reported()
    context = LeaseContext(store, lease=lease, report=reported)
    context.flows.update({COUNT.name: (COUNT, convert), GREET.name: (GREET, convert)})
    return TaskWorker(context, scan_interval=0.05), reported


async def test_a_scan_claims_a_free_task_runs_it_and_gives_the_lease_up_with_its_result() -> None:
    store = MemoryStore()
    await store.create(fresh("t1", "count"))
    worker, reported = worker_over(store)
    try:
        assert await worker.scan_once() == 1
        done = await settled(store, "t1", "completed")
    finally:
        await worker.close()
    assert done.result is not None and done.result["content"][0]["text"] == "3"
    assert done.lease_until == 0.0
    assert [(e["key"], e["phase"]) for e in done.history] == [("count", "start"), ("count", "end")]
    assert all(e["instance"] == worker.worker_id and e["idempotency_key"].endswith(":count") for e in done.history)
    assert reported.states == [("t1", "completed")], "the worker reports what it commits, through the context"


async def test_a_flow_that_asks_parks_in_input_required_with_its_request() -> None:
    store = MemoryStore()
    await store.create(fresh("t1", "greet"))
    worker, reported = worker_over(store)
    try:
        assert await worker.try_claim("t1")
        parked = await settled(store, "t1", "input_required")
    finally:
        await worker.close()
    [request] = parked.input_requests.values()
    assert request["method"] == "elicitation/create" and request["params"]["message"] == "Who?"
    assert reported.states == [("t1", "input_required")]


async def test_a_task_whose_lease_another_worker_holds_is_left_alone() -> None:
    store = MemoryStore()
    await store.create(fresh("t1", "count", lease_owner="elsewhere", lease_until=time.time() + 60))
    worker, reported = worker_over(store)
    try:
        assert await worker.scan_once() == 0
        assert not await worker.try_claim("t1")
    finally:
        await worker.close()
    record = await store.load("t1", time.time())
    assert record is not None and record.lease_owner == "elsewhere" and record.version == 0
    assert reported.states == []


async def test_a_task_of_a_flow_it_does_not_serve_is_given_back_untouched_and_not_retried_at_once() -> None:
    store = MemoryStore()
    created = fresh("t1", "added_later")
    await store.create(created)
    worker, _ = worker_over(store)
    try:
        assert await worker.scan_once() == 1  # claims it, finds no such flow, gives it back
        left = await settled(store, "t1", "working")
        assert await worker.scan_once() == 0, "not again at once"
    finally:
        await worker.close()
    assert left.journal == created.journal and left.result is None and left.history == []


async def test_cancelling_a_local_run_that_was_asked_to_cancel_ends_it_cancelled() -> None:
    store = MemoryStore()
    worker, reported = worker_over(store)
    try:
        record = await running(worker, store, Holding())
        assert await store.save(record.copy(cancel_requested=True))  # what `TaskRuntime.cancel` writes
        assert worker.cancel_local("t1")
        done = await settled(store, "t1", "cancelled")
    finally:
        await worker.close()
    assert done.status == "cancelled" and reported.states == [("t1", "cancelled")]
    assert not worker.cancel_local("t1"), "no run left here"


async def test_a_worker_that_lost_its_lease_writes_nothing_more() -> None:
    store = MemoryStore()
    worker, reported = worker_over(store, lease=0.3)
    holding = Holding()
    try:
        record = await running(worker, store, holding)
        stolen = record.copy(lease_owner="another", lease_until=time.time() + 60)
        assert await store.save(stolen)  # another worker took the task over
        await asyncio.sleep(0.3)  # a heartbeat finds the lease gone and stops the run
        holding.release.set()
        await asyncio.sleep(0.1)
    finally:
        await worker.close()
    kept = await store.load("t1", time.time())
    assert kept is not None and kept.lease_owner == "another" and kept.status == "working"
    assert kept.version == stolen.version and reported.states == []


async def test_the_scanner_wakes_for_a_task_whose_wake_time_comes_before_the_next_scan() -> None:
    store = MemoryStore()
    worker, _ = worker_over(store)
    worker.scan_interval = 30.0
    await store.create(fresh("t1", "count", lease_until=time.time() + 0.2))  # parked on a timer due soon
    worker.ensure_scanning()
    try:
        await settled(store, "t1", "completed", within=3.0)
    finally:
        await worker.close()
    assert store.calls["next_wake"] >= 1, "the pause came from the store's next wake time, not the scan interval"


async def test_a_record_this_instance_just_wrote_is_claimed_without_reading_it_back() -> None:
    store = MemoryStore()
    await store.create(fresh("t1", "count"))
    worker, _ = worker_over(store)
    record = await store.load("t1", time.time())
    assert record is not None
    try:
        worker.saw(record)
        loads = store.calls["load"]
        assert await worker.try_claim("t1")
        assert store.calls["load"] == loads
        done = await settled(store, "t1", "completed")
    finally:
        await worker.close()
    assert done.result is not None and done.result["content"][0]["text"] == "3"


async def test_a_stale_record_handed_to_the_claim_fails_its_version_check_and_the_claim_reads_the_task() -> None:
    store = MemoryStore()
    await store.create(fresh("t1", "count"))
    worker, _ = worker_over(store)
    stale = await store.load("t1", time.time())
    assert stale is not None
    assert await store.save(stale.copy(status_message="touched"))  # someone wrote since
    try:
        worker.saw(stale)
        loads = store.calls["load"]
        assert await worker.try_claim("t1")
        assert store.calls["load"] == loads + 1
        done = await settled(store, "t1", "completed")
    finally:
        await worker.close()
    assert done.result is not None and done.result["content"][0]["text"] == "3"
