"""The task-engine seam: what the tasks extension needs of whatever runs durable flows.

The wire layer (`mrtr.tasks._extension`: the opt-in and routing-header checks, principal
binding, answer validation, the `DetailedTask` shape) is the same for every engine; it
reads tasks as `TaskView`s (what the wire shows of a task, and whose it is: never the
engine's storage) and asks the engine to start, update and cancel them. Two engines
implement `TaskEngine`: mrtr's own lease runtime over a `TaskStore`
(`mrtr.tasks._runtime.TaskRuntime`, the default) and Temporal (`mrtr.temporal.TemporalTasks`,
the `mrtr[temporal]` extra). Flow code is the same on both.

The seam is one-way: the host reads each call's request once into a `Creator` (who creates
the task, under which idempotency key; `mrtr.tasks._start.HostStarter`) and the engine answers
`start` with a typed `CreateTaskResult`; `get` answers a view (`TaskView`), which goes back to
the same engine as `update`'s and `cancel`'s `known=` (hence the engine's `View` parameter).

State changes are reported through one place: an engine calls `TaskEngine.changed(view)`
(a no-op unless someone sets `on_change`) with the task's new state each time it commits one,
so notifications can hang off a single hook whatever the engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

from mcp.server.context import ServerRequestContext
from mcp.server.request_state import authenticated_principal
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, ClientCapabilities, InputRequiredResult
from typing_extensions import TypeVar

from mrtr._engine.journal import Journal
from mrtr._engine.spec import FlowSpec
from mrtr._telemetry import tracing
from mrtr._wire import IDEMPOTENCY_KEY, CreateTaskResult, TaskView
from mrtr.tasks._records import created_result, owner_tag

if TYPE_CHECKING:
    from mrtr.stores._sealed import RecordSeal
    from mrtr.tasks._callbacks import CallbackUrls

ConvertResult = Callable[[Any], CallToolResult | InputRequiredResult]
"""Turns a flow's return value into the tool's `CallToolResult` (the SDK's own conversion)."""

PrincipalBinder = Callable[[ServerRequestContext[Any, Any]], str | None]
"""Who sent a request (the SDK's `RequestStateSecurity.bind_principal`); tasks belong to it."""


OwnerOf = Callable[[ServerRequestContext[Any, Any]], str | None]
"""The owner tag of a request's principal (`TaskEngine.owner_of`)."""

StateListener = Callable[[TaskView], Awaitable[None]]


TASK_LEASE = 10.0
"""Default seconds a silent worker keeps a task before another instance takes it over."""
TASK_TTL = 3600.0
"""Default seconds a task stays readable after creation."""
TASK_POLL_INTERVAL = 0.5
"""Default `pollIntervalMs` clients are told, in seconds."""
TASK_SCAN_INTERVAL = 1.0
"""Default seconds between an instance's looks for orphaned or due tasks."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The task options every engine honours, with their defaults: what `Flows` hands an engine
    (`HostOptions`' `task_*` defaults are these)."""

    ttl: float | None = TASK_TTL
    """Seconds a task stays readable after creation (`None`: forever)."""
    poll_interval: float = TASK_POLL_INTERVAL
    """The `pollIntervalMs` clients are told, in seconds."""
    bind_principal: PrincipalBinder = authenticated_principal
    """Who sent a request; tasks belong to it."""
    callbacks: CallbackUrls | None = None
    """Mints `ctx.callback_url` URLs (`Flows(public_url=...)`; None: no callback URLs)."""
    seal: RecordSeal | None = None
    """Seals task records at rest with the server's key ring (`Flows(seal_at_rest=...)`; None: plain)."""
    lease: float = TASK_LEASE
    """Seconds a worker may go silent before another instance takes its task over (lease runtime)."""
    scan_interval: float = TASK_SCAN_INTERVAL
    """Seconds between this instance's looks for orphaned or due work (lease runtime)."""

    @property
    def ttl_ms(self) -> int | None:
        """`ttl` as a task carries it (`ttlMs`)."""
        return None if self.ttl is None else int(self.ttl * 1000)

    @property
    def poll_interval_ms(self) -> int:
        """`poll_interval` as a task carries it (`pollIntervalMs`, at least 1)."""
        return max(1, int(self.poll_interval * 1000))


_MAX_KEY_LENGTH = 200


@dataclass(frozen=True, slots=True)
class Creator:
    """Who creates a task, and under which idempotency key: read once from the call's request by
    the host (`mrtr.tasks._start.HostStarter`), handed to `TaskEngine.start`."""

    owner: str | None = None
    """The owner tag of the request's principal (None when unauthenticated)."""
    idempotency_key: str | None = None
    """`params._meta["mrtr/idempotencyKey"]`: a resend with the same key finds the same task."""

    @classmethod
    def of(cls, request: ServerRequestContext[Any, Any] | None, owner_of: OwnerOf) -> Creator:
        """The request's creator: `owner_of` its principal (the engine's `owner_of`), and its key."""
        if request is None:
            return cls()
        return cls(owner=owner_of(request), idempotency_key=idempotency_key(request))


@dataclass(frozen=True, slots=True)
class TaskCall:
    """A call that becomes a task: what `TaskEngine.start` creates the task from."""

    spec: FlowSpec
    arguments: Mapping[str, Any]
    capabilities: ClientCapabilities | None
    """What the creating request declared (None: nothing, e.g. a call made in-process)."""
    journal: Journal
    """The flow's journal so far: the inline rounds of an MRTR-first call, or a fresh one."""


ANONYMOUS = Creator()
"""An unowned task without an idempotency key: `start`'s creator when no request names one."""


def valid_idempotency_key(key: object) -> TypeGuard[str]:
    """1-200 printable characters: what `_meta["mrtr/idempotencyKey"]` may be."""
    return isinstance(key, str) and 0 < len(key) <= _MAX_KEY_LENGTH and key.isprintable()


def idempotency_key(request: ServerRequestContext[Any, Any]) -> str | None:
    """The call's `mrtr/idempotencyKey` (None if absent); -32602 if malformed."""
    meta = (request.params or {}).get("_meta") or {}
    key = meta.get(IDEMPOTENCY_KEY) if isinstance(meta, dict) else None
    if key is None:
        return None
    if not valid_idempotency_key(key):
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"_meta[{IDEMPOTENCY_KEY!r}] must be a string of 1-{_MAX_KEY_LENGTH} printable characters",
        )
    return key


