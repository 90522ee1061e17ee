"""The wire mrtr adds to MCP or reshapes, defined once and used by server and client alike.

The SDK's `mcp_types` has the core protocol (`InputRequiredResult`, `InputRequest`, ...).
What it lacks is here: the tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) —
its `Task` object, the result that creates one, `tasks/get|update|cancel` parameters, the
`notifications/tasks` payload — and mrtr's own `_meta`, capability and listen keys.

Models follow `mcp_types`: snake_case in Python, camelCase on the wire (`by_alias=True`),
unknown fields kept (`extra="allow"`), so a newer peer's additions pass through.
This module imports pydantic and `mcp_types` only: importing it pulls in no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, NotRequired, Protocol, Required, TypedDict

import mcp_types as t
from pydantic import ConfigDict, Field

# -- JSON ----------------------------------------------------------------------------------

JSONObject = dict[str, Any]
"""A JSON object whose keys mrtr does not fix: tool arguments and results it passes through,
JSON Schemas, `_meta`, capabilities, form content, a user's event payload, a raw JSON-RPC
message before a model parses it. A shape mrtr does fix has a name of its own (`Wait`,
`InputRequests`, `HistoryEntry`, ...): this alias is never a second name for one of those."""

InputRequests = dict[str, JSONObject]
"""Outstanding asks: wire `InputRequest` JSON (`{"method", "params"}`) by the ask's key."""
InputResponses = dict[str, Any]
"""The client's answers (`inputResponses`) by the key of the ask each answers: wire result JSON
(`ElicitResult`, `CreateMessageResult`, `ListRootsResult`) as sent, unchecked until its ask
accepts it (so any JSON value, not only an object)."""


# -- names ---------------------------------------------------------------------------------

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The tasks extension's id, declared in `capabilities.extensions` by both sides."""
RELATED_TASK = "io.modelcontextprotocol/related-task"
"""`_meta` key naming the task a message belongs to."""
IDEMPOTENCY_KEY = "mrtr/idempotencyKey"
"""`params._meta` key of a task-augmented call: random per logical call, the same on every resend."""
SHEDDING_EXTENSION = "mrtr/shedding"
"""Client capability extension: "I resend a shed round's state unchanged" (see `Flows(shed_clients=)`)."""

TASK_IDS = "taskIds"
"""`subscriptions/listen` filter key (tasks extension): the task ids to hear about."""
SNAPSHOTS = "mrtr/taskSnapshots"
"""Listen filter key: ask for the full `DetailedTask` in each `notifications/tasks`."""
TASK_KEYS = "mrtr/taskKeys"
"""Listen filter key: idempotency keys of calls not made yet, whose tasks to hear about from birth."""
TASK_VERSION = "mrtr/taskVersion"
"""`_meta` key of a `notifications/tasks`: the task record's version, to drop stale states."""

SEED_DIALECT: ContextVar[str | None] = ContextVar("mrtr_seed_dialect", default=None)
"""The seed dialect (`sketch`, `draft`, `incomplete`, `saga`) a request arrived in, while the
dialect's gateway serves it as 2026-07-28; None for every other request. Only errors read it:
a refusal words what such a client can do about it (see `mrtr._host.call`)."""

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
"""The status of a task, as the tasks extension names it on the wire and in the store."""
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
"""The statuses a task never leaves."""


def iso(ts: float, *, timespec: str = "milliseconds") -> str:
    """A UNIX time as the extension's timestamps: ISO 8601, milliseconds, `Z` (`timespec="seconds"`
    for people's screens)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


WAITING = "mrtr/waiting"
"""`_meta` key of a `DetailedTask` parked on durable waits: `[{"kind": "timer"|"event", "name"?, "until"?}]`."""


# -- the Task object and the results that carry it ------------------------------------------


class Task(t.Result):
    """The wire `Task` object: the fields every task response carries."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None

    def wire(self) -> JSONObject:
        """As sent: camelCase, absent fields left out, but `ttlMs` and `pollIntervalMs` always shown (null = none)."""
        data = self.model_dump(by_alias=True, mode="json", exclude_none=True)
        data.setdefault("ttlMs", self.ttl_ms)
        data.setdefault("pollIntervalMs", self.poll_interval_ms)
        return data


class DetailedTask(Task):
    """What `tasks/get` answers and `notifications/tasks` carries: the task, plus what it waits for or ended with."""

    input_requests: JSONObject | None = None
    """`InputRequests` as the server sent them (validated no further than a JSON object)."""
    result: JSONObject | None = None
    error: JSONObject | None = None


class CreateTaskResult(Task):
    """The flat result a server returns instead of the tool's result when it made a task."""

    result_type: Literal["task"] = "task"


# -- requests -------------------------------------------------------------------------------


class TaskRequestParams(t.RequestParams):
    """The params of `tasks/get` and `tasks/cancel`: the id of the task to read or cancel."""

    task_id: str = Field(min_length=1)


class UpdateTaskParams(TaskRequestParams):
    """`tasks/update`: answers to a task's `inputRequests`."""

    input_responses: InputResponses


