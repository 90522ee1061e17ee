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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from mrtr._engine.spec import FlowSpec
from mrtr._telemetry import tracing
from mrtr._wire import CreateTaskResult, InputRequests, Wait
from mrtr.stores import TaskExists, TaskRecord, TaskStore
from mrtr.stores._abilities import load_many
from mrtr.stores._sealed import RecordSealed
from mrtr.tasks._admin import cancel_change
from mrtr.tasks._inbox import deliver, new_event
from mrtr.tasks._lease import LeaseContext, Wake
from mrtr.tasks._seam import ANONYMOUS, ConvertResult, Creator, EngineBase, EngineOptions, TaskCall, busy
from mrtr.tasks._start import NewTask
from mrtr.tasks._worker import TaskWorker

logger = tracing.get_logger("mrtr.tasks.runtime")


_CAS_RETRIES = 20
"""Compare-and-set attempts of one `update` or `cancel` before it reports the task busy."""


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """A task as the lease runtime shows it (`TaskRuntime.get`): what `tasks/get`, listens and
    the wire layer read of it, not the stored row (no journal, lease, inbox or history)."""

    task_id: str
    flow: str
    status: str
    status_message: str | None
    created_at: float
    updated_at: float
    ttl_ms: int | None
    poll_interval_ms: int
    input_requests: InputRequests
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    waiting: list[Wait]
    owner: str | None
    version: int
    row: TaskRecord = field(repr=False, compare=False)
    """The row it was read from: the runtime's own, the compare-and-set base of an `update` or
    `cancel` handed this snapshot (`known=`), so they need no second read."""

    @classmethod
    def of(cls, row: TaskRecord) -> TaskSnapshot:
        return cls(
            task_id=row.task_id,
            flow=row.flow,
            status=row.status,
            status_message=row.status_message,
            created_at=row.created_at,
            updated_at=row.updated_at,
            ttl_ms=row.ttl_ms,
            poll_interval_ms=row.poll_interval_ms,
            input_requests=row.input_requests,
            result=row.result,
            error=row.error,
            waiting=row.waiting,
            owner=row.owner,
            version=row.version,
            row=row,
        )


