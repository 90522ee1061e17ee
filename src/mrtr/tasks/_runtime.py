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

import time
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.request_state import authenticated_principal
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, ClientCapabilities

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr._engine.spec import FlowSpec
from mrtr._telemetry import tracing
from mrtr.stores import TaskExists, TaskRecord, TaskStore
from mrtr.stores._abilities import load_many
from mrtr.stores._sealed import RecordSeal, RecordSealed, SealedStore
from mrtr.tasks._admin import cancel_change
from mrtr.tasks._callbacks import CallbackUrls
from mrtr.tasks._inbox import deliver, new_event
from mrtr.tasks._records import created_result, keyed_task_id, new_task_id, owner_tag
from mrtr.tasks._seam import ConvertResult, Creator, EngineOptions, PrincipalBinder, StateChanges, TaskView, busy
from mrtr.tasks._worker import TaskWorker

logger = tracing.get_logger("mrtr.tasks.runtime")


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
        seal: Seal every record's payload at rest with this key ring (`mrtr.stores.RecordSeal`);
            `Flows` gives the server's own unless `seal_at_rest=False`. None: plain records.

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
        seal: RecordSeal | None = None,
    ) -> None:
        self.plain_store = store
        """The store as given (its records' payload sealed or not): what the fleet shares."""
        self.seal: RecordSeal | None = seal
        # Without a ring of its own the runtime still goes through `SealedStore`: it writes plain
        # records, and refuses (`RecordSealed`) a sealed one it cannot open rather than run its
        # flow from an empty journal or write an event beside a payload it cannot see.
        self.store: TaskStore = SealedStore(store, seal or RecordSeal(None))
        """The store this runtime reads and writes through: sealing on the way in and out, if any."""
        self.bind_principal = bind_principal or authenticated_principal
        self.local_clock: Callable[[], float] = time.time
        """This host's wall clock (replaceable in tests to simulate a skewed host)."""
        self.clock_offset = 0.0
        self._clock_synced = False
        self.lease = lease
        self.ttl_ms = None if ttl is None else int(ttl * 1000)
        self.poll_interval_ms = max(1, int(poll_interval * 1000))
        self.flows: dict[str, tuple[FlowSpec, ConvertResult]] = {}
        self.worker = TaskWorker(self, scan_interval)
        """This instance's scanner and runs (`mrtr.tasks._worker`)."""
        self.callbacks: CallbackUrls | None = None
        """Mints `ctx.callback_url` URLs (`Flows(public_url=...)` sets it)."""

    def register(self, spec: FlowSpec, convert: ConvertResult) -> None:
        self.flows[spec.name] = (spec, convert)

    def use_seal(self, seal: RecordSeal) -> None:
        """Seal records at rest from now on: every read opens (plain records too), every write seals."""
        self.seal = seal
        self.store = SealedStore(self.plain_store, seal)

    @property
    def shared_store(self) -> TaskStore:
        return self.plain_store

    def configure(self, options: EngineOptions) -> None:
        """The callback URLs, and the server's key ring to seal records with unless built with one:
        a `TaskRuntime` you built keeps the other options you built it with."""
        self.callbacks = options.callbacks
        if self.seal is None and options.seal is not None:
            self.use_seal(options.seal)

    # -- the TaskEngine seam: read, answer and cancel over the store -------------------------

    def ensure_running(self) -> None:
        self.ensure_scanning()

    async def get(self, task_id: str) -> TaskRecord | None:
        try:
            return await self.store.load(task_id, self.now())
        except RecordSealed as exc:
            # A deployment problem (this instance's ring lacks the key the task was sealed
            # with), not the client's: logged here, and retryable, since another instance may
            # hold the key. Never an empty task shown as if it were the task.
            logger.warning("%s; answering a retryable error", exc)
            raise MCPError(
                code=INTERNAL_ERROR,
                message="this task cannot be read on this server instance; retry",
                data={"reason": "task_sealed"},
            ) from None

    async def get_many(self, task_ids: list[str]) -> list[TaskRecord | None]:
        """`get` of each id, read in as few store round trips as the store allows."""
        try:
            return await load_many(self.store, task_ids, self.now())
        except RecordSealed as exc:
            logger.warning("%s; answering a retryable error", exc)
            raise MCPError(
                code=INTERNAL_ERROR,
                message="this task cannot be read on this server instance; retry",
                data={"reason": "task_sealed"},
            ) from None

    async def update(
        self, task_id: str, answers: Mapping[str, Any], asked: Mapping[str, Any], known: TaskView | None = None
    ) -> None:
        record = known if isinstance(known, TaskRecord) else await self.get(task_id)
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
                    await self.worker.try_claim(changed.task_id)  # resume here, at once
                return
            record = await self.get(task_id)
        raise busy("update")

    async def cancel(self, task_id: str, known: TaskView | None = None) -> None:
        record = known if isinstance(known, TaskRecord) else await self.get(task_id)
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
                    self.worker.cancel_local(record.task_id)  # elsewhere: its heartbeat sees the flag
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
                await self.worker.try_claim(task_id)  # resume it here, at once
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
            task_id=new_task_id() if key is None else keyed_task_id(who.owner, spec.name, key),
            flow=spec.name,
            arguments=dict(arguments),
            capabilities=capabilities.model_dump(mode="json", by_alias=True, exclude_none=True) if capabilities else {},
            status="working",
            created_at=now,
            updated_at=now,
            ttl_ms=self.ttl_ms,
            poll_interval_ms=self.poll_interval_ms,
            journal=journal_codec.encode(journal),
            lease_owner=self.worker.worker_id,
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
            self.worker.launch(record)  # first: the run starts while the answer and the notification go out
            await self.changed(record)
            self.ensure_scanning()
            return created_result(record).wire()
        raise MCPError(code=INTERNAL_ERROR, message="the task's id kept colliding with an expiring task; call again")

    def ensure_scanning(self) -> None:
        """Start this instance's background scanner (idempotent; needs a running loop)."""
        self.worker.ensure_scanning()

    async def close(self) -> None:
        """Stop the scanner and this instance's runs (their leases lapse: another instance resumes)."""
        await self.worker.close()


__all__ = ["TaskRuntime"]
