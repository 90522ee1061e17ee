"""`TaskAdmin`: operate the tasks of a store, through the store's own API.

What `mrtr tasks` does from a shell (and an operator's console would): list and read tasks,
cancel them, purge the expired, deliver events, and re-run a failed task from its journal.
Every change is the same compare-and-set transition the task runtime makes (`cancel_change`
is shared with `TaskRuntime.cancel`), so an operator and the fleet never fight over a task.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import JournalFormatError
from mrtr._errors import EventNotDelivered
from mrtr._wire import HistoryEntry
from mrtr.stores._base import HISTORY_KEPT, TaskPage, TaskQuery, TaskRecord, TaskStore
from mrtr.stores._sealed import RecordSeal, Resealed, SealedStore, reseal
from mrtr.tasks._events import Bus, TaskEvents
from mrtr.tasks._fork import StepUnknown, fork_change, new_attempt
from mrtr.tasks._inbox import deliver, new_event

_CAS_RETRIES = 20
_PAGE = 500

BulkAction = Literal["cancel", "rerun", "purge"]


@dataclass(frozen=True)
class BulkOutcome:
    """What one task of a bulk action became: `done` (changed), `skipped` (nothing to do), or `error`."""

    task_id: str
    before: str
    """Its status before the action."""
    after: str
    """Its status after it (`purged` once deleted)."""
    outcome: Literal["done", "skipped", "error"]
    note: str = ""


def cancel_change(record: TaskRecord, now: float) -> tuple[TaskRecord | None, bool]:
    """The record a cancel leaves, and whether a live worker must stop it; (None, False): nothing to do.

    A task running under a live lease gets `cancel_requested` (its worker's heartbeat sees it and
    cancels the flow at its next await); any other unfinished task, parked ones included, ends
    `cancelled` at once.
    """
    if record.terminal or record.cancel_requested:
        return None, False  # idempotent, also on finished tasks
    running = record.status == "working" and record.lease_owner is not None and record.lease_until >= now
    changed = record.copy(cancel_requested=True, updated_at=now)
    if not record.sealed:  # read without its key (an operator's cancel): its payload stays as sealed
        changed = changed.copy(history=[*record.history, {"at": round(now, 3), "kind": "cancel"}][-HISTORY_KEPT:])
    if not running:
        changed = changed.copy(status="cancelled", status_message=None, waiting=[], lease_owner=None, lease_until=0.0)
        if not record.sealed:
            changed = changed.copy(input_requests={})
    return changed, running


def failed(record: TaskRecord) -> bool:
    """Ended in failure: `failed`, or `completed` with a tool error (`isError`)."""
    return record.status == "failed" or (
        record.status == "completed" and bool(record.result and record.result.get("isError"))
    )


_ACTION_STATUSES: dict[str, tuple[str, ...]] = {
    "cancel": ("working", "input_required"),
    "rerun": ("failed", "completed"),
    "purge": ("completed", "failed", "cancelled"),
}


def applies(action: BulkAction, record: TaskRecord) -> bool:
    """Whether a bulk `action` would change `record`: cancel an unfinished task (not already being
    cancelled), re-run a failed one, purge a finished one. What a confirmation counts."""
    if action == "cancel":
        return not record.terminal and not record.cancel_requested
    if action == "rerun":
        return failed(record)
    return record.terminal


class TaskUnknown(LookupError):
    """No such task in the store (unknown, or past its TTL)."""


class TaskSealed(ValueError):
    """The change needs the task's payload, which is sealed at rest and no key given opens it."""