class TaskRuntime(EngineBase):
    """Creates, runs, resumes and cancels the durable flows of one server instance.

    The default `mrtr.tasks.TaskEngine`. Every change (`update`, `cancel`, a worker's
    progress) is a compare-and-set on the stored record, retried when another instance
    wrote in between, so any instance sharing the store serves any task.

    Args:
        store: Where tasks live; share it across the fleet.
        options: The task options (`EngineOptions`: lease, TTL, poll and scan intervals,
            principal binding, callback URLs, and the key ring that seals records at rest;
            `Flows` gives the server's own unless `seal_at_rest=False`). Default: the defaults.

    Leases are compared on the store's clock (`LeaseContext.now`), re-measured against the
    store every few scans, so a worker whose wall clock is off by minutes still honours other
    workers' leases. The runtime and its worker share one `LeaseContext` (`context`); the
    runtime wakes the worker through `wake` and never the other way round.
    """

    def __init__(self, store: TaskStore, options: EngineOptions | None = None) -> None:
        self.options = options = options or EngineOptions()
        self.context = LeaseContext(
            store, lease=options.lease, seal=options.seal, report=self.changed, callbacks=options.callbacks
        )
        """The store, clock, lease and flows this runtime shares with its worker."""
        self.worker = TaskWorker(self.context, options.scan_interval)
        """This instance's scanner and runs (`mrtr.tasks._worker`)."""
        self.wake: Wake = self.worker.try_claim
        """Resume a task here, now, if it is claimable (after the answer or event it waited for)."""

    def register(self, spec: FlowSpec, convert: ConvertResult) -> None:
        self.context.flows[spec.name] = (spec, convert)

    @property
    def flows(self) -> dict[str, tuple[FlowSpec, ConvertResult]]:
        """The flows this instance serves, by name."""
        return self.context.flows

    @property
    def store(self) -> TaskStore:
        """The store this runtime reads and writes through: sealing on the way in and out, if any."""
        return self.context.store

    @property
    def shared_store(self) -> TaskStore:
        return self.context.plain_store

    def configure(self, options: EngineOptions) -> None:
        """The callback URLs, and the server's key ring to seal records with unless built with one:
        a `TaskRuntime` you built keeps the other options you built it with."""
        seal = self.options.seal or options.seal
        self.options = replace(self.options, callbacks=options.callbacks, seal=seal)
        self.context.callbacks = options.callbacks
        if self.context.seal is None and seal is not None:
            self.context.use_seal(seal)

    # -- the TaskEngine seam: read, answer and cancel over the store -------------------------

    def ensure_running(self) -> None:
        self.worker.ensure_scanning()

    async def get(self, task_id: str) -> TaskSnapshot | None:
        row = await self._load(task_id)
        return None if row is None else TaskSnapshot.of(row)

    async def get_many(self, task_ids: list[str]) -> list[TaskSnapshot | None]:
        """`get` of each id, read in as few store round trips as the store allows."""
        try:
            rows = await load_many(self.context.store, task_ids, self.context.now())
        except RecordSealed as exc:
            raise _sealed(exc) from None
        return [None if row is None else TaskSnapshot.of(row) for row in rows]

    async def _load(self, task_id: str) -> TaskRecord | None:
        try:
            return await self.context.store.load(task_id, self.context.now())
        except RecordSealed as exc:
            raise _sealed(exc) from None

    async def update(
        self, task_id: str, answers: Mapping[str, Any], asked: Mapping[str, Any], known: TaskSnapshot | None = None
    ) -> None:
        record = known.row if known is not None else await self._load(task_id)
        for _ in range(_CAS_RETRIES):
            if record is None:
                return
            outstanding = record.input_requests if record.status == "input_required" else {}
            accepted = {k: v for k, v in answers.items() if k in outstanding and outstanding[k] == asked.get(k)}
            if not accepted:
                return
            remaining = {k: v for k, v in outstanding.items() if k not in accepted}
            now = self.context.now()
            # Resumed here: the same write takes the lease for this instance (`wake` then runs it).
            lease = {} if remaining else self.worker.lease_for(record, now)
            changed = record.copy(
                responses=record.responses | accepted,
                input_requests=remaining,
                status="input_required" if remaining else "working",
                updated_at=now,
                **lease,
            )
            if await self.context.store.save(changed):
                if not remaining:
                    tracing.task_status(task_id, record.flow, "working", previous=record.status)
                await self.changed(changed)
                if not remaining:
                    self.worker.saw(changed)  # the claim starts from this write, not a read of it
                    await self.wake(changed.task_id)  # resume here, at once
                return
            record = await self._load(task_id)
        raise busy("update")

    async def cancel(self, task_id: str, known: TaskSnapshot | None = None) -> None:
        record = known.row if known is not None else await self._load(task_id)
        for _ in range(_CAS_RETRIES):
            if record is None:
                return
            changed, running_somewhere = cancel_change(record, self.context.now())  # shared with TaskAdmin
            if changed is None:
                return  # idempotent, also on finished tasks
            if await self.context.store.save(changed):
                if not running_somewhere:
                    tracing.task_status(record.task_id, record.flow, "cancelled", previous=record.status)
                await self.changed(changed)
                if running_somewhere:
                    self.worker.cancel_local(record.task_id)  # elsewhere: its heartbeat sees the flag
                return
            record = await self._load(task_id)
        raise busy("cancel")

    async def send_event(self, task_id: str, name: str, payload: Any, *, event_id: str | None = None) -> bool:
        """Deliver event `name` to the task (see `mrtr.tasks._inbox`); resume it here if it waits for it.

        Returns False when `event_id` was delivered before (nothing changes: idempotent).

        Raises:
            EventNotDelivered: Unknown or expired task, a finished one, or a full inbox.
            ValueError: A malformed name, a payload that is not JSON or too large.
        """
        context = self.context
        if not context.clock_synced:
            await context.sync_clock()
        event = new_event(name, payload, event_id, context.now())
        delivered, record = await deliver(context.store, task_id, event, context.now())
        if delivered and record.lease_until == 0.0 and record.status == "working":
            await self.changed(record)
            if record.flow in context.flows:
                self.worker.saw(record)  # the claim starts from this write, not a read of it
                await self.wake(task_id)  # resume it here, at once
        return delivered

    # -- creation ------------------------------------------------------------------------

    async def start(self, call: TaskCall, creator: Creator = ANONYMOUS) -> CreateTaskResult:
        """Durably create a task for this call and start running it here; returns `CreateTaskResult`.

        With an idempotency key the task id is derived from (creator, tool, key), so a resend
        after a lost response finds the task the first attempt created (the store's atomic
        `create` decides, fleet-wide) and gets its `CreateTaskResult` instead of a second task.
        """
        context = self.context
        if not context.clock_synced:
            await context.sync_clock()
        now = context.now()
        new = NewTask.of(call, creator, self.options, now)
        record = TaskRecord(
            **new.kept,
            status="working",
            updated_at=now,
            lease_owner=self.worker.worker_id,
            lease_until=now + context.lease,
        )
        for _ in range(3):  # a keyed task that expires between `create` and `load`: create again
            try:
                await context.store.create(record)  # durable before the client hears of it
            except TaskExists:
                if new.key is None:
                    raise
                if (existing := await context.store.load(record.task_id, context.now())) is not None:
                    return new.resent(existing)
                continue
            self.worker.launch(record)  # first: the run starts while the answer and the notification go out
            created = await self.created(record)
            self.worker.ensure_scanning()
            return created
        raise MCPError(code=INTERNAL_ERROR, message="the task's id kept colliding with an expiring task; call again")

    async def close(self) -> None:
        """Stop the scanner and this instance's runs (their leases lapse: another instance resumes)."""
        await self.worker.close()


def _sealed(exc: RecordSealed) -> MCPError:
    """A record this instance's ring cannot open: a deployment problem (another instance may hold
    the key), not the client's; logged here, answered retryable, never shown as an empty task."""
    logger.warning("%s; answering a retryable error", exc)
    return MCPError(
        code=INTERNAL_ERROR,
        message="this task cannot be read on this server instance; retry",
        data={"reason": "task_sealed"},
    )


__all__ = ["TaskRuntime", "TaskSnapshot"]
