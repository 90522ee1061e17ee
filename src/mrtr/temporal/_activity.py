"""The `mrtr.advance` activity: one step of a task's flow, run by mrtr's own replay engine.

The flow runs from the top against the journal the workflow holds (as every task run does
on the lease runtime): finished steps and answered asks return from the journal, and the
first new step runs (`execute(..., RunOptions(step_limit=1))`); any further new step is held, so the
activity ends as soon as that step is journaled and the workflow records the journal in
Temporal's history before the next one starts. A worker that dies mid-step stops
heartbeating; Temporal retries the activity on another worker, which runs the step again
under the same idempotency key (`mrtr.current_step().idempotency_key`, from the journal's
flow id). The activity otherwise ends where the flow asks (`input_required`) or ends.

Flow errors are task outcomes, never activity failures: the activity fails (and Temporal
retries it, per the task's retry policy) only when this worker cannot run the flow at all,
e.g. a flow it does not serve during a rolling upgrade.

The `mrtr.report` activity publishes a state the workflow has recorded, through the task
engine's `on_change` (the bus of the server whose worker runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from functools import partial
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import JournalFromNewerVersion
from mrtr._engine.progress import ThrottledStatus
from mrtr._engine.run import RunOptions, execute
from mrtr._engine.spec import FlowSpec
from mrtr._engine.waits import taken_events
from mrtr._errors import FlowDefinitionError
from mrtr._telemetry import tracing
from mrtr.tasks._callbacks import CallbackUrls
from mrtr.tasks._outcome import Settled, prologue, settle
from mrtr.tasks._seam import ConvertResult
from mrtr.temporal._shapes import ADVANCE, REPORT, STATUS_UPDATE, Advance, Advanced, TaskState

logger = tracing.get_logger("mrtr.temporal")


class Advancer:
    """Holds the flows a worker serves and where it reports; `advance` and `report` are the activities."""

    def __init__(
        self,
        flows: Mapping[str, tuple[FlowSpec, ConvertResult]],
        on_state: Callable[[TaskState], Awaitable[None]] | None = None,
        callbacks: Callable[[], CallbackUrls | None] | None = None,
    ) -> None:
        self.flows = flows
        self.on_state = on_state
        self.callbacks = callbacks or (lambda: None)

    @activity.defn(name=REPORT)
    async def report(self, state: TaskState) -> None:
        """Publish `state`: the workflow task that recorded it is committed by now, so `tasks/get`
        already shows it (a listener that acts on it finds the task as told)."""
        tracing.bind_task(state.task_id)
        if self.on_state is not None:
            await self.on_state(state)

    async def _status(self, task_id: str, message: str) -> None:
        """`ctx.report_progress` in a step: the workflow records the message (its memo: `tasks/get`), then
        it is published as any state the workflow reaches."""
        handle = activity.client().get_workflow_handle(task_id)
        state = await handle.execute_update(STATUS_UPDATE, message, result_type=TaskState)
        if self.on_state is not None and state.status_message == message:
            await self.on_state(state)

    @activity.defn(name=ADVANCE)
    async def advance(self, job: Advance) -> Advanced:
        tracing.bind_task(job.task_id)
        entry = self.flows.get(job.flow)
        if entry is None:
            raise ApplicationError(f"this worker does not serve flow {job.flow!r}", type="UnknownFlow")
        spec, convert = entry
        try:
            start = prologue(spec, job.task_id, job.journal, job.capabilities)
        except JournalFromNewerVersion as exc:  # an upgraded worker can: let it
            raise ApplicationError(str(exc), type="JournalFromNewerVersion") from None
        if isinstance(start, Settled):  # it cannot run at all: failed, once
            return Advanced("failed", job.journal, error=start.error)
        journal, capabilities = start
        beating = asyncio.get_running_loop().create_task(_heartbeat())
        status = ThrottledStatus(partial(self._status, job.task_id))
        try:
            waits = _ActivityWaits(job, self.callbacks())
            options = RunOptions(step_limit=1, waits=waits, progress=status)
            outcome = await execute(spec, journal, job.responses, capabilities, job.arguments, options)
        finally:
            beating.cancel()
            await status.close()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        taken = taken_events(journal.steps)
        consumed = [str(event["id"]) for event in job.inbox if event.get("id") in taken]
        if outcome.parked and outcome.would_run:  # a step ran (or was held): go on in the next activity
            unread = {key: answer for key, answer in job.responses.items() if key not in journal.answers}
            return Advanced("step", journal_codec.encode(journal), responses=unread, consumed=consumed)
        settled = settle(spec, convert, outcome, job.task_id)
        return Advanced(
            "waiting" if settled.status == "working" else settled.status,
            journal_codec.encode(journal),
            input_requests=settled.input_requests,
            result=settled.result,
            error=settled.error,
            waiting=settled.waiting,
            status_message=settled.status_message,
            consumed=consumed,
        )


class _ActivityWaits:
    """The durable waits' view of one activity: the worker's clock, the events the workflow holds."""

    def __init__(self, job: Advance, callbacks: CallbackUrls | None) -> None:
        self._job = job
        self._callbacks = callbacks

    def now(self) -> float:
        return time.time()

    def take_event(self, name: str, taken: Collection[str]) -> tuple[str, Any] | None:
        for event in self._job.inbox:
            if event.get("name") == name and event.get("id") not in taken:
                return str(event["id"]), event.get("data")
        return None

    def callback_url(self, name: str, expires_at: float) -> str:
        if self._callbacks is None:
            raise FlowDefinitionError(
                "ctx.callback_url() needs the fleet's public base URL: Flows(server, tasks=TemporalTasks(...), "
                "public_url='https://...'), in the process whose worker runs the task"
            )
        return self._callbacks.mint(self._job.task_id, name, expires_at)


async def _heartbeat() -> None:
    """Tell Temporal this worker is alive (and learn of a cancellation) while the step runs."""
    timeout = activity.info().heartbeat_timeout
    interval = max(0.1, timeout.total_seconds() / 3) if timeout else 1.0
    while True:  # a step shorter than the interval never heartbeats: Temporal needs none from it
        await asyncio.sleep(interval)
        activity.heartbeat()


__all__ = ["Advancer"]
