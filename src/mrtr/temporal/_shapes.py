"""The data that crosses Temporal: workflow input, task state, activity input and output, answers.

Plain dataclasses of JSON values (Temporal's default data converter carries them), importing
nothing of mrtr, so the workflow module that uses them stays free of flow code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mrtr._wire import InboxEvent, InputRequests, InputResponses, JSONObject, Wait

WORKFLOW = "mrtr.task"
"""The workflow type every MCP task runs as (one workflow per task, workflow id = task id)."""
ADVANCE = "mrtr.advance"
"""The activity that advances a flow by one step (or to its next question, or to its end)."""
REPORT = "mrtr.report"
"""The activity that publishes a task state the workflow has just recorded (`notifications/tasks`)."""
STATE_QUERY = "state"
ANSWER_UPDATE = "answer"
EVENT_UPDATE = "event"
"""The Workflow Update that delivers an event (`send_event`): answers whether it was new."""
EVENT_SIGNAL = "mrtr.event"
"""The same delivery as a plain signal, for Temporal's own tools (`temporal workflow signal`)."""
STATUS_UPDATE = "mrtr.status"
"""The Workflow Update a running step's `ctx.report_progress` sends: the task's new status message."""
STATE_MEMO = "mrtr.task"
"""The workflow memo key holding the task state (set at start, upserted at every change)."""


@dataclass
class StepPolicy:
    """How each step activity is timed and retried (`temporalio.common.RetryPolicy`, flattened)."""

    start_to_close: float
    """Seconds one attempt may take (the flow's deadline, unless set)."""
    heartbeat: float
    """Seconds a silent worker keeps its attempt before Temporal retries it elsewhere."""
    initial_interval: float = 1.0
    backoff: float = 2.0
    maximum_interval: float = 30.0
    maximum_attempts: int = 0
    """0: retry until the task's TTL runs out."""


@dataclass
class TaskStart:
    """The workflow's input: the task as created."""

    task_id: str
    flow: str
    arguments: JSONObject
    capabilities: JSONObject
    """The client's `ClientCapabilities` as wire JSON."""
    journal: str
    """The encoded `mrtr._engine.journal.Journal` the flow starts from (MRTR-first calls bring rounds)."""
    owner: str | None
    created_at: float
    ttl_ms: int | None
    poll_interval_ms: int
    policy: StepPolicy


@dataclass
class TaskState:
    """What `tasks/get` reads (the workflow's query result, and its return value once closed)."""

    task_id: str
    flow: str
    owner: str | None
    status: str
    created_at: float
    updated_at: float
    ttl_ms: int | None
    poll_interval_ms: int
    arguments: JSONObject = field(default_factory=dict)
    input_requests: InputRequests = field(default_factory=dict)
    result: JSONObject | None = None
    error: JSONObject | None = None
    status_message: str | None = None
    waiting: list[Wait] = field(default_factory=list)
    """What a parked flow waits for (`TaskRecord.waiting`): timers and events."""
    version: int = 0
    """Counts the task's state changes (0 at creation): orders them for listeners (`mrtr/taskVersion`)."""

    @classmethod
    def initial(cls, start: TaskStart) -> TaskState:
        """The state a task starts in (the workflow's, and what its creator reports at once)."""
        return cls(
            task_id=start.task_id,
            flow=start.flow,
            owner=start.owner,
            status="working",
            created_at=start.created_at,
            updated_at=start.created_at,
            ttl_ms=start.ttl_ms,
            poll_interval_ms=start.poll_interval_ms,
            arguments=start.arguments,
        )


@dataclass
class Advance:
    """The activity's input: the flow, its journal so far, and answers not yet journaled."""

    task_id: str
    flow: str
    arguments: JSONObject
    capabilities: JSONObject
    journal: str
    responses: InputResponses = field(default_factory=dict)
    inbox: list[InboxEvent] = field(default_factory=list)
    """Events delivered and not consumed yet, oldest first."""


@dataclass
class Event:
    """One event for a task (`TemporalTasks.send_event`, or the `mrtr.event` signal)."""

    id: str
    name: str
    data: Any = None
    at: float = 0.0


@dataclass
class Advanced:
    """Where the flow got to: `step` (one step finished, more to run), or a task state."""

    kind: str
    """`step`, `waiting` (parked on timers or events), `input_required`, `completed` or `failed`."""
    journal: str
    responses: InputResponses = field(default_factory=dict)
    """Answers the flow has not reached yet (kept for the next activity after a `step`)."""
    input_requests: InputRequests = field(default_factory=dict)
    result: JSONObject | None = None
    error: JSONObject | None = None
    waiting: list[Wait] = field(default_factory=list)
    status_message: str | None = None
    consumed: list[str] = field(default_factory=list)
    """Ids of the inbox's events this activity's run consumed (journaled)."""


@dataclass
class Answers:
    """A `tasks/update`: validated answers, and the requests they were validated against."""

    answers: InputResponses
    asked: InputRequests


__all__ = [
    "ADVANCE",
    "ANSWER_UPDATE",
    "EVENT_SIGNAL",
    "EVENT_UPDATE",
    "REPORT",
    "STATE_MEMO",
    "STATE_QUERY",
    "STATUS_UPDATE",
    "WORKFLOW",
    "Advance",
    "Advanced",
    "Answers",
    "Event",
    "StepPolicy",
    "TaskStart",
    "TaskState",
]
