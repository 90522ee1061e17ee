"""`TemporalTasks`: MCP tasks as Temporal workflows, behind mrtr's task-engine seam.

Each task is one `mrtr.task` workflow whose id is the task id, so a retried creation cannot
start a second run (with `mrtr/idempotencyKey` the id is derived from creator, tool and key,
as on the lease runtime). Any MCP server instance serves `tasks/get` (the workflow's `state`
query while it runs, its result once it has ended), `tasks/update` (the `answer` Workflow
Update, which admits only answers to outstanding asks) and `tasks/cancel` (Temporal
cancellation: the workflow ends Canceled) for any task, through the Temporal client. Workers
are the MCP server processes themselves (`worker=True`, the default: the worker runs while
the server serves) and/or separate processes (`mrtr.temporal.run_worker`).

Every state change is reported through `on_change` (the server's bus, as `notifications/tasks`)
once it is committed: creation by the instance that starts the workflow, an answer's state by
the instance that sends it, every other change (asking, completed, failed, cancelled) by the
worker that runs the workflow's `mrtr.report` activity. On a fleet, `MCPServer(subscriptions=
mrtr.open_bus(url))` carries them to listeners on every instance (a standalone worker's
in-memory bus reaches nobody).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from mrtr._engine.spec import FlowSpec
from mrtr._errors import EventNotDelivered
from mrtr._wire import CreateTaskResult, TaskView, expired, is_terminal
from mrtr.tasks._inbox import new_event
from mrtr.tasks._seam import ANONYMOUS, TASK_LEASE, ConvertResult, Creator, EngineBase, EngineOptions, TaskCall
from mrtr.tasks._start import NewTask
from mrtr.temporal._activity import Advancer
from mrtr.temporal._codec import sealed_client
from mrtr.temporal._shapes import (
    ANSWER_UPDATE,
    EVENT_UPDATE,
    STATE_MEMO,
    WORKFLOW,
    Answers,
    Event,
    StepPolicy,
    TaskStart,
    TaskState,
)
from mrtr.temporal._workflow import TaskWorkflow

logger = logging.getLogger("mrtr.temporal")

_READ_AT_ONCE = 8  # describe calls in flight at once for one `get_many`
_TERMINAL_CACHE = 4096
_CANCEL_WAIT = 2.0
_NOT_THERE = {RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT}
_ENDED_WITHOUT_RESULT = {
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
    WorkflowExecutionStatus.FAILED,
}
_STATE_FIELDS = frozenset(TaskState.__dataclass_fields__)


class TemporalTasks(EngineBase):
    """Runs `Flows` tasks on Temporal: `Flows(server, tasks=TemporalTasks(client, task_queue=...))`.

    Args:
        client: A connected `temporalio.client.Client` (its namespace holds the tasks).
        task_queue: The task queue of this fleet's task workflows and step activities.
        worker: Run a Temporal worker in this process while it serves (from
            `Flows.streamable_http_app`'s lifespan, or the first task request); `False` for MCP
            servers that only create and read tasks, with workers elsewhere (`run_worker`).
        step_retry: Retry policy of each step's activity (retried only when a worker cannot
            run it: died mid-step, or does not serve the flow; errors the flow raises are
            task outcomes, as on the lease runtime). Default: every 1 s doubling to 30 s, until
            the task's TTL.
        step_timeout: Seconds one step attempt may run (default: the flow's `deadline`).
        heartbeat_timeout: Seconds a worker may go silent mid-step before Temporal retries the
            step on another worker (the lease runtime's `task_lease`).
        worker_options: Extra keyword arguments for `temporalio.worker.Worker`.

    `task_ttl` and `task_poll_interval` come from `Flows`, as with the lease runtime; a task's
    workflow times out when its TTL runs out, and `tasks/get` no longer finds it from then on.
    """

    reports_every_change = True
    """Every state change is reported (`on_change`), each with a larger `version` (the module
    docstring says by whom): listen streams accept task ids."""

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = "mcp-tasks",
        worker: bool = True,
        step_retry: RetryPolicy | None = None,
        step_timeout: float | None = None,
        heartbeat_timeout: float = TASK_LEASE,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.run_worker_here = worker
        self.step_retry = step_retry or RetryPolicy(maximum_interval=timedelta(seconds=30))
        self.step_timeout = step_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.worker_options = dict(worker_options or {})
        self.options = EngineOptions()
        """`Flows`' task options (`configure`); their defaults until then."""
        self.flows: dict[str, tuple[FlowSpec, ConvertResult]] = {}
        self._worker: Worker | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._terminal: OrderedDict[str, TaskState] = OrderedDict()
        self._sealed = False

    # -- configuration (from Flows) ------------------------------------------------------

    @property
    def shared_store(self) -> None:
        """None: tasks live in Temporal, which every instance reaches on its own."""
        return None

    def configure(self, options: EngineOptions) -> None:
        if options.seal is not None and not self._sealed:
            # Sealed at rest: every payload Temporal keeps (arguments, journal, answers, results,
            # the state memo) goes through the server's key ring (`mrtr.temporal._codec`).
            self.client = sealed_client(self.client, options.seal)
            self._sealed = True
        self.options = options

    def register(self, spec: FlowSpec, convert: ConvertResult) -> None:
        self.flows[spec.name] = (spec, convert)

    # -- creation ------------------------------------------------------------------------

    async def start(self, call: TaskCall, creator: Creator = ANONYMOUS) -> CreateTaskResult:
        """Start the task's workflow (durable before the client hears of it); `CreateTaskResult`."""
        self.ensure_running()
        new = NewTask.of(call, creator, self.options, time.time())
        start = TaskStart(**new.kept, policy=self._policy(call.spec))
        state = TaskState.initial(start)
        ttl_ms = start.ttl_ms
        try:
            await self.client.start_workflow(
                WORKFLOW,
                start,
                id=start.task_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                execution_timeout=None if ttl_ms is None else timedelta(milliseconds=ttl_ms),
                memo={STATE_MEMO: asdict(state)},
                static_summary=f"MCP task: {start.flow}",
                # This process's worker may take the first workflow task at once (no queue trip).
                request_eager_start=self._worker_task is not None and not self._worker_task.done(),
            )
        except WorkflowAlreadyStartedError:
            if new.key is None:
                raise
            existing = await self.get(start.task_id)
            if existing is None:  # the earlier task expired but Temporal still retains its workflow
                raise MCPError(
                    code=INVALID_PARAMS,
                    message="mrtr/idempotencyKey belongs to an expired task; use a new key",
                    data={"reason": "idempotency_key_expired"},
                ) from None
            return new.resent(existing)
        return await self.created(state)

    def _policy(self, spec: FlowSpec) -> StepPolicy:
        retry = self.step_retry
        return StepPolicy(
            start_to_close=self.step_timeout or spec.limits.deadline,
            heartbeat=self.heartbeat_timeout,
            initial_interval=retry.initial_interval.total_seconds(),
            backoff=retry.backoff_coefficient,
            maximum_interval=(retry.maximum_interval or retry.initial_interval * 100).total_seconds(),
            maximum_attempts=retry.maximum_attempts,
        )

    # -- reading, answering, cancelling --------------------------------------------------

    async def get(self, task_id: str) -> TaskState | None:
        state = self._terminal.get(task_id)
        if state is None:
            state = await self._read(task_id)
            if state is None:
                return None
            if is_terminal(state):
                self._terminal[task_id] = state
                while len(self._terminal) > _TERMINAL_CACHE:
                    self._terminal.popitem(last=False)
        if expired(state, time.time()):
            return None
        return state

    async def get_many(self, task_ids: list[str]) -> list[TaskState | None]:
        """`get` of each id: a few describe calls at a time."""
        gate = asyncio.Semaphore(_READ_AT_ONCE)

        async def one(task_id: str) -> TaskState | None:
            async with gate:
                return await self.get(task_id)

        return list(await asyncio.gather(*(one(task_id) for task_id in task_ids)))

    async def _read(self, task_id: str) -> TaskState | None:
        """The task state from the workflow's memo: one describe call, no worker involved."""
        try:
            description = await self.client.get_workflow_handle(task_id).describe()
            memo = await description.memo()
        except RPCError as exc:
            if exc.status in _NOT_THERE:
                return None
            raise _unavailable(exc) from exc
        fields = memo.get(STATE_MEMO)
        if not isinstance(fields, dict):
            return None  # a workflow with this id that is not an mrtr task
        state = _state(fields)
        if is_terminal(state):  # as recorded, however the workflow ended afterwards
            return state
        if description.status == WorkflowExecutionStatus.CANCELED:  # before its workflow could record it
            state.status, state.input_requests, state.version = "cancelled", {}, state.version + 1
        elif description.status in _ENDED_WITHOUT_RESULT:  # terminated, or timed out past its TTL
            message = f"the task's workflow ended without a result ({description.status.name.lower()})"
            state.status, state.error = "failed", {"code": INTERNAL_ERROR, "message": message}
            state.version += 1
        return state

    async def update(
        self, task_id: str, answers: Mapping[str, Any], asked: Mapping[str, Any], known: TaskView | None = None
    ) -> None:
        handle = self.client.get_workflow_handle(task_id)
        try:
            brought = await handle.execute_update(ANSWER_UPDATE, Answers(dict(answers), dict(asked)))
        except WorkflowUpdateFailedError:
            return  # nothing it answers is outstanding any more (answered meanwhile, or cancelled)
        except RPCError as exc:
            if exc.status in _NOT_THERE:
                return
            raise _unavailable(exc) from exc
        if self.on_change is None:
            return
        if isinstance(brought, dict):  # the state the answers brought, as committed
            await self.changed(_state(brought))
        elif (state := await self.get(task_id)) is not None:  # a worker from before updates returned it
            await self.changed(state)

    async def send_event(self, task_id: str, name: str, payload: Any, *, event_id: str | None = None) -> bool:
        """Deliver an event to the task's workflow (the `event` Workflow Update; see `Flows.send_event`).

        The workflow keeps it until the flow waits for it, and dedupes by `event_id`.
        """
        event = Event(**new_event(name, payload, event_id, time.time()))
        handle = self.client.get_workflow_handle(task_id)
        try:
            delivered = await handle.execute_update(EVENT_UPDATE, event, result_type=bool)
        except WorkflowUpdateFailedError:
            raise EventNotDelivered(
                f"task {task_id!r} has finished: nothing will wait for event {name!r} any more",
                reason="task_finished",
                task_id=task_id,
            ) from None
        except RPCError as exc:
            if exc.status not in _NOT_THERE:
                raise _unavailable(exc) from exc
            record = await self.get(task_id)
            if record is None:
                raise EventNotDelivered(
                    f"no task {task_id!r} (unknown or expired)", reason="unknown_task", task_id=task_id
                ) from None
            raise EventNotDelivered(
                f"task {task_id!r} is {record.status}: nothing will wait for event {name!r} any more",
                reason="task_finished",
                task_id=task_id,
            ) from None
        return bool(delivered)

    async def cancel(self, task_id: str, known: TaskView | None = None) -> None:
        if known is not None and is_terminal(known):
            return  # idempotent, also on finished tasks
        handle = self.client.get_workflow_handle(task_id)
        try:
            # The workflow records `cancelled` and ends Canceled; its worker reports the change.
            await handle.cancel()
        except RPCError as exc:
            if exc.status in _NOT_THERE:
                return  # it ended meanwhile
            raise _unavailable(exc) from exc
        # Answer once the workflow has ended, so a `tasks/get` right after shows it cancelled;
        # bounded: with no worker up it ends (and reports) when one comes.
        with contextlib.suppress(Exception):  # its ending (Canceled), or the bound
            await asyncio.wait_for(handle.result(), _CANCEL_WAIT)

    # -- the worker ----------------------------------------------------------------------

    def new_worker(self) -> Worker:
        """A Temporal worker for this engine's task queue, running its workflow and step activity."""
        options: dict[str, Any] = {"workflow_runner": UnsandboxedWorkflowRunner()} | self.worker_options
        advancer = Advancer(self.flows, self._report, lambda: self.options.callbacks)
        return Worker(
            self.client,
            task_queue=self.task_queue,
            workflows=[TaskWorkflow],
            activities=[advancer.advance, advancer.report],
            **options,
        )

    async def _report(self, state: TaskState) -> None:
        await self.changed(state)

    def ensure_running(self) -> None:
        """Start this process's worker (with `worker=True`; idempotent; needs a running loop)."""
        if not self.run_worker_here or (self._worker_task is not None and not self._worker_task.done()):
            return
        self._worker = self.new_worker()
        self._worker_task = asyncio.get_running_loop().create_task(self._worker.run())

    async def serve(self) -> None:
        """Run a worker until cancelled (`mrtr.temporal.run_worker`)."""
        if self._worker_task is not None and not self._worker_task.done():
            await self._worker_task
            return
        self._worker = self.new_worker()
        await self._worker.run()

    async def close(self) -> None:
        worker, task = self._worker, self._worker_task
        self._worker = self._worker_task = None
        if worker is not None and task is not None and not task.done():
            await worker.shutdown()
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task


def _state(fields: Mapping[str, Any]) -> TaskState:
    return TaskState(**{k: v for k, v in fields.items() if k in _STATE_FIELDS})  # newer fields: ignored


def _unavailable(exc: RPCError) -> MCPError:
    return MCPError(code=INTERNAL_ERROR, message=f"the task engine (Temporal) did not answer; retry: {exc.message}")


__all__ = ["TemporalTasks"]
