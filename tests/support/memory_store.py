"""A small, honest in-memory `TaskStore` for unit tests of the task runtime and its worker.

It keeps each record as JSON (as the real stores do, so no caller shares a live object with
the store), compares versions on `save`, and answers `claimable` and `next_wake` from the
lease times, like `SQLiteStore`. It also counts every call, so a test can say how many store
round trips something took. Listing is kept simple (no cursors): the unit tests never page.
"""

from __future__ import annotations

from collections import Counter

from mrtr.stores import TaskExists, TaskRecord
from mrtr.stores._base import STATUSES, TaskPage, TaskQuery


class MemoryStore:
    """Tasks in a dict, one process only; see the module docstring."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, str]] = {}
        self.calls: Counter[str] = Counter()
        """How many times each method was called (`store.calls["save"]`)."""

    def _live(self, task_id: str, now: float) -> TaskRecord | None:
        row = self._rows.get(task_id)
        if row is None:
            return None
        record = TaskRecord.from_json(row[1])
        record.version = row[0]
        expires = record.expires_at
        return None if expires is not None and expires <= now else record

    def _all(self, now: float) -> list[TaskRecord]:
        return [r for task_id in list(self._rows) if (r := self._live(task_id, now)) is not None]

    async def create(self, record: TaskRecord) -> None:
        self.calls["create"] += 1
        found = self._rows.get(record.task_id)
        if found is not None:
            stored = TaskRecord.from_json(found[1])
            if stored.expires_at is None or stored.expires_at > record.created_at:
                raise TaskExists(record.task_id)
        self._rows[record.task_id] = (record.version, record.to_json())

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        self.calls["load"] += 1
        return self._live(task_id, now)

    async def save(self, record: TaskRecord) -> bool:
        self.calls["save"] += 1
        found = self._rows.get(record.task_id)
        if found is None or found[0] != record.version:
            return False
        self._rows[record.task_id] = (record.version + 1, record.copy(version=record.version + 1).to_json())
        record.version += 1
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        self.calls["claimable"] += 1
        due = sorted((r for r in self._all(now) if r.status == "working" and r.lease_until < now), key=_lease)
        return [r.task_id for r in due[:limit]]

    async def next_wake(self, now: float) -> float | None:
        self.calls["next_wake"] += 1
        later = [r.lease_until for r in self._all(now) if r.status == "working" and r.lease_until > now]
        return min(later, default=None)

    async def purge_expired(self, now: float) -> int:
        self.calls["purge_expired"] += 1
        gone = [task_id for task_id in list(self._rows) if self._live(task_id, now) is None]
        for task_id in gone:
            del self._rows[task_id]
        return len(gone)

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        self.calls["list_tasks"] += 1
        records = [r for r in self._all(now) if not query.statuses or r.status in query.statuses]
        records.sort(key=lambda r: (r.created_at, r.task_id), reverse=True)
        return TaskPage(records=records[: query.limit], next_cursor=None)

    async def count_by_status(self, now: float) -> dict[str, int]:
        self.calls["count_by_status"] += 1
        counts = dict.fromkeys(STATUSES, 0)
        for record in self._all(now):
            counts[record.status] += 1
        return counts

    async def flows(self, now: float) -> list[str]:
        return sorted({r.flow for r in self._all(now)})

    async def count_expired(self, now: float) -> int:
        return sum(1 for task_id in self._rows if self._live(task_id, now) is None)

    async def close(self) -> None:
        pass


def _lease(record: TaskRecord) -> float:
    return record.lease_until


__all__ = ["MemoryStore"]
