"""The task worker: this instance's share of the fleet's durable work.

`TaskRuntime` (`mrtr.tasks._runtime`) is the engine's API: create, read, answer, cancel,
deliver events. This module is the worker behind it, sharing only its `LeaseContext`
(`mrtr.tasks._lease`: the store, clock, lease, flows and report hook): a scanner that claims
tasks whose lease ran out (orphaned by a dead worker, parked on a timer now due, or woken by
an event), and the runs it launches, each holding a lease it renews by heartbeat while the
flow runs, writing every finished step before the flow goes on, and settling where the run
ended in one write. It never calls the runtime; the runtime calls it (`launch`, `try_claim`
as the runtime's `wake`, `cancel_local`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Collection
from typing import Any

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal, JournalFromNewerVersion
from mrtr._engine.progress import ThrottledStatus
from mrtr._engine.run import Outcome, RunOptions, execute
from mrtr._engine.spec import FlowSpec
from mrtr._errors import FlowDefinitionError, StoreUnavailable
from mrtr._telemetry import metrics, tracing
from mrtr._wire import HistoryEntry
from mrtr.stores import TaskRecord
from mrtr.stores._abilities import has_next_wake
from mrtr.stores._base import HISTORY_KEPT, WAIT_FOREVER
from mrtr.stores._sealed import RecordSealed
from mrtr.tasks._checkpoints import Checkpoints
from mrtr.tasks._inbox import settle_inbox
from mrtr.tasks._lease import LeaseContext
from mrtr.tasks._outcome import Settled, prologue, settle
from mrtr.tasks._seam import ConvertResult

logger = tracing.get_logger("mrtr.tasks.runtime")

_CLOCK_SYNC_EVERY = 10  # scans between re-reads of the store's clock
_FOREIGN_BACKOFF = 30.0  # seconds before this instance looks again at a task it cannot run
_LAND_WAIT = 2.0  # seconds a shutting-down run waits for its finished steps' checkpoint

STORE_DOWN = "store unavailable"
"""`LeaseLost`'s argument when the store, not another worker, took the lease away."""

_STORE_RETRY = (0.1, 1.0)  # first and longest pause between two tries of a write the store refused
_FINAL_WRITE_FOR = 60.0  # seconds a run's final write keeps trying while the store is down

_SCAN_BATCH = 32
"""Tasks one scan claims at most; a full batch makes the scanner look again at once."""

_SEEN_KEPT = 256
"""Committed records kept for their claim (`TaskWorker.saw`) at most."""


class LeaseLost(BaseException):
    """Another worker owns this task now (our lease ran out); stop without writing.

    `LeaseLost(STORE_DOWN)`: the lease could not be renewed because the store did not answer
    (logged once per burst by the store, so not again per task).

    A control-flow signal, raised through the flow (from a step's checkpoint): a
    `BaseException`, so a flow's `except Exception` cannot swallow it and carry on.
    """


