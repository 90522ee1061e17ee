"""The options of `mrtr.Flows` and `mrtr.fastmcp.Flows`: one definition, both hosts.

`FlowsOptions` is what a user writes (`Flows(server, max_rounds=20, store=...)`): both hosts
take it as `**options: Unpack[FlowsOptions]`, so a keyword one host accepts the other accepts
too, with the same type. `HostOptions` is the same set resolved, with every default filled
in, as the host core reads it. `FlowOptions` is what each `.tool()`, `.prompt()` and
`.resource()` adds on top (`ToolOptions` for a tool); `flow_options` checks them by name, the
same way on both hosts, when the flow is registered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from mrtr._engine.asks import Capability
from mrtr._engine.spec import TASK_MAX_ROUNDS, TaskSupport
from mrtr.tasks._seam import TASK_LEASE, TASK_POLL_INTERVAL, TASK_SCAN_INTERVAL, TASK_TTL

if TYPE_CHECKING:
    from mcp.server.subscriptions import SubscriptionBus

    from mrtr._guard import GuardOutage, ReplayGuard
    from mrtr._shedding import ShedClients
    from mrtr.stores import TaskStore
    from mrtr.tasks._extension import TasksExtension
    from mrtr.tasks._seam import TaskEngine


class FlowsOptions(TypedDict, total=False):
    """Every keyword of `mrtr.Flows(server, ...)` and `mrtr.fastmcp.Flows(mcp, ...)`.

    The same on both hosts, with the same defaults. An option that only one framework can
    serve is refused by the other with a `FlowDefinitionError` saying why (`dialects`).
    """

    max_rounds: int
    """Default cap on client round trips per inline flow: 10, the official `mcp.Client`'s own
    default (`input_required_max_rounds`), so both stop at the same round; raise both together.
    A call whose client declared the tasks extension, to a tool that can be a task, does not
    stop there: it continues as a durable task (`task_max_rounds`)."""
    task_max_rounds: int
    """Default cap on a durable task's rounds of client input, inline rounds before it became a
    task included (1000; never below the flow's `max_rounds`). `tasks/get` and `tasks/update`
    have no client cap, so a task can ask far more than an inline call."""
    deadline: float
    """Default seconds a flow may take from its first round (3600); never renewed."""
    max_state_bytes: int
    """Default cap on the sealed `requestState` (64 KiB)."""
    store: TaskStore | None
    """Where durable tasks live (`SQLiteStore`, `RedisStore`, `PostgresStore`); share one across
    the fleet. Default: a SQLite file of this user's, `tasks-<server name>.db` in the per-user
    state directory (`$MRTR_STATE_DIR`, else `$XDG_STATE_HOME/mrtr` or `~/.local/state/mrtr`),
    never the working directory, once a task flow is registered (with a start-up warning:
    other hosts cannot see it; `require_shared_store=True` refuses instead)."""
    task_lease: float
    """Seconds a silent worker keeps a task before another instance takes over (10)."""
    task_ttl: float | None
    """Seconds a task stays readable after creation (3600; `None`: forever)."""
    task_poll_interval: float
    """The `pollIntervalMs` clients are told, in seconds (0.5)."""
    task_scan_interval: float
    """Seconds between this instance's looks for orphaned tasks (1)."""
    tasks: TaskEngine | TasksExtension | None
    """The task engine: by default mrtr's lease runtime over `store`; or another
    `mrtr.tasks.TaskEngine`, e.g. `mrtr.temporal.TemporalTasks(client, task_queue=...)` (`store`
    and the lease options are then unused; `task_ttl` and `task_poll_interval` still apply); or,
    on `MCPServer`, a `mrtr.tasks.TasksExtension` already given at construction
    (`MCPServer(extensions=[...])`)."""
    replay_guard: str | ReplayGuard | bool | None
    """Single-use rounds fleet-wide (`mrtr.ReplayGuard`). `None` (the default): on wherever a
    shared store (Redis, PostgreSQL) is configured, recorded in that store; `False`: off (logged
    at start-up); a store URL (`redis://...`, `postgresql://...`, `sqlite:///PATH`) or a
    `ReplayGuard`: that ledger."""
    request_id_header: str | None
    """The header a load balancer stamps each client request with and keeps on its retries
    (`X-Request-ID`, the default; HAProxy `unique-id-format` + `http-request set-header`,
    Envoy's `x-request-id`, nginx `$request_id`). Where the replay guard records rounds in a
    shared store, a first round resent with the same id (or the same `mrtr/idempotencyKey`,
    or by the same authenticated principal with the same body) joins its first copy: its
    finished steps never run again. `None`: the header is not read."""
    replay_guard_outage: GuardOutage
    """What an inline round does while the replay guard's store does not answer (a store outage).
    `"fail_closed"` (the default): it is refused with -32603, `reason: "replay_guard_unavailable"`,
    `retryable: true`, and runs once the store is back (`FlowClient` resends it by itself, within
    `RetryPolicy.store_patience`): no round runs unchecked. `"degrade"`: it runs unguarded, as with
    `replay_guard=False`, logged at WARNING once per burst (and when the store answers again): the
    flow keeps answering, but a round resent meanwhile may run its steps again. A call's first
    round that has an identity (see `request_id_header`) is treated alike: refused, or run
    without joining its resends; one without an identity runs either way. Also applies to a `ReplayGuard` given as
    `replay_guard=` (unset: the guard's own `on_outage`)."""
    max_inflight_rounds: int | None
    """Shed load (see `mrtr.LoadShedder`) while more MRTR rounds than this run on this instance."""
    max_loop_lag: float | None
    """Shed load while the event loop runs timers this many seconds late."""
    shed_when: Callable[[], bool] | None
    """Shed load while this callable returns True."""
    shed_clients: ShedClients | None
    """Which clients a round may be shed to, `(client_info, capabilities) -> bool`; by default
    those known to resend a state-only result (those declaring `mrtr/shedding`, and the official
    Python SDK). Other clients' rounds run on."""
    fleet_bus: bool
    """With a shared store and no bus of the server's own, task notifications and listen
    streams ride a bus on the store's broker, so a listener hears of changes made on any
    instance (True). `False` keeps an in-process bus: listens are then acknowledged without
    task ids, and task clients poll."""
    bus: SubscriptionBus | None
    """The bus listen streams and task notifications ride (`mrtr.open_bus(url)`); it wins over
    the fleet bus. On `MCPServer`, `MCPServer(subscriptions=...)` says the same."""
    require_shared_key: bool
    """Refuse to start (`FlowDefinitionError`) when `requestState` is sealed with a key only this
    process holds, instead of warning."""
    require_shared_store: bool
    """Refuse to start (`FlowDefinitionError`) without a store other instances share (Redis,
    PostgreSQL, or a task engine such as Temporal), instead of falling back to a local SQLite
    file whose tasks no other instance can see."""
    instance_name: str | None
    """Name this instance in an `X-Mrtr-Instance` header on every response of the app `Flows`
    builds (`flows.streamable_http_app()`, `flows.http_app()`); `mrtr call` shows it per round."""
    public_url: str | None
    """The fleet's base URL as outside systems reach it: `ctx.callback_url(name)` mints URLs
    under `<public_url>/mrtr/events/`, served by every instance. None: no callback URLs."""
    dialects: Sequence[str]
    """Also serve the seeds' pre-standard wire shapes (`"sketch"`, `"draft"`, `"incomplete"`,
    `"saga"`, `"sep-2322-tasks"`). `MCPServer` only: they are endpoints and middleware of the
    SDK's own HTTP app."""
    seal_at_rest: bool
    """Seal each durable task record's payload (arguments, journal, answers, results, errors,
    history, events) with the server's key ring before it reaches the store (True), as the
    journal is sealed on the wire; ids, status, flow, times and lease stay clear for indexes.
    Without a shared key ring there is nothing to seal with (the start-up key warning says so).
    `False` stores them in plain text, logged at start-up."""
    strict: bool
    """Log every replay of a flow's body at WARNING on logger `mrtr.replay` (DEBUG otherwise)."""
    protocol_versions: Sequence[str] | None
    """Serve only these protocol versions (e.g. `["2026-07-28"]` for a fleet without sticky
    routing); every other version gets the spec's version-mismatch answer, -32022 with
    `data: {"supported", "requested"}`. `None` (the default): every version the SDK speaks."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostOptions:
    """`FlowsOptions` resolved: every default filled in (see `FlowsOptions` for each meaning)."""

    max_rounds: int = 10
    task_max_rounds: int = TASK_MAX_ROUNDS
    deadline: float = 3600.0
    max_state_bytes: int = 64 * 1024
    store: TaskStore | None = None
    task_lease: float = TASK_LEASE
    task_ttl: float | None = TASK_TTL
    task_poll_interval: float = TASK_POLL_INTERVAL
    task_scan_interval: float = TASK_SCAN_INTERVAL
    tasks: TaskEngine | TasksExtension | None = None
    replay_guard: str | ReplayGuard | bool | None = None
    request_id_header: str | None = "X-Request-ID"
    replay_guard_outage: GuardOutage | None = None
    max_inflight_rounds: int | None = None
    max_loop_lag: float | None = None
    shed_when: Callable[[], bool] | None = None
    shed_clients: ShedClients | None = None
    fleet_bus: bool = True
    bus: SubscriptionBus | None = None
    require_shared_key: bool = False
    require_shared_store: bool = False
    instance_name: str | None = None
    public_url: str | None = None
    dialects: Sequence[str] = ()
    seal_at_rest: bool = True
    strict: bool = False
    protocol_versions: Sequence[str] | None = None

    @classmethod
    def of(cls, options: FlowsOptions | dict[str, Any]) -> HostOptions:
        """The options as given, checked by name: a misspelt option is a `TypeError` naming it."""
        unknown = sorted(set(options) - _NAMES)
        if unknown:
            raise TypeError(f"Flows() got unexpected option(s) {unknown}; the options are {sorted(_NAMES)}")
        return cls(**options)


_NAMES = frozenset(f.name for f in fields(HostOptions))


class FlowOptions(TypedDict, total=False):
    """What `.tool()`, `.prompt()` and `.resource()` take beyond the framework's own metadata."""

    requires: Sequence[Capability]
    """Client capabilities the flow will need (`"elicitation"`, `"sampling"`, `"roots"`, ...): a
    request that lacks one fails with -32021 in round 1, before the user has answered anything."""
    max_rounds: int | None
    """This flow's round cap (default: the `Flows` option)."""
    deadline: float | None
    """This flow's deadline in seconds (default: the `Flows` option)."""
    max_state_bytes: int | None
    """This flow's cap on its sealed state (default: the `Flows` option)."""


class ToolOptions(FlowOptions, total=False):
    """What `.tool()` takes beyond `FlowOptions`: a call can become a durable task, a prompt's or
    a resource's cannot."""

    task: TaskSupport
    """`"optional"`: the call runs as a durable task when the client declares the tasks extension
    (inline otherwise); `"required"`: clients that do not are refused (-32021); `"never"` (the
    default): always inline."""
    mrtr_first: bool
    """Ask inline first, as MRTR rounds, and become a task at the first step,
    `ctx.continue_as_task()`, or the round cap (`max_rounds`) (False: a task from the start)."""
    task_max_rounds: int | None
    """This tool's cap on its rounds as a durable task (default: the `Flows` option)."""


FlowKind = Literal["tool", "prompt", "resource"]

_FLOW_NAMES: dict[FlowKind, frozenset[str]] = {
    "tool": frozenset(ToolOptions.__optional_keys__),
    "prompt": frozenset(FlowOptions.__optional_keys__),
    "resource": frozenset(FlowOptions.__optional_keys__),
}
_ALL_FLOW_NAMES = frozenset().union(*_FLOW_NAMES.values())


def flow_options(
    kind: FlowKind, given: Mapping[str, Any], framework: Collection[str] = ()
) -> tuple[ToolOptions, dict[str, Any]]:
    """mrtr's options for a `kind` flow, checked by name, apart from the framework's own keywords.

    The same check, and the same messages, on both hosts, when the flow is registered: an
    option of mrtr's that `kind` does not take, or a keyword that is neither mrtr's nor among
    `framework` (the framework decorator's keywords mrtr passes on), is a `TypeError`. mrtr's
    names win over the framework's (FastMCP's own `task=` is not mrtr's).
    """
    names = _FLOW_NAMES[kind]
    misplaced = sorted(k for k in given if k in _ALL_FLOW_NAMES and k not in names)
    if misplaced:
        raise TypeError(
            f"flows.{kind}() got option(s) {misplaced} that a {kind} does not take; "
            f"mrtr's options for a {kind} are {sorted(names)}"
        )
    unknown = sorted(k for k in given if k not in names and k not in framework)
    if unknown:
        raise TypeError(
            f"flows.{kind}() got unexpected option(s) {unknown}; mrtr's options for a {kind} are "
            f"{sorted(names)}, and the server's own {kind}() keywords are accepted too"
        )
    if "task" in given:
        _check_task(given["task"])
    flow = {k: v for k, v in given.items() if k in names}
    return cast(ToolOptions, flow), {k: v for k, v in given.items() if k not in names}


def _check_task(task: object) -> None:
    """`task=` is mrtr's: `"never"`, `"optional"` or `"required"` (FastMCP's own `task=True` is not)."""
    if task not in ("never", "optional", "required"):
        raise ValueError(
            f"task={task!r} is not mrtr's; use task='never', 'optional' or 'required' (mrtr's durable tasks). "
            "FastMCP's own task=True belongs to the fastmcp-tasks extension, which cannot serve mrtr flows"
        )


__all__ = ["FlowKind", "FlowOptions", "FlowsOptions", "HostOptions", "ToolOptions", "flow_options"]
