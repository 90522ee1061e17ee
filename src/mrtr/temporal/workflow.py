"""The one generic workflow every MCP task runs as: it holds the journal and the task's state.

The user's flow never runs here. The workflow loops: it runs the `mrtr.advance` activity
(the flow, replayed by mrtr's own engine from the journal, until one new step finishes, it
asks, or it ends), keeps the journal the activity returns (so Temporal's history holds it),
and records the task state. A question parks the task in `input_required` until the
`answer` update brings every answer; cancellation (`tasks/cancel`, or an operator in
Temporal's UI or CLI) ends it `cancelled`. Every state change is also written to the
workflow's memo (`mrtr.task`), which `tasks/get` reads with one describe call, no worker
involved (so a task stays readable while every worker is down); the `state` query returns
the same state for operators (`temporal workflow query --type state`), and it is the
workflow's return value once it has ended.

Deterministic by construction (no clock but `workflow.now()`, no I/O, no flow code), so it
runs outside Temporal's sandbox.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception

from mrtr.temporal.shapes import (
    ADVANCE,
    ANSWER_UPDATE,
    STATE_MEMO,
    STATE_QUERY,
    WORKFLOW,
    Advance,
    Advanced,
    Answers,
    StepPolicy,
    TaskStart,
    TaskState,
)

_INTERNAL_ERROR = -32603


@workflow.defn(name=WORKFLOW)
class TaskWorkflow:
    """One MCP task (see the module docstring)."""

    @workflow.init
    def __init__(self, start: TaskStart) -> None:
        self.start = start
        self.journal = start.journal
        self.responses: dict[str, Any] = {}
        self.state = TaskState.initial(start)

    @workflow.run
    async def run(self, start: TaskStart) -> TaskState:
        try:
            while True:
                job = Advance(start.task_id, start.flow, start.arguments, start.capabilities, self.journal)
                job.responses = self.responses
                advanced: Advanced = await workflow.execute_activity(
                    ADVANCE,
                    job,
                    result_type=Advanced,
                    start_to_close_timeout=timedelta(seconds=start.policy.start_to_close),
                    heartbeat_timeout=timedelta(seconds=start.policy.heartbeat),
                    retry_policy=_retry(start.policy),
                )
                self.journal = advanced.journal
                if advanced.kind == "step":
                    self.responses = advanced.responses
                    continue
                self.responses = {}
                if advanced.kind == "input_required":
                    self._set("input_required", input_requests=advanced.input_requests)
                    await workflow.wait_condition(lambda: self.state.status == "working")
                    continue
                self._set(advanced.kind, result=advanced.result, error=advanced.error)
                return self.state
        except (asyncio.CancelledError, ActivityError) as exc:
            if isinstance(exc, asyncio.CancelledError) or is_cancelled_exception(exc):
                self._set("cancelled")
                return self.state
            # The step's activity failed for good (its retry policy has a maximum_attempts).
            message = f"the task's step could not run: {exc.cause or exc}"
            self._set("failed", error={"code": _INTERNAL_ERROR, "message": message})
            return self.state

    @workflow.query(name=STATE_QUERY)
    def snapshot(self) -> TaskState:
        return self.state

    @workflow.update(name=ANSWER_UPDATE)
    def answer(self, given: Answers) -> None:
        outstanding = self.state.input_requests
        accepted = _accepted(outstanding, given)
        self.responses = self.responses | accepted
        remaining = {key: request for key, request in outstanding.items() if key not in accepted}
        self._set("input_required" if remaining else "working", input_requests=remaining)

    @answer.validator
    def check_answer(self, given: Answers) -> None:
        """Only answers to outstanding asks (the very requests they were validated against) get in."""
        if self.state.status != "input_required" or not _accepted(self.state.input_requests, given):
            raise ValueError("no answer to an outstanding input request")

    def _set(self, status: str, **changes: Any) -> None:
        if status != "input_required":
            changes.setdefault("input_requests", {})
        self.state = replace(self.state, status=status, updated_at=workflow.now().timestamp(), **changes)
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