class TaskAdmin:
    """Operate the tasks of `store` (any `TaskStore`: SQLite, Redis, PostgreSQL, or your own).

    Args:
        store: The fleet's store.
        clock: Epoch seconds (the store's clock is the fleet's; the host's is close enough for admin).
        seal: The fleet's key ring (`RecordSeal.from_keys(...)`), to open records sealed at rest.
            Without it (or for a record no key of it opens) a record reads with its metadata
            only (`record.sealed`): listing, reading, cancelling and purging still work; re-runs
            and events, which change the payload, raise `TaskSealed`.
    """

    def __init__(
        self,
        store: TaskStore,
        *,
        clock: Callable[[], float] = time.time,
        seal: RecordSeal | None = None,
        bus: Bus | None = None,
    ) -> None:
        self.store: TaskStore = store if seal is None else SealedStore(store, seal, strict=False)
        self.seal = seal
        self.clock = clock
        self.events = None if bus is None else TaskEvents(bus)
        """Every change an operator makes is published here (as the runtime publishes its own), so
        other consoles and `subscriptions/listen` streams see it at once."""

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        """A page of tasks, newest first (see `TaskQuery`)."""
        return await self.store.list_tasks(query or TaskQuery(), self.clock())

    async def get(self, task_id: str) -> TaskRecord | None:
        return await self.store.load(task_id, self.clock())

    async def counts(self) -> dict[str, int]:
        """Tasks by status."""
        return await self.store.count_by_status(self.clock())

    async def flows(self) -> list[str]:
        return await self.store.flows(self.clock())

    async def purge_expired(self) -> int:
        """Delete the tasks past their TTL; returns how many."""
        return await self.store.purge_expired(self.clock())

    async def matching(
        self,
        query: TaskQuery,
        *,
        limit: int | None = None,
        action: BulkAction | None = None,
    ) -> list[TaskRecord]:
        """Every task `query` matches (all its pages, or the newest `limit`), newest first: what a
        bulk action acts on. With `action`, only the tasks it applies to (see `applies`), read
        through the statuses it can change (a re-run reads only failed and completed tasks)."""
        if action is not None:
            wanted = _ACTION_STATUSES[action]
            statuses = tuple(s for s in query.statuses if s in wanted) if query.statuses else wanted
            if not statuses:
                return []
            query = replace(query, statuses=statuses)
        found: list[TaskRecord] = []
        cursor = None
        while True:
            page = await self.store.list_tasks(replace(query, limit=_PAGE, cursor=cursor), self.clock())
            found.extend(r for r in page.records if action is None or applies(action, r))
            if page.next_cursor is None or (limit is not None and len(found) >= limit):
                return found if limit is None else found[:limit]
            cursor = page.next_cursor

    async def purge(self, task_id: str) -> TaskRecord:
        """Delete one finished task now (its record and everything in it); returns it as it was.

        Only finished tasks (completed, failed, cancelled) go: cancel a running one first. The
        record is expired on the spot with a compare-and-set (so a task that changed meanwhile is
        not deleted on a stale read), then purged with the rest of the expired.

        Raises:
            TaskUnknown: No such task.
            ValueError: The task has not finished.
        """
        for _ in range(_CAS_RETRIES):
            record = await self._load(task_id)
            if not record.terminal:
                raise ValueError(
                    f"task {task_id!r} is {record.status}: only finished tasks are purged (cancel it first)"
                )
            now = self.clock()
            gone = record.copy(ttl_ms=max(0, int((now - record.created_at) * 1000)), updated_at=now)
            if await self.store.save(gone):
                await self.store.purge_expired(self.clock())
                await self._publish(gone)
                return record
        raise RuntimeError(f"task {task_id!r} is busy; try again")

    async def bulk(self, action: BulkAction, task_ids: Iterable[str]) -> list[BulkOutcome]:
        """`cancel`, `rerun` or `purge` each task, one compare-and-set at a time; what each became.

        A task the action does not apply to (already finished for a cancel, not failed for a
        re-run, not finished for a purge) is `skipped`, with the reason; one that vanished or kept
        changing is an `error`. The rest is still done: a bulk action never stops halfway.
        """
        outcomes: list[BulkOutcome] = []
        for task_id in task_ids:
            before = await self.get(task_id)
            if before is None:
                outcomes.append(BulkOutcome(task_id, "-", "-", "error", "unknown, or past its TTL"))
                continue
            try:
                if action == "cancel":
                    if before.terminal or before.cancel_requested:
                        note = "cancel already requested" if before.cancel_requested else "already finished"
                        outcomes.append(BulkOutcome(task_id, before.status, before.status, "skipped", note))
                        continue
                    changed, running = await self.cancel(task_id)
                    note = f"cancel requested: {changed.lease_owner} stops it" if running else ""
                    outcomes.append(BulkOutcome(task_id, before.status, changed.status, "done", note))
                elif action == "rerun":
                    if not failed(before):
                        outcomes.append(BulkOutcome(task_id, before.status, before.status, "skipped", "did not fail"))
                        continue
                    changed = await self.rerun(task_id)
                    outcomes.append(
                        BulkOutcome(task_id, before.status, changed.status, "done", f"attempt {changed.attempt} queued")
                    )
                elif action == "purge":
                    if not before.terminal:
                        outcomes.append(BulkOutcome(task_id, before.status, before.status, "skipped", "not finished"))
                        continue
                    await self.purge(task_id)
                    outcomes.append(BulkOutcome(task_id, before.status, "purged", "done"))
                else:
                    raise ValueError(f"unknown bulk action {action!r}: cancel, rerun or purge")
            except (TaskUnknown, TaskSealed, RuntimeError, ValueError) as exc:
                if isinstance(exc, ValueError) and str(exc).startswith("unknown bulk action"):
                    raise
                outcomes.append(BulkOutcome(task_id, before.status, before.status, "error", str(exc)))
        return outcomes

    async def cancel(self, task_id: str) -> tuple[TaskRecord, bool]:
        """Cancel a task; returns its record and whether a live worker still has to stop it.

        Raises:
            TaskUnknown: No such task.
            RuntimeError: The task kept changing under us (try again).
        """
        for _ in range(_CAS_RETRIES):
            record = await self._load(task_id)
            changed, running = cancel_change(record, self.clock())
            if changed is None:
                return record, False
            if await self.store.save(changed):
                await self._publish(changed)
                return changed, running
        raise RuntimeError(f"task {task_id!r} is busy; try again")

    async def rerun(self, task_id: str, *, from_step: str | None = None, by: str | None = None) -> TaskRecord:
        """Run a failed task again from its journal: finished steps are kept, the failed one runs again.

        With `from_step`, fork any finished task (completed, failed or cancelled) from that step
        (a step name, its first run; or a journal key such as `charge#2`): the steps before it
        replay, it and everything after it run again, later asks are asked again (see
        `mrtr.tasks._fork`). `by` names who did it in the task's history.

        The task goes back to `working` with no worker, so the next scan of any instance that
        serves its flow claims it and replays the journal: steps that finished return their
        journaled results; the step that raised was never journaled, so it runs again, under
        the same idempotency key. The attempt counter goes up, and the flow's deadline counts
        afresh from now (a re-run is a new attempt, not the old one's overtime).

        Raises:
            TaskUnknown: No such task.
            ValueError: The task did not fail (only `failed` tasks, or `completed` with
                `isError`, can be re-run); with `from_step`, it has not finished.
            StepUnknown: (a `ValueError`) The task has no step `from_step`.
        """
        for _ in range(_CAS_RETRIES):
            record = await self._load(task_id)
            if record.sealed:
                raise TaskSealed(f"task {task_id!r} is sealed at rest: re-running it needs the key that opens it")
            if from_step is not None:
                forked = fork_change(record, from_step, self.clock(), by)
                if await self.store.save(forked):
                    await self._publish(forked)
                    return forked
                continue
            if not failed(record):
                raise ValueError(f"task {task_id!r} is {record.status} without an error: only failed tasks re-run")
            now = self.clock()
            try:
                journal = journal_codec.decode(record.journal)
            except JournalFormatError as exc:
                raise ValueError(f"task {task_id!r}: its journal cannot be read, so it cannot re-run ({exc})") from None
            attempt = record.attempt + 1
            entry: HistoryEntry = {"at": round(now, 3), "kind": "rerun", "attempt": attempt}
            changed = new_attempt(record, journal, now, f"re-run by an operator (attempt {attempt})", entry)
            if await self.store.save(changed):
                await self._publish(changed)
                return changed
        raise RuntimeError(f"task {task_id!r} is busy; try again")

    async def send_event(self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None) -> bool:
        """Deliver an event (as `Flows.send_event`); the next scan of the fleet resumes a task parked on it.

        Raises:
            mrtr.EventNotDelivered: Unknown, expired or finished task.
            ValueError: A malformed name, or a payload that is not JSON or too large.
        """
        now = self.clock()
        event = new_event(name, payload, event_id, now)
        record = await self.get(task_id)
        if record is not None and record.sealed:
            raise TaskSealed(f"task {task_id!r} is sealed at rest: delivering an event needs the key that opens it")
        delivered, changed = await deliver(self.store, task_id, event, now, known=record)
        if delivered:
            await self._publish(changed)
        return delivered

    async def reseal(self, *, batch: int = 200, on_batch: Callable[[Resealed], None] | None = None) -> Resealed:
        """Seal every live record under the ring's first key: plain ones and those sealed under an
        older key, so that key can leave the ring. Safe beside a live fleet: each rewrite is a
        compare-and-set on the record's version (see `mrtr.stores.reseal`).

        Raises:
            ValueError: No key ring was given.
        """
        if self.seal is None:
            raise ValueError("resealing needs the key ring (TaskAdmin(store, seal=RecordSeal.from_keys(keys)))")
        return await reseal(self.store, self.seal, self.clock(), batch=batch, on_batch=on_batch)

    async def _publish(self, record: TaskRecord) -> None:
        """Tell the fleet (best effort, as the runtime does: the write stands if the bus fails)."""
        if self.events is not None:
            await self.events.publish(record)

    async def _load(self, task_id: str) -> TaskRecord:
        record = await self.get(task_id)
        if record is None:
            raise TaskUnknown(f"no task {task_id!r} (unknown, or past its TTL)")
        return record


__all__ = [
    "BulkAction",
    "BulkOutcome",
    "EventNotDelivered",
    "StepUnknown",
    "TaskAdmin",
    "TaskSealed",
    "TaskUnknown",
    "applies",
    "cancel_change",
    "failed",
]
