"""Step checkpoints of a durable task, written as soon as the flow could take time, and no sooner.

A finished step must be in the store before anything could make it run twice or be lost:
before the flow's next step starts (its side effect), before the flow waits on anything
(a timer, a thread, a sibling: the worker could die meanwhile), and at the latest in the
write that ends the run (parked, completed, failed). Writing after every step, inline,
satisfies that with one store write per step; but a flow that ends (or parks) right after a
step, the commonest shape of all, then writes twice in a row: the checkpoint, and the
run's final write carrying the same journal.

So a finished step only marks the journal dirty and asks the loop for a write at its next
pass (`after_step`). If the flow runs on without yielding, straight to its end, the run's
final write carries the step (`settle`) and the scheduled write finds nothing left to do.
If the flow yields first, the write starts right then, and a step that starts later waits
for it (`durable`), as does the final write. The window in which a dying worker loses a
finished step is the same as before: from the step's end until its write commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable

from mrtr._wire import HistoryEntry


class Checkpoints:
    """The journal writes of one task run; `write()` saves the journal as it is at that moment."""

    def __init__(self, write: Callable[[], Awaitable[None]], instance: str = "") -> None:
        self._write = write
        self.instance = instance
        """Where this run runs (the worker's id), for the history."""
        self.ran: list[HistoryEntry] = []
        """Steps run since the last write that stored them (`TaskRecord.history` entries)."""
        self._dirty = False
        self._scheduled = False
        self._writing: asyncio.Task[None] | None = None

    def after_step(self) -> None:
        """A step's result was journaled: have it written once the flow yields (or with the final write)."""
        self._dirty = True
        if not self._scheduled:
            self._scheduled = True
            # An empty context: the write is mrtr's, never a task of the flow (see mrtr._engine.branches).
            asyncio.get_running_loop().call_soon(self._start, context=contextvars.Context())

    def step_started(self, key: str, idempotency_key: str) -> None:
        """A step is about to begin its side effect: note it in the history, for the `durable()`
        the step awaits next to store.

        So a run that a killed worker never finished still shows, and the step's run again on
        another instance shows as a second run. It costs no write of its own after a step
        (the previous step's checkpoint carries it), one before a run's first step.
        """
        entry: HistoryEntry = {"at": round(time.time(), 3), "kind": "step", "key": key, "phase": "start"}
        self.ran.append(self._where(entry, idempotency_key))
        self._dirty = True

    def step_ran(self, key: str, seconds: float, error: str | None, idempotency_key: str = "") -> None:
        """Note a step that really ran for the task's history; the next write stores it."""
        entry: HistoryEntry = {"at": round(time.time(), 3), "kind": "step", "key": key, "seconds": round(seconds, 4)}
        entry["phase"] = "end"
        if error is not None:
            entry["error"] = error[:500]
        self.ran.append(self._where(entry, idempotency_key))

    def _where(self, entry: HistoryEntry, idempotency_key: str) -> HistoryEntry:
        if self.instance:
            entry["instance"] = self.instance
        if idempotency_key:
            entry["idempotency_key"] = idempotency_key
        return entry

    async def durable(self) -> None:
        """Wait until every journaled step is in the store (before a step's side effect)."""
        while self._dirty or (self._writing is not None and not self._writing.done()):
            if self._writing is None or self._writing.done():
                self._start_now()
            assert self._writing is not None
            await asyncio.shield(self._writing)
        if self._writing is not None and self._writing.done():
            self._writing.result()  # a write that failed (the lease was lost) fails the step

    async def settle(self) -> None:
        """The run's final write is next and carries the journal: only let a write in flight finish first."""
        self._dirty = False
        if self._writing is not None:
            await asyncio.shield(self._writing)

    async def land(self, wait: float) -> None:
        """The run stops early (the instance shuts down): store what finished, if it can within `wait` s."""
        try:
            await asyncio.wait_for(self.durable(), wait)
        except (Exception, asyncio.CancelledError):  # gone or cancelled again: the lease runs out either way
            self.abandon()

    def abandon(self) -> None:
        """The run stops without a final write (the instance shuts down): stop a write in flight."""
        self._dirty = False
        if self._writing is not None and not self._writing.done():
            self._writing.cancel()

    def _start(self) -> None:
        self._scheduled = False
        if self._dirty and (self._writing is None or self._writing.done()):
            self._start_now()

    def _start_now(self) -> None:
        if self._writing is not None and self._writing.done() and not self._writing.cancelled():
            with contextlib.suppress(Exception):
                self._writing.result()  # seen by whoever awaited it; never "exception never retrieved"
        self._dirty = False
        self._writing = asyncio.get_running_loop().create_task(self._write_journal(), context=contextvars.Context())

    async def _write_journal(self) -> None:
        await self._write()
        while self._dirty:  # steps that finished during the write
            self._dirty = False
            await self._write()


__all__ = ["Checkpoints"]