class TaskNotice(t.NotificationParams):
    """`notifications/tasks` params: a `DetailedTask` (kept as sent) plus `_meta` (mrtr's `TASK_VERSION`)."""

    model_config = ConfigDict(extra="allow")

    def task(self) -> DetailedTask | None:
        """The task it describes; None when the notice carries no task id."""
        fields = self.model_extra or {}
        if not isinstance(fields.get("taskId"), str):
            return None
        return DetailedTask.model_validate(fields)

    def version(self) -> int | None:
        """The task record's version it shows, when the server says (to drop stale states)."""
        meta: Any = self.meta or {}
        if not isinstance(meta, dict):
            meta = getattr(meta, "model_extra", None) or {}
        version = meta.get(TASK_VERSION)
        return version if isinstance(version, int) else None


def declares_tasks(capabilities: t.ClientCapabilities | None) -> bool:
    """Whether the request declares the tasks extension (its per-request opt-in)."""
    return capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})


class Wait(TypedDict):
    """What a parked durable task waits for besides the client: a timer, or an event (with a
    timeout or none). Held in `TaskRecord.waiting`, shown as `_meta["mrtr/waiting"]`."""

    kind: Literal["timer", "event"]
    name: str | None
    """The event's name (None for a timer)."""
    until: float | None
    """When it falls due, epoch seconds (None: an event with no timeout)."""
    via: NotRequired[Literal["callback"]]
    """`"callback"`: the event is the one a `ctx.callback_url` of the flow delivers (operators
    filter on it); absent for a plain event, and in records written before it existed."""


class InboxEvent(TypedDict):
    """An event delivered to a task and not consumed by its flow yet (`send_event`, callback URLs)."""

    id: str
    name: str
    data: Any
    at: float


class HistoryEntry(TypedDict, total=False):
    """What ran, for people (the console): a step that really ran, or an operator's action.
    Replay reads the journal, never this."""

    at: Required[float]
    kind: Required[Literal["step", "rerun", "cancel", "fork"]]
    key: str
    """The step's journal key."""
    seconds: float
    attempt: int
    """Which run of the task from the top (`TaskAdmin.rerun` counts them)."""
    error: str
    """The step's error, if it raised."""
    step: str
    """A fork's step key: that step and the ones after it ran again (`TaskAdmin.rerun(from_step=)`)."""
    by: str
    """Who forked it: the tool (`mrtr tasks`, the console) and, where known, the person."""


class TaskView(Protocol):
    """A task as the wire layer reads it: what `tasks/get` and `notifications/tasks` show, and
    whose it is. What every engine's `get` returns: the lease runtime its stored `TaskRecord`s,
    Temporal its workflow's state; neither journal nor lease nor storage crosses the seam."""

    @property
    def task_id(self) -> str: ...
    @property
    def flow(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def status_message(self) -> str | None: ...
    @property
    def created_at(self) -> float: ...
    @property
    def updated_at(self) -> float: ...
    @property
    def ttl_ms(self) -> int | None: ...
    @property
    def poll_interval_ms(self) -> int: ...
    @property
    def input_requests(self) -> InputRequests:
        """Outstanding asks (wire `InputRequest`s by key) while `input_required`."""
        ...

    @property
    def result(self) -> JSONObject | None:
        """The tool's `CallToolResult` as wire JSON, once completed."""
        ...

    @property
    def error(self) -> JSONObject | None:
        """The JSON-RPC error object (`{"code", "message", "data"?}`), once failed."""
        ...

    @property
    def waiting(self) -> Sequence[Wait]:
        """What a parked run waits for besides the client: timers and events."""
        ...

    @property
    def owner(self) -> str | None:
        """Digest of the creating principal (None if unauthenticated)."""
        ...

    @property
    def version(self) -> int:
        """Counts the task's state changes: orders them for listeners."""
        ...


def is_terminal(task: TaskView) -> bool:
    """Whether the task has finished (completed, failed, cancelled): nothing changes it any more."""
    return task.status in TERMINAL


def expired(task: TaskView, now: float) -> bool:
    """Whether the task is past its TTL (gone for `tasks/*`, as an unknown id)."""
    return task.ttl_ms is not None and task.created_at + task.ttl_ms / 1000 <= now


__all__ = [
    "WAITING",
    "IDEMPOTENCY_KEY",
    "RELATED_TASK",
    "SHEDDING_EXTENSION",
    "SNAPSHOTS",
    "SEED_DIALECT",
    "TASKS_EXTENSION",
    "TASK_IDS",
    "TASK_KEYS",
    "TASK_VERSION",
    "TERMINAL",
    "CreateTaskResult",
    "DetailedTask",
    "HistoryEntry",
    "InboxEvent",
    "InputRequests",
    "InputResponses",
    "JSONObject",
    "Task",
    "TaskNotice",
    "TaskRequestParams",
    "TaskStatus",
    "TaskView",
    "UpdateTaskParams",
    "Wait",
    "declares_tasks",
    "expired",
    "is_terminal",
    "iso",
]