class TaskWorker:
    """Claims, runs and settles the tasks this instance takes on (see the module docstring).

    Args:
        context: What it shares with the runtime: the store, clock, lease, flows and report hook.
        scan_interval: Seconds between looks for orphaned or due work.
    """

    def __init__(self, context: LeaseContext, scan_interval: float) -> None:
        self.context = context
        self.scan_interval = scan_interval
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        """The lease owner this instance writes (host, process, a random tag)."""
        self._running: dict[str, asyncio.Task[None]] = {}
        self._foreign: dict[str, float] = {}
        """Tasks of flows this instance does not serve: task id -> when to look again."""
        self._scanner: asyncio.Task[None] | None = None
        self._again: set[str] = set()
        self._claims: set[asyncio.Task[bool | None]] = set()
        self._waiter: asyncio.Future[None] | None = None
        """The scanner's pause; released early when this instance parks a task on a timer."""
        self._seen: dict[str, TaskRecord] = {}
        """Records this instance just committed and is about to claim (`saw`), by task id."""

    def ensure_scanning(self) -> None:
        """Start this instance's background scanner (idempotent; needs a running loop)."""
        if self._scanner is None or self._scanner.done():
            self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())

    async def _scan_forever(self) -> None:
        scans = 0
        while True:
            pause = self.scan_interval
            try:
                if scans % _CLOCK_SYNC_EVERY == 0:
                    await self.context.sync_clock()
                launched = await self.scan_once()
                await metrics.refresh_task_counts(self.context.store, self.context.now())  # the `mrtr.tasks` gauge
                scans += 1
                if scans % 60 == 0:
                    await self.context.store.purge_expired(self.context.now())
                pause = 0.0 if launched >= _SCAN_BATCH else await self._until_next_wake()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable:
                pause = self.scan_interval  # logged once per burst by the store (mrtr.store)
            except Exception:
                logger.exception("task scan failed; retrying")
            if pause > 0:
                await self._pause(pause)

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if `_wake_scanner` is called: a bare future and a timer.

        No task is made for it (`asyncio.wait_for` would make one): the scanner must never run
        code of its own under a task that a flow's teardown could see as one of its own.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(seconds, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake_scanner(self) -> None:
        """Have the scanner look again now (a task just parked with an earlier wake time)."""
        if self._waiter is not None:
            _release(self._waiter)

    async def _until_next_wake(self) -> float:
        """Seconds until the earliest parked task falls due, capped at the scan interval.

        One indexed read (`WakeIndexed.next_wake`) per scan, however many tasks sleep: a
        timer wakes within a store round trip of its due time, with no per-task polling.
        """
        store = self.context.store
        if not has_next_wake(store):
            return self.scan_interval
        now = self.context.now()
        due = await store.next_wake(now)
        if due is None:
            return self.scan_interval
        return min(self.scan_interval, max(0.0, due - now))

    async def scan_once(self) -> int:
        """Claim and launch every task whose lease has run out; returns how many."""
        launched = 0
        now = self.context.now()
        for task_id in await self.context.store.claimable(now, limit=_SCAN_BATCH):
            if self._foreign.get(task_id, 0.0) > now:
                continue
            if task_id not in self._running and await self.try_claim(task_id):
                launched += 1
        return launched

    def saw(self, record: TaskRecord) -> None:
        """`record` is the task as this instance just committed it: the next `try_claim` of it
        starts from it rather than reading it back. A stale one only costs that read after all:
        its claim fails the store's version check, and the claim reads the task then."""
        self._seen.pop(record.task_id, None)
        self._seen[record.task_id] = record
        while len(self._seen) > _SEEN_KEPT:  # never claimed (a replaced `wake`): the oldest go
            del self._seen[next(iter(self._seen))]

    def lease_for(self, record: TaskRecord, now: float) -> dict[str, Any]:
        """The lease fields that claim `record` for this instance in a write about to make it
        claimable (an answer that resumes it), if `try_claim` would claim it then; else none.

        The write then claims it as `try_claim` would have, one write earlier: `saw` it, and
        `try_claim` runs it without a claim of its own.
        """
        if record.flow not in self.context.flows or record.lease_until >= now or record.task_id in self._running:
            return {}
        return {"lease_owner": self.worker_id, "lease_until": now + self.context.lease}

    async def try_claim(self, task_id: str) -> bool:
        now = self.context.now()
        seen = self._seen.pop(task_id, None)
        if seen is not None and (seen.expires_at is None or seen.expires_at > now):
            if seen.lease_owner == self.worker_id and seen.lease_until > now and task_id not in self._running:
                self.launch(seen)  # claimed by the write that made it claimable (`lease_for`)
                return True
            if await self._claim(seen, now):
                return True
        try:
            record = await self.context.store.load(task_id, now)
        except RecordSealed as exc:
            # Sealed under a key this instance's ring lacks: an instance with the key runs it. The
            # others in this scan still get their turn (one unreadable task must not stall them).
            logger.warning("%s; leaving it for an instance whose key ring opens it", exc)
            self._foreign[task_id] = now + _FOREIGN_BACKOFF
            return False
        return record is not None and await self._claim(record, now)

    async def _claim(self, record: TaskRecord, now: float) -> bool:
        """Take the lease of `record` (as last read or committed) and run it; False if it is not
        claimable, is running here already, or changed since (the store's version check)."""
        if not record.claimable or record.lease_until >= now or record.task_id in self._running:
            return False
        claimed = record.copy(lease_owner=self.worker_id, lease_until=now + self.context.lease, updated_at=now)
        if not await self.context.store.save(claimed):
            return False
        self.launch(claimed)
        return True

    def launch(self, record: TaskRecord) -> None:
        task_id = record.task_id
        run = asyncio.get_running_loop().create_task(self._run_guarded(record))
        self._running[task_id] = run
        run.add_done_callback(lambda _: self._ended(task_id))

    def _ended(self, task_id: str) -> None:
        self._running.pop(task_id, None)
        if task_id in self._again:  # woken while it ran (an event it now waits for): claim it again
            self._again.discard(task_id)
            claim = asyncio.get_running_loop().create_task(_quietly(self.try_claim(task_id)))
            self._claims.add(claim)
            claim.add_done_callback(self._claims.discard)

    def cancel_local(self, task_id: str) -> bool:
        run = self._running.get(task_id)
        if run is None:
            return False
        run.cancel()
        return True

    async def close(self) -> None:
        tasks = [t for t in (self._scanner, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one run of a task ---------------------------------------------------------------

    async def _run_guarded(self, record: TaskRecord) -> None:
        """One run; a store that stopped answering ends it quietly (logged once per burst by the
        store), never as "Task exception was never retrieved". Its lease lapses, and a worker
        claims the task again once the store is back."""
        try:
            await self._run(record)
        except StoreUnavailable:
            logger.debug("task %s: run stopped, the store did not answer; it resumes when it is back", record.task_id)
        except LeaseLost as exc:
            _log_lost(exc, "task %s: lease lost; stopping", record.task_id)

    async def _run(self, record: TaskRecord) -> None:
        tracing.bind_task(record.task_id)
        held = _Held(record)
        entry = self.context.flows.get(record.flow)
        try:
            start = None if entry is None else prologue(entry[0], record.task_id, record.journal, record.capabilities)
        except JournalFromNewerVersion:
            start = None
        if entry is None or start is None:
            await self._leave(held)
            return
        if isinstance(start, Settled):  # it cannot run at all: failed, once
            await self._finish(held, **start.changes())
            return
        spec, convert = entry
        journal, capabilities = start
        checkpoints = Checkpoints(lambda: self._write(held, journal=journal_codec.encode(journal)), self.worker_id)
        held.ran = checkpoints.ran  # every write of this run takes the steps it ran into the history
        waits = _RunWaits(self.context, held)
        status = ThrottledStatus(lambda message: self._status(held, message))
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(held, asyncio.current_task()))
        try:
            outcome = await execute(
                spec,
                journal,
                record.responses,
                capabilities,
                record.arguments,
                RunOptions(checkpoint=checkpoints, waits=waits, progress=status),
            )
        except asyncio.CancelledError:
            heartbeat.cancel()
            await status.close()
            if held.lease_lost:  # the heartbeat could not renew the lease: stop, write nothing
                checkpoints.abandon()
                logger.debug("task %s: its lease could not be renewed; stopping", record.task_id)
                return
            if held.cancel_seen or await self._cancel_requested(held):
                with contextlib.suppress(LeaseLost):
                    await checkpoints.settle()
                await self._finish(held, status="cancelled", journal=journal_codec.encode(journal))
                return
            await checkpoints.land(_LAND_WAIT)  # finished steps are kept, not run again
            raise  # shutting down: leave the lease to run out so another instance resumes
        except LeaseLost as exc:
            checkpoints.abandon()
            _log_lost(exc, "task %s: lease lost to another worker; stopping", record.task_id)
            return
        finally:
            heartbeat.cancel()
            await status.close()  # the run's last write says where the task is now
        if isinstance(outcome.error, LeaseLost | StoreUnavailable):
            # A checkpoint could not be written before the lease ran out: the flow stopped there.
            # Not its outcome: write nothing; the task resumes from its last checkpoint.
            checkpoints.abandon()
            _log_lost(outcome.error, "task %s: lease lost before a checkpoint was saved; stopping", record.task_id)
            return
        try:
            with contextlib.suppress(LeaseLost, StoreUnavailable):  # the final write carries the journal anyway
                await checkpoints.settle()  # a write in flight lands first; the final write carries the rest
            held.final = True  # the version check fences it: it may keep trying past the lease
            await _landing(self._settle(held, spec, convert, journal, outcome))
        except LeaseLost as exc:
            _log_lost(exc, "task %s: lease lost before its outcome was saved", record.task_id)

    async def _settle(
        self, held: _Held, spec: FlowSpec, convert: ConvertResult, journal: Journal, outcome: Outcome
    ) -> None:
        settled = settle(spec, convert, outcome, held.record.task_id)  # shared with every engine
        # The journal goes with every final write: it may hold steps not yet checkpointed.
        encoded = journal_codec.encode(journal)
        if settled.status != "working":
            await self._finish(held, journal=encoded, consumed=journal.steps, **settled.changes())
            return
        # Parked on waits: give the task up until its earliest due time, or until an event it
        # waits for arrives (`_inbox.deliver` makes it claimable then).
        wake_at = settled.wake_at
        if wake_at is not None and held.record.expires_at is not None and wake_at > held.record.expires_at:
            logger.warning(
                "task %s: it waits past its TTL and will be gone before it wakes; raise task_ttl", held.record.task_id
            )
        await self._finish(
            held,
            journal=encoded,
            consumed=journal.steps,
            wake_at=WAIT_FOREVER if wake_at is None else wake_at,
            **settled.changes(),
        )
        if held.record.lease_until == 0.0:  # an event it waits for came while it ran: run again
            self._again.add(held.record.task_id)
        else:
            self._wake_scanner()  # the scanner re-reads the next wake time

    async def _status(self, held: _Held, message: str) -> None:
        """The flow's latest progress report as the task's status message (`ctx.report_progress`), told to listeners.

        Only while the task is `working`: a run does not report once it has settled.
        """
        if held.final or held.record.status != "working" or held.record.status_message == message:
            return
        await self._write(held, status_message=message)
        await self.context.report(held.record)

    async def _heartbeat(self, held: _Held, run: asyncio.Task[Any] | None) -> None:
        interval = min(1.0, self.context.lease / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._write(held)
            except (LeaseLost, StoreUnavailable):
                # Not renewed before it ran out: another worker may claim the task now, so this
                # one stops working it (the version check would refuse its writes anyway).
                held.lease_lost = True
                if run is not None:
                    run.cancel()
                return
            if held.record.cancel_requested and not held.cancel_seen:
                held.cancel_seen = True
                if run is not None:
                    run.cancel()

    async def _leave(self, held: _Held) -> None:
        """A task of a flow (or journal format) this instance does not know: give it back, untouched.

        During a rolling upgrade the instance that knows it (older or newer code) claims it
        next; this one does not try again for a while. Never failed: nothing is wrong with it.
        """
        task_id = held.record.task_id
        logger.warning(
            "task %s: flow %r (or its journal format) is unknown to this instance; leaving it for one that knows it",
            task_id,
            held.record.flow,
        )
        now = self.context.now()
        if len(self._foreign) > 1024:
            self._foreign = {k: until for k, until in self._foreign.items() if until > now}
        self._foreign[task_id] = now + _FOREIGN_BACKOFF
        with contextlib.suppress(LeaseLost):
            await self._write(held, release=True)

    async def _cancel_requested(self, held: _Held) -> bool:
        fresh = await self.context.store.load(held.record.task_id, self.context.now())
        return fresh is not None and fresh.cancel_requested

    async def _write(
        self,
        held: _Held,
        *,
        release: bool = False,
        wake_at: float | None = None,
        consumed: dict[str, tuple[str, Any]] | None = None,
        **changes: Any,
    ) -> None:
        """Save our fields over the freshest record while we still own the lease.

        `release` gives the lease up (`wake_at`: no claim before then, a parked run's due
        time); `consumed` (the run's journal steps) takes the events the run consumed out of
        the inbox, re-read from the freshest record on every attempt so no delivery is lost.
        """
        pause = _STORE_RETRY[0]
        started = self.context.now()
        conflicts = 0
        while conflicts < 20:
            try:
                await self._write_once(held, release, wake_at, consumed, changes)
                return
            except _Conflict:
                conflicts += 1
                continue
            except StoreUnavailable:
                # Keep trying while the lease is still ours (the store may be back in a moment);
                # past it, another worker may own the task: stop. A final write is fenced by
                # the version check whoever claims meanwhile, so it keeps trying a while longer.
                now = self.context.now()
                limit = started + _FINAL_WRITE_FOR if held.final else held.record.lease_until - pause
                if now + pause >= limit:
                    if held.final:
                        raise
                    raise LeaseLost(STORE_DOWN) from None
                await asyncio.sleep(pause)
                pause = min(pause * 2, _STORE_RETRY[1])
        raise LeaseLost

    async def _write_once(
        self,
        held: _Held,
        release: bool,
        wake_at: float | None,
        consumed: dict[str, tuple[str, Any]] | None,
        changes: dict[str, Any],
    ) -> None:
        """One compare-and-set of `_write`; `_Conflict` when another write came first (merged)."""
        now = self.context.now()
        if release:
            lease = {"lease_owner": None, "lease_until": 0.0 if wake_at is None else wake_at}
        else:
            lease = {"lease_until": now + self.context.lease}
        candidate = held.record.copy(**changes, **lease, updated_at=now)
        if consumed is not None:
            candidate = settle_inbox(candidate, consumed, now)
        ran = list(held.ran)
        if ran:
            attempt = candidate.attempt
            history = [*candidate.history, *({"attempt": attempt} | entry for entry in ran)]
            candidate = candidate.copy(history=history[-HISTORY_KEPT:])
        if await self.context.store.save(candidate):
            held.record = candidate
            del held.ran[: len(ran)]
            return
        fresh = await self.context.store.load(held.record.task_id, now)
        if fresh is None or fresh.lease_owner != self.worker_id or fresh.terminal:
            raise LeaseLost
        held.record = fresh  # someone else wrote (an update, a cancel request): merge and retry
        raise _Conflict

    async def _finish(self, held: _Held, *, status: str, **changes: Any) -> None:
        """Record where this run ended and give up the lease in the same write."""
        defaults: dict[str, Any] = {"input_requests": {}, "waiting": [], "status_message": None}
        previous = held.record.status
        await self._write(held, release=True, status=status, responses={}, **(defaults | changes))
        tracing.task_status(held.record.task_id, held.record.flow, status, held.record.status_message, previous)
        await self.context.report(held.record)


class _RunWaits:
    """What one run of a task lends its flow's durable waits: the store clock, the task's inbox
    (as this worker last read it), and callback URLs bound to the task."""

    def __init__(self, context: LeaseContext, held: _Held) -> None:
        self._context = context
        self._held = held

    def now(self) -> float:
        return self._context.now()

    def take_event(self, name: str, taken: Collection[str]) -> tuple[str, Any] | None:
        for event in self._held.record.inbox:
            if event.get("name") == name and event.get("id") not in taken:
                return str(event["id"]), event.get("data")
        return None

    def callback_url(self, name: str, expires_at: float) -> str:
        callbacks = self._context.callbacks
        if callbacks is None:
            raise FlowDefinitionError(
                "ctx.callback_url() needs the fleet's public base URL: Flows(server, public_url='https://...')"
            )
        return callbacks.mint(self._held.record.task_id, name, expires_at)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _landing(final_write: Awaitable[None]) -> None:
    """The run's final write, carried to its end (bounded) even if the instance shuts down meanwhile."""
    write = asyncio.ensure_future(final_write)
    try:
        await asyncio.shield(write)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(write), _LAND_WAIT)
        raise


def _log_lost(exc: BaseException, message: str, task_id: str) -> None:
    """A lost lease, at WARNING; at DEBUG when the store's outage took it (the store logs that once)."""
    quiet = isinstance(exc, StoreUnavailable) or (isinstance(exc, LeaseLost) and exc.args == (STORE_DOWN,))
    logger.log(logging.DEBUG if quiet else logging.WARNING, message, task_id)


class _Conflict(Exception):
    """Another write came between our read and our compare-and-set: merge and try again."""


async def _quietly(claim: Awaitable[bool]) -> bool | None:
    """A claim made outside the scanner: a store that does not answer leaves it to the next scan."""
    try:
        return await claim
    except StoreUnavailable:
        return None


class _Held:
    """The freshest record this worker wrote or saw, for compare-and-set."""

    def __init__(self, record: TaskRecord) -> None:
        self.record = record
        self.lease_lost = False
        """The heartbeat could not renew the lease in time: the run stops without writing."""
        self.final = False
        """The run's final write is under way (fenced by the version check, not the lease)."""
        self.cancel_seen = False
        self.ran: list[HistoryEntry] = []
        """Steps this run ran that no write has stored in the task's history yet."""


__all__ = ["LeaseLost", "TaskWorker"]
