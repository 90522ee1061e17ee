"""The one generic workflow every MCP task runs as: it holds the journal and the task's state.

The user's flow never runs here. The workflow loops: it runs the `mrtr.advance` activity
(the flow, replayed by mrtr's own engine from the journal, until one new step finishes, it
asks, or it ends), keeps the journal the activity returns (so Temporal's history holds it),
and records the task state. A question parks the task in `input_required` until the
`answer` update brings every answer; cancellation (`tasks/cancel`, or an operator in
Temporal's UI or CLI) ends it `cancelled`, and the workflow *Canceled* in Temporal. Every
state change is also written to the workflow's memo (`mrtr.task`), which `tasks/get` reads
with one describe call, no worker involved (so a task stays readable while every worker is
down); the `state` query returns the same state for operators (`temporal workflow query
--type state`), and it is the workflow's return value once it has completed.

Each state the workflow reaches (asking, completed, failed, cancelled) is then published by
the `mrtr.report` activity, which a worker runs once the workflow task that recorded the
state is committed: listeners hear of it exactly as `tasks/get` shows it (never before it
does), ordered by `TaskState.version`. The state an answer brings is published by the MCP
server that sent the update, from the update's result. Executions begun before these
reports existed keep their old path (`workflow.patched`): no reports, and they end Completed.

Deterministic by construction (no clock but `workflow.now()`, no I/O, no flow code), so it
runs outside Temporal's sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

from mrtr._wire import InboxEvent, Wait
from mrtr.temporal._shapes import (
    ADVANCE,
    ANSWER_UPDATE,
    EVENT_SIGNAL,
    EVENT_UPDATE,
    REPORT,
    STATE_MEMO,
    STATE_QUERY,
    STATUS_UPDATE,
    WORKFLOW,
    Advance,
    Advanced,
    Answers,
    Event,
    StepPolicy,
    TaskStart,
    TaskState,
)

_INTERNAL_ERROR = -32603
_REPORTS = "mrtr.reports"
"""The patch behind the `mrtr.report` activity and the Canceled ending (see the module docstring)."""
_REPORT_TIMEOUT = timedelta(seconds=10)


@workflow.defn(name=WORKFLOW)
class TaskWorkflow:
    """One MCP task (see the module docstring)."""

    @workflow.init
    def __init__(self, start: TaskStart) -> None:
        self.start = start
        self.journal = start.journal
        self.responses: dict[str, Any] = {}
        self.state = TaskState.initial(start)
        self.inbox: list[InboxEvent] = []
        """Events delivered and not consumed by the flow yet, oldest first."""
        self.event_ids: list[str] = []
        """Ids of every event taken in (a resend with the same id changes nothing)."""

    @workflow.run
    async def run(self, start: TaskStart) -> TaskState:
        try:
            await self._advance(start)
        except (asyncio.CancelledError, ActivityError) as exc:
            if not (isinstance(exc, asyncio.CancelledError) or is_cancelled_exception(exc)):
                # The step's activity failed for good (its retry policy has a maximum_attempts).
                message = f"the task's step could not run: {exc.cause or exc}"
                self._set("failed", error={"code": _INTERNAL_ERROR, "message": message})
            else:
                self._set("cancelled")  # recorded (memo, query) before the workflow ends Canceled
                await self._report(settled=True)
                if workflow.patched(_REPORTS):
                    raise
                return self.state
        await self._report(settled=True)
        return self.state

    async def _advance(self, start: TaskStart) -> None:
        """Run the flow step by step, through its questions, until it has completed or failed."""
        while True:
            job = Advance(start.task_id, start.flow, start.arguments, start.capabilities, self.journal)
            job.responses = self.responses
            job.inbox = list(self.inbox)
            advanced: Advanced = await workflow.execute_activity(
                ADVANCE,
                job,
                result_type=Advanced,
                start_to_close_timeout=timedelta(seconds=start.policy.start_to_close),
                heartbeat_timeout=timedelta(seconds=start.policy.heartbeat),
                retry_policy=_retry(start.policy),
            )
            self.journal = advanced.journal
            if advanced.consumed:
                consumed = set(advanced.consumed)
                self.inbox = [event for event in self.inbox if event.get("id") not in consumed]
            if advanced.kind == "step":
                self.responses = advanced.responses
                continue
            self.responses = {}
            if advanced.kind == "waiting":
                self._set("working", status_message=advanced.status_message, waiting=advanced.waiting)
                await self._report(settled=False)
                await self._park(advanced.waiting)
                continue
            if advanced.kind == "input_required":
                self._set("input_required", input_requests=advanced.input_requests)
                await self._report(settled=False)  # an answer may arrive meanwhile: the update handles it
                await workflow.wait_condition(lambda: self.state.status == "working")
                continue
            self._set(advanced.kind, result=advanced.result, error=advanced.error)
            return

    async def _park(self, waiting: list[Wait]) -> None:
        """Wait (a durable Temporal timer) until the earliest due time, or until an event the flow
        waits for is in the inbox; then the next activity replays the flow and resolves it."""
        names = {wait.get("name") for wait in waiting if wait.get("kind") == "event"}
        dues = [float(until) for wait in waiting if (until := wait.get("until")) is not None]
        timeout = None
        if dues:
            timeout = timedelta(seconds=max(0.0, min(dues) - workflow.now().timestamp()))
        with contextlib.suppress(asyncio.TimeoutError):
            await workflow.wait_condition(lambda: any(e.get("name") in names for e in self.inbox), timeout=timeout)

    @workflow.update(name=EVENT_UPDATE)
    def event(self, event: Event) -> bool:
        """Take an event in (`TemporalTasks.send_event`); False when its id came before."""
        return self._take(event)

    @event.validator
    def check_event(self, event: Event) -> None:
        if self.state.status in ("completed", "failed", "cancelled"):
            raise ValueError(f"task_finished: the task is {self.state.status}")

    @workflow.signal(name=EVENT_SIGNAL)
    def event_signal(self, event: Event) -> None:
        """The same as the `event` update, fire-and-forget (for `temporal workflow signal`)."""
        if self.state.status not in ("completed", "failed", "cancelled"):
            self._take(event)

    def _take(self, event: Event) -> bool:
        if event.id in self.event_ids:
            return False
        self.event_ids.append(event.id)
        self.inbox.append(InboxEvent(id=event.id, name=event.name, data=event.data, at=event.at))
        return True

    async def _report(self, *, settled: bool) -> None:
        """Have a worker publish the state just recorded; best effort (listeners refetch after a
        quiet spell). A cancellation meanwhile cancels the task unless it has `settled` already."""
        if not workflow.patched(_REPORTS):
            return
        try:
            await workflow.execute_activity(
                REPORT,
                self.state,
                start_to_close_timeout=_REPORT_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3),
                cancellation_type=ActivityCancellationType.ABANDON,
            )
        except (asyncio.CancelledError, ActivityError) as exc:
            if not settled and (isinstance(exc, asyncio.CancelledError) or is_cancelled_exception(exc)):
                raise

    @workflow.update(name=STATUS_UPDATE)
    def status(self, message: str) -> TaskState:
        """A running step's latest progress report (`ctx.report_progress`) as the task's status message.

        Only while the task is working on a step (not parked on waits, whose message says what
        it waits for): returns the state, changed or not (its sender publishes it if changed).
        """
        if self.state.status == "working" and not self.state.waiting and self.state.status_message != message:
            self._set("working", status_message=message)
        return self.state

    @workflow.query(name=STATE_QUERY)
    def snapshot(self) -> TaskState:
        return self.state

    @workflow.update(name=ANSWER_UPDATE)
    def answer(self, given: Answers) -> TaskState:
        """Take the answers; returns the state they bring (its sender publishes it)."""
        outstanding = self.state.input_requests
        accepted = _accepted(outstanding, given)
        self.responses = self.responses | accepted
        remaining = {key: request for key, request in outstanding.items() if key not in accepted}
        self._set("input_required" if remaining else "working", input_requests=remaining)
        return self.state

    @answer.validator
    def check_answer(self, given: Answers) -> None:
        """Only answers to outstanding asks (the very requests they were validated against) get in."""
        if self.state.status != "input_required" or not _accepted(self.state.input_requests, given):
            raise ValueError("no answer to an outstanding input request")

    def _set(self, status: str, **changes: Any) -> None:
        if status != "input_required":
            changes.setdefault("input_requests", {})
        changes.setdefault("waiting", [])
        changes.setdefault("status_message", None)
        now = workflow.now().timestamp()
        self.state = replace(self.state, status=status, updated_at=now, version=self.state.version + 1, **changes)
        workflow.upsert_memo({STATE_MEMO: asdict(self.state)})


def _accepted(outstanding: dict[str, Any], given: Answers) -> dict[str, Any]:
    return {k: v for k, v in given.answers.items() if k in outstanding and outstanding[k] == given.asked.get(k)}


def _retry(policy: StepPolicy) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=policy.initial_interval),
        backoff_coefficient=policy.backoff,
        maximum_interval=timedelta(seconds=policy.maximum_interval),
        maximum_attempts=policy.maximum_attempts,
    )


__all__ = ["TaskWorkflow"]