View = TypeVar("View", bound=TaskView, default=Any)
"""What an engine's `get` answers and takes back as `known=` (bare `TaskEngine`: any engine's)."""


@runtime_checkable
class TaskEngine(Protocol[View]):
    """Creates, reads, answers, cancels and runs durable tasks (see the module docstring)."""

    on_change: StateListener | None
    """Called with each committed state (`Flows` sets it to publish `notifications/tasks`)."""
    reports_every_change: bool
    """Whether every committed state reaches `on_change`: if not, listens are acknowledged
    without task ids and clients poll."""
    run_worker_here: bool
    """Whether this process runs tasks (False: a front end whose tasks run elsewhere)."""

    @property
    def shared_store(self) -> object | None:
        """The store other instances share, if any (a Redis or PostgreSQL store means a fleet)."""
        ...

    def configure(self, options: EngineOptions) -> None:
        """Take `Flows`' task options (TTL, poll interval, principal binding, callback URLs, seal)
        when the engine was built by the user (`Flows(tasks=...)`)."""
        ...

    def register(self, spec: FlowSpec, convert: ConvertResult) -> None:
        """Serve `spec` as a task flow (called by `Flows` for every `task=` tool)."""
        ...

    async def start(self, call: TaskCall, creator: Creator = ANONYMOUS) -> CreateTaskResult:
        """Create the task durably for `creator` (its owner and `mrtr/idempotencyKey`; by
        default an unowned task without a key) and start it."""
        ...

    async def get(self, task_id: str) -> View | None:
        """The task's current state, or None when it is unknown or past its TTL."""
        ...

    async def get_many(self, task_ids: list[str]) -> Sequence[View | None]:
        """`get` of each id, in order (a listen stream's snapshot of the tasks it was asked
        for): in as few round trips to the store as it allows."""
        ...

    async def update(
        self, task_id: str, answers: Mapping[str, Any], asked: Mapping[str, Any], known: View | None = None
    ) -> None:
        """Record `answers` (already validated against `asked`, the requests they answer) for
        the keys still outstanding with exactly that request; ignore the rest. Resume the task
        once nothing is outstanding. `known` is the snapshot the caller just read, if any."""
        ...

    async def cancel(self, task_id: str, known: View | None = None) -> None:
        """Cancel the task (idempotent; a finished task stays as it is)."""
        ...

    async def send_event(self, task_id: str, name: str, payload: Any, *, event_id: str | None = None) -> bool:
        """Deliver an event to the task (`ctx.wait_for_event`); False when `event_id` came before."""
        ...

    def owner_of(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The owner tag of the request's principal (None when unauthenticated)."""
        ...

    def ensure_running(self) -> None:
        """Start this instance's background work (lease scanner, Temporal worker); idempotent."""
        ...

    async def close(self) -> None:
        """Stop this instance's background work."""
        ...


class EngineBase:
    """Base of both engines: their options, whose a request is, and the one place an engine
    reports committed state changes (`on_change`)."""

    options: EngineOptions = EngineOptions()
    on_change: StateListener | None = None
    reports_every_change: bool = True
    run_worker_here: bool = True

    def owner_of(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The owner tag of the request's principal (None when unauthenticated)."""
        return owner_tag(self.options.bind_principal(ctx))

    async def changed(self, task: TaskView) -> None:
        if self.on_change is not None:
            await self.on_change(task)

    async def created(self, task: TaskView) -> CreateTaskResult:
        """Report a task this instance just created (durably): its first state, and what `start` answers."""
        tracing.task_status(task.task_id, task.flow, "working")
        await self.changed(task)
        return created_result(task)


def busy(what: str) -> MCPError:
    """The error for a `tasks/update` or `tasks/cancel` that kept losing a race: retry it."""
    return MCPError(code=INVALID_PARAMS, message=f"task is busy; retry the {what}")


def unknown_task(task_id: str) -> MCPError:
    """Exactly what an unknown, expired or foreign task id gets (no existence oracle)."""
    return MCPError(code=INVALID_PARAMS, message=f"Unknown or expired task: {task_id}")


__all__ = [
    "ANONYMOUS",
    "ConvertResult",
    "Creator",
    "EngineBase",
    "EngineOptions",
    "OwnerOf",
    "PrincipalBinder",
    "TASK_LEASE",
    "TASK_POLL_INTERVAL",
    "TASK_SCAN_INTERVAL",
    "TASK_TTL",
    "StateListener",
    "TaskCall",
    "TaskEngine",
    "TaskView",
    "View",
    "busy",
    "idempotency_key",
    "unknown_task",
    "valid_idempotency_key",
]
