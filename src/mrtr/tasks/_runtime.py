"""The task runtime: runs durable flows under a lease, resumes them anywhere, survives death.

A task is a flow whose journal lives in a `TaskStore` instead of `requestState`. The
instance that creates a task runs it at once, holding a lease it renews while the flow
runs; every finished step is checkpointed to the store before the flow's next step runs or
it waits on anything, or with the run's last write (`mrtr.tasks._checkpoints`). When
the flow asks, the task parks in `input_required`; `tasks/update` answers make it
`working` again, and whichever instance claims it next replays the flow from the journal.
If a worker dies, its lease runs out and another instance's scanner claims the task and
replays it: finished steps return from the journal; the step that was interrupted runs
again, under the same idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.request_state import authenticated_principal
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, ClientCapabilities

from mrtr._engine import journal as journal_codec
from mrtr._engine import metrics, tracing
from mrtr._engine.engine import Outcome, RunOptions, as_protocol_error, check_deadline, execute
from mrtr._engine.journal import Journal, JournalFormatError, JournalFromNewerVersion
from mrtr._engine.spec import FlowSpec
from mrtr._errors import FlowDefinitionError, FlowError
from mrtr.stores import TaskExists, TaskRecord, TaskStore
from mrtr.stores._base import HISTORY_KEPT, WAIT_FOREVER
from mrtr.tasks._admin import cancel_change
from mrtr.tasks._callbacks import CallbackUrls
from mrtr.tasks._checkpoints import Checkpoints
from mrtr.tasks._inbox import deliver, new_event, settle_inbox
from mrtr.tasks._outcome import settle
from mrtr.tasks._records import created_result, keyed_task_id, owner_tag
from mrtr.tasks._seam import ConvertResult, Creator, EngineOptions, PrincipalBinder, StateChanges, busy

logger = tracing.get_logger("mrtr.tasks.runtime")

_CLOCK_SYNC_EVERY = 10  # scans between re-reads of the store's clock
_FOREIGN_BACKOFF = 30.0  # seconds before this instance looks again at a task it cannot run
_LAND_WAIT = 2.0  # seconds a shutting-down run waits for its finished steps' checkpoint


class LeaseLost(BaseException):
    """Another worker owns this task now (our lease ran out); stop without writing.

    A control-flow signal, raised through the flow (from a step's checkpoint): a
    `BaseException`, so a flow's `except Exception` cannot swallow it and carry on.
    """


_SCAN_BATCH = 32
"""Tasks one scan claims at most; a full batch makes the scanner look again at once."""

_CAS_RETRIES = 20
"""Compare-and-set attempts of one `update` or `cancel` before it reports the task busy."""


class TaskRuntime(StateChanges):
    """Creates, runs, resumes and cancels the durable flows of one server instance.

    The default `mrtr.tasks.TaskEngine`. Every change (`update`, `cancel`, a worker's
    progress) is a compare-and-set on the stored record, retried when another instance
    wrote in between, so any instance sharing the store serves any task.

    Args:
        store: Where tasks live; share it across the fleet.
        lease: Seconds a worker may go silent before another instance takes its task over.
        ttl: Seconds a task stays readable after creation (`None`: forever).
        poll_interval: Seconds clients are told to wait between `tasks/get` polls.
        scan_interval: Seconds between this instance's looks for orphaned work.
        bind_principal: Who sent a request (the SDK's `RequestStateSecurity.bind_principal`,
            by default the authenticated client/issuer/subject); tasks belong to it.

    Leases are compared on the store's clock (Redis `TIME`, PostgreSQL `clock_timestamp()`,
    the SQLite host's clock): `now()` is this host's clock plus an offset re-measured
    against the store every few scans, so a worker whose wall clock is off by minutes
    still honours other workers' leases (error: half a store round trip plus the drift
    between two measurements).
    """

    def __init__(
        self,
        store: TaskStore,
        *,
        lease: float = 10.0,
        ttl: float | None = 3600.0,
        poll_interval: float = 0.5,
        scan_interval: float = 1.0,
        bind_principal: PrincipalBinder | None = None,
    ) -> None:
        self.store = store
        self.bind_principal = bind_principal or authenticated_principal
        self.local_clock: Callable[[], float] = time.time
        """This host's wall clock (replaceable in tests to simulate a skewed host)."""
        self.clock_offset = 0.0
        self._clock_synced = False
        self.lease = lease
        self.ttl_ms = None if ttl is None else int(ttl * 1000)
        self.poll_interval_ms = max(1, int(poll_interval * 1000))
        self.scan_interval = scan_interval
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.flows: dict[str, tuple[FlowSpec, ConvertResult]] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._foreign: dict[str, float] = {}
        """Tasks of flows this instance does not serve: task id -> when to look again."""
        self._scanner: asyncio.Task[None] | None = None
        self._again: set[str] = set()
        self._claims: set[asyncio.Task[bool]] = set()
        self._waiter: asyncio.Future[None] | None = None
        """The scanner's pause; released early when this instance parks a task on a timer."""
        self.callbacks: CallbackUrls | None = None
        """Mints `ctx.callback_url` URLs (`Flows(public_url=...)` sets it)."""

    def register(self, spec: FlowSpec, convert: ConvertResult) -> None:
        self.flows[spec.name] = (spec, convert)

    @property
    def shared_store(self) -> TaskStore:
        return self.store

    def configure(self, options: EngineOptions) -> None:
        """Only the callback URLs: a `TaskRuntime` you built keeps the other options you built it with."""
        self.callbacks = options.callbacks

    # -- the TaskEngine seam: read, answer and cancel over the store -------------------------

    def ensure_running(self) -> None:
        self.ensure_scanning()

    async def get(self, task_id: str) -> TaskRecord | None:
        return await self.store.load(task_id, self.now())

    async def update(
        self, task_id: str, answers: Mapping[str, Any], asked: Mapping[str, Any], known: TaskRecord | None = None
    ) -> None:
        record = known if known is not None else await self.get(task_id)
        for _ in range(_CAS_RETRIES):
            if record is None:
                return
            outstanding = record.input_requests if record.status == "input_required" else {}
            accepted = {k: v for k, v in answers.items() if k in outstanding and outstanding[k] == asked.get(k)}
            if not accepted:
                return
            remaining = {k: v for k, v in outstanding.items() if k not in accepted}
            changed = record.copy(
                responses=record.responses | accepted,
                input_requests=remaining,
                status="input_required" if remaining else "working",
                updated_at=self.now(),
            )
            if await self.store.save(changed):
                if not remaining:
                    tracing.task_status(task_id, record.flow, "working", previous=record.status)
                await self.changed(changed)
                if not remaining:
                    await self.try_claim(changed.task_id)  # resume here, at once
                return
            record = await self.get(task_id)
        raise busy("update")

    async def cancel(self, task_id: str, known: TaskRecord | None = None) -> None:
        record = known if known is not None else await self.get(task_id)
        for _ in range(_CAS_RETRIES):
            if record is None:
                return
            changed, running_somewhere = cancel_change(record, self.now())  # shared with TaskAdmin
            if changed is None:
                return  # idempotent, also on finished tasks
            if await self.store.save(changed):
                if not running_somewhere:
                    tracing.task_status(record.task_id, record.flow, "cancelled", previous=record.status)
                await self.changed(changed)
                if running_somewhere:
                    self.cancel_local(record.task_id)  # elsewhere: its heartbeat sees the flag
                return
            record = await self.get(task_id)
        raise busy("cancel")

    async def send_event(self, task_id: str, name: str, payload: Any, *, event_id: str | None = None) -> bool:
        """Deliver event `name` to the task (see `mrtr.tasks._inbox`); resume it here if it waits for it.

        Returns False when `event_id` was delivered before (nothing changes: idempotent).

        Raises:
            EventNotDelivered: Unknown or expired task, a finished one, or a full inbox.
            ValueError: A malformed name, a payload that is not JSON or too large.
        """
        if not self._clock_synced:
            await self.sync_clock()
        event = new_event(name, payload, event_id, self.now())
        delivered, record = await deliver(self.store, task_id, event, self.now())
        if delivered and record.lease_until == 0.0 and record.status == "working":
            await self.changed(record)
            if record.flow in self.flows:
                await self.try_claim(task_id)  # resume it here, at once
        return delivered

    # -- time and principals ---------------------------------------------------------------

    def now(self) -> float:
        """Epoch seconds on the store's clock, as last measured (see the class docstring)."""
        return self.local_clock() + self.clock_offset

    async def sync_clock(self) -> None:
        """Measure this host's offset from the store's clock (stores without `clock()`: none)."""
        read = getattr(self.store, "clock", None)
        if read is None:
            self._clock_synced = True
            return
        before = self.local_clock()
        store_time = await read()
        after = self.local_clock()
        self.clock_offset = store_time - (before + after) / 2
        self._clock_synced = True

    def owner_of(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The owner tag of the request's principal (None when unauthenticated)."""
        return owner_tag(self.bind_principal(ctx))

    # -- creation ------------------------------------------------------------------------

    async def start(
        self,
        spec: FlowSpec,
        arguments: Any,
        capabilities: ClientCapabilities | None,
        journal: Journal,
        request: ServerRequestContext[Any, Any] | None = None,
    ) -> dict[str, Any]:
        """Durably create a task for this call and start running it here; returns `CreateTaskResult`.

        With an idempotency key (`params._meta["mrtr/idempotencyKey"]`), the task id is
        derived from (creator, tool, key), so a resend after a lost response finds the task
        the first attempt created (the store's atomic `create` decides, fleet-wide) and gets
        its `CreateTaskResult` instead of a second task.
        """
        if not self._clock_synced:
            await self.sync_clock()
        now = self.now()
        who = Creator.of(self, request)
        key = who.idempotency_key
        journal.pending = {}
        record = TaskRecord(
            task_id=secrets.token_urlsafe(18) if key is None else keyed_task_id(who.owner, spec.name, key),
            flow=spec.name,
            arguments=dict(arguments),
            capabilities=capabilities.model_dump(mode="json", by_alias=True, exclude_none=True) if capabilities else {},
            status="working",
            created_at=now,
            updated_at=now,
            ttl_ms=self.ttl_ms,
            poll_interval_ms=self.poll_interval_ms,
            journal=journal_codec.encode(journal),
            lease_owner=self.worker_id,
            lease_until=now + self.lease,
            owner=who.owner,
        )
        for _ in range(3):  # a keyed task that expires between `create` and `load`: create again
            try:
                await self.store.create(record)  # durable before the client hears of it
            except TaskExists:
                if key is None:
                    raise
                existing = await self.store.load(record.task_id, self.now())
                if existing is None:
                    continue
                if existing.arguments != record.arguments:
                    raise MCPError(
                        code=INVALID_PARAMS,
                        message="mrtr/idempotencyKey was already used for a call with other arguments",
                        data={"reason": "idempotency_key_reused"},
                    ) from None
                return created_result(existing).wire()
            tracing.task_status(record.task_id, spec.name, "working")
            self._launch(record)  # first: the run starts while the answer and the notification go out
            await self.changed(record)
            self.ensure_scanning()
            return created_result(record).wire()
        raise MCPError(code=INTERNAL_ERROR, message="the task's id kept colliding with an expiring task; call again")

    # -- scanning for orphaned or resumable work -----------------------------------------

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
                    await self.sync_clock()
                launched = await self.scan_once()
                await metrics.refresh_task_counts(self.store, self.now())  # the `mrtr.tasks` gauge
                scans += 1
                if scans % 60 == 0:
                    await self.store.purge_expired(self.now())
                pause = 0.0 if launched >= _SCAN_BATCH else await self._until_next_wake()
            except asyncio.CancelledError:
                raise
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

        One indexed read (`TaskStore.next_wake`) per scan, however many tasks sleep: a
        timer wakes within a store round trip of its due time, with no per-task polling.
        """
        next_wake = getattr(self.store, "next_wake", None)
        if next_wake is None:
            return self.scan_interval
        now = self.now()
        due: float | None = await next_wake(now)
        if due is None:
            return self.scan_interval
        return min(self.scan_interval, max(0.0, due - now))

    async def scan_once(self) -> int:
        """Claim and launch every task whose lease has run out; returns how many."""
        launched = 0
        now = self.now()
        for task_id in await self.store.claimable(now, limit=_SCAN_BATCH):
            if self._foreign.get(task_id, 0.0) > now:
                continue
            if task_id not in self._running and await self.try_claim(task_id):
                launched += 1
        return launched

    async def try_claim(self, task_id: str) -> bool:
        now = self.now()
        record = await self.store.load(task_id, now)
        if record is None or not record.claimable or record.lease_until >= now or task_id in self._running:
            return False
        claimed = record.copy(lease_owner=self.worker_id, lease_until=now + self.lease, updated_at=now)
        if not await self.store.save(claimed):
            return False
        self._launch(claimed)
        return True

    def _launch(self, record: TaskRecord) -> None:
        task_id = record.task_id
        run = asyncio.get_running_loop().create_task(self._run(record))
        self._running[task_id] = run
        run.add_done_callback(lambda _: self._ended(task_id))

    def _ended(self, task_id: str) -> None:
        self._running.pop(task_id, None)
        if task_id in self._again:  # woken while it ran (an event it now waits for): claim it again
            self._again.discard(task_id)
            claim = asyncio.get_running_loop().create_task(self.try_claim(task_id))
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

    async def _run(self, record: TaskRecord) -> None:
        tracing.bind_task(record.task_id)
        held = _Held(record)
        entry = self.flows.get(record.flow)
        try:
            journal = journal_codec.decode(record.journal)
            capabilities = ClientCapabilities.model_validate(record.capabilities) if record.capabilities else None
        except JournalFromNewerVersion:
            entry = None
        except (JournalFormatError, ValueError) as exc:
            # A record this server cannot read (e.g. written by an incompatible version):
            # fail it once, clearly, rather than have every instance retry it forever.
            logger.error("task %s: unreadable record: %s", record.task_id, exc)
            error = {"code": INTERNAL_ERROR, "message": "this server cannot read the task's journal"}
            await self._finish(held, status="failed", error=error)
            return
        if entry is None:
            await self._leave(held)
            return
        spec, convert = entry

        checkpoints = Checkpoints(lambda: self._write(held, journal=journal_codec.encode(journal)))
        held.ran = checkpoints.ran  # every write of this run takes the steps it ran into the history
        waits = _RunWaits(self, held)

        try:
            check_deadline(spec, journal)  # as inline: counted from the first round, never renewed
        except FlowError as exc:
            error = as_protocol_error(spec, exc).error.model_dump(mode="json", exclude_none=True)
            await self._finish(held, status="failed", error=error)
            return
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(held, asyncio.current_task()))
        try:
            outcome = await execute(
                spec,
                journal,
                record.responses,
                capabilities,
                record.arguments,
                RunOptions(checkpoint=checkpoints, waits=waits),
            )
        except asyncio.CancelledError:
            heartbeat.cancel()
            if held.cancel_seen or await self._cancel_requested(held):
                with contextlib.suppress(LeaseLost):
                    await checkpoints.settle()
                await self._finish(held, status="cancelled", journal=journal_codec.encode(journal))
                return
            await checkpoints.land(_LAND_WAIT)  # finished steps are kept, not run again
            raise  # shutting down: leave the lease to run out so another instance resumes
        except LeaseLost:
            checkpoints.abandon()
            logger.warning("task %s: lease lost to another worker; stopping", record.task_id)
            return
        finally:
            heartbeat.cancel()
        try:
            await checkpoints.settle()  # a write in flight lands first; the final write carries the rest
            await _landing(self._settle(held, spec, convert, journal, outcome))
        except LeaseLost:
            logger.warning("task %s: lease lost before its outcome was saved", record.task_id)

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

    async def _heartbeat(self, held: _Held, run: asyncio.Task[Any] | None) -> None:
        interval = min(1.0, self.lease / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._write(held)
            except LeaseLost:
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
        now = self.now()
        if len(self._foreign) > 1024:
            self._foreign = {k: until for k, until in self._foreign.items() if until > now}
        self._foreign[task_id] = now + _FOREIGN_BACKOFF
        with contextlib.suppress(LeaseLost):
            await self._write(held, release=True)

    async def _cancel_requested(self, held: _Held) -> bool:
        fresh = await self.store.load(held.record.task_id, self.now())
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
        for _ in range(20):
            now = self.now()
            if release:
                lease = {"lease_owner": None, "lease_until": 0.0 if wake_at is None else wake_at}
            else:
                lease = {"lease_until": now + self.lease}
            candidate = held.record.copy(**changes, **lease, updated_at=now)
            if consumed is not None:
                candidate = settle_inbox(candidate, consumed, now)
            ran = list(held.ran)
            if ran:
                attempt = candidate.attempt
                history = [*candidate.history, *({"attempt": attempt} | entry for entry in ran)]
                candidate = candidate.copy(history=history[-HISTORY_KEPT:])
            if await self.store.save(candidate):
                held.record = candidate
                del held.ran[: len(ran)]
                return
            fresh = await self.store.load(held.record.task_id, now)
            if fresh is None or fresh.lease_owner != self.worker_id or fresh.terminal:
                raise LeaseLost
            held.record = fresh  # someone else wrote (an update, a cancel request): merge and retry
        raise LeaseLost

    async def _finish(self, held: _Held, *, status: str, **changes: Any) -> None:
        """Record where this run ended and give up the lease in the same write."""
        defaults: dict[str, Any] = {"input_requests": {}, "waiting": [], "status_message": None}
        previous = held.record.status
        await self._write(held, release=True, status=status, responses={}, **(defaults | changes))
        tracing.task_status(held.record.task_id, held.record.flow, status, held.record.status_message, previous)
        await self.changed(held.record)


class _RunWaits:
    """What one run of a task lends its flow's durable waits: the store clock, the task's inbox
    (as this worker last read it), and callback URLs bound to the task."""

    def __init__(self, runtime: TaskRuntime, held: _Held) -> None:
        self._runtime = runtime
        self._held = held

    def now(self) -> float:
        return self._runtime.now()

    def take_event(self, name: str, taken: Collection[str]) -> tuple[str, Any] | None:
        for event in self._held.record.inbox:
            if event.get("name") == name and event.get("id") not in taken:
                return str(event["id"]), event.get("data")
        return None

    def callback_url(self, name: str, expires_at: float) -> str:
        callbacks = self._runtime.callbacks
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


class _Held:
    """The freshest record this worker wrote or saw, for compare-and-set."""

    def __init__(self, record: TaskRecord) -> None:
        self.record = record
        self.cancel_seen = False
        self.ran: list[dict[str, Any]] = []
        """Steps this run ran that no write has stored in the task's history yet."""


__all__ = [
    "LeaseLost",
    "TaskRuntime",
]
