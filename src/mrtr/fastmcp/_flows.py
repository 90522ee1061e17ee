"""`mrtr.fastmcp.Flows`: flows registered as ordinary FastMCP tools, prompts and resources.

A flow is wrapped in a plain async function with the flow's own parameters (so FastMCP
derives the same schema) that runs mrtr's engine on the request FastMCP is serving. The
engine answers with the flow's value or an `InputRequiredResult`, which FastMCP's own
guard-pattern path carries to the wire; FastMCP's `RequestStateBoundary` seals the journal
with the server's `request_state_security`, so any instance sharing that key serves any
round. FastMCP's middleware, auth, tags, `mcp.http_app()` and `mcp.run()` see ordinary
components.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_context
from fastmcp.tools import FunctionTool
from mcp.server.request_state import RequestStateSecurity, authenticated_principal
from mcp.server.subscriptions import InMemorySubscriptionBus, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, InputRequiredResult

from mrtr import _answer_edge as answer_edge
from mrtr import _fleet as fleet
from mrtr._checks import check_elicit_schemas
from mrtr._engine.asks import Capability
from mrtr._engine.context import FlowContext
from mrtr._engine.engine import TaskCreated, run_flow
from mrtr._engine.round import RoundPolicy, Services
from mrtr._engine.spec import FlowSpec, Limits, TaskSupport
from mrtr._errors import FlowDefinitionError, InputRefused
from mrtr._guard import ReplayGuard, open_guard
from mrtr._registration import (
    checked_capabilities,
    entry_point,
    flow_limits,
    refused_as_client_error,
    reject_bare_use,
)
from mrtr._shedding import LoadShedder, ShedClients
from mrtr._wire import TASKS_EXTENSION
from mrtr.buses._base import BrokerBus
from mrtr.fastmcp import _internals as internals
from mrtr.fastmcp._client_errors import quiet_tool_error
from mrtr.fastmcp._context import FlowsContext
from mrtr.fastmcp._tasks import FastMCPTasks, created_box, serve_listen
from mrtr.stores import TaskStore
from mrtr.tasks._callbacks import PATH as CALLBACK_PATH
from mrtr.tasks._callbacks import CallbackUrls
from mrtr.tasks._callbacks import endpoint as callback_endpoint
from mrtr.tasks._events import TaskEvents
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler
from mrtr.tasks._runtime import TaskRuntime
from mrtr.tasks._seam import EngineOptions, TaskEngine

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("mrtr.fleet")


class Flows:
    """Adds flows to a `fastmcp.FastMCP` server (see the module docstring).

    Args:
        mcp: The FastMCP server. Its `request_state_security` seals every journal: give every
            instance the same key ring (and the same server name).
        max_rounds: Per-flow default round cap, as for `mrtr.Flows`.
        deadline: Per-flow default deadline, as for `mrtr.Flows`.
        max_state_bytes: Per-flow default cap on the sealed state, as for `mrtr.Flows`.
        replay_guard: Make every round's `requestState` single-use fleet-wide (a store URL
            or a `mrtr.ReplayGuard`), as for `mrtr.Flows`.
        max_inflight_rounds: Load shedding past this many rounds in flight, as for `mrtr.Flows`.
        max_loop_lag: Load shedding past this event-loop lag, as for `mrtr.Flows`.
        shed_when: Load shedding on your own signal, as for `mrtr.Flows`.
        shed_clients: Which clients may be shed to, as for `mrtr.Flows`.
        store: Where durable tasks (`@flows.tool(task="optional"|"required")`) live, for mrtr's
            lease runtime (SQLite, Redis, PostgreSQL), as for `mrtr.Flows`. The tasks extension
            is registered on the FastMCP server (`mcp.add_extension`) when the first task flow
            is, and its lease scanner runs with the server's lifespan.
        task_lease: The lease runtime's lease, as for `mrtr.Flows`.
        task_ttl: How long a task lives, as for `mrtr.Flows`.
        task_poll_interval: The poll interval clients are told, as for `mrtr.Flows`.
        task_scan_interval: How often the lease scanner looks for work, as for `mrtr.Flows`.
        tasks: Another task engine instead of the lease runtime, such as
            `mrtr.temporal.TemporalTasks`.
        fleet_bus: False keeps task notifications in-process even with a shared store.
        bus: Task notifications. FastMCP 4.2 serves no `subscriptions/listen`, so
            mrtr serves it (core filter plus the tasks extension's `taskIds`) on `bus`; by
            default the store's fleet bus when the store is shared (Redis, PostgreSQL; not with
            `fleet_bus=False`), else an in-process bus. A bus that cannot hear every task
            change acknowledges listens without task ids, and clients poll.
        require_shared_key: Refuse to start without `request_state_security` instead of warning.
        strict: Log every replay of a flow's body at WARNING, as for `mrtr.Flows`.
        public_url: The fleet's base URL for `ctx.flow.callback_url(name)`, as for `mrtr.Flows`
            (the route is a FastMCP custom route, `POST /mrtr/events/...`).
    """

    def __init__(
        self,
        mcp: FastMCP[Any],
        *,
        max_rounds: int = 10,
        deadline: float = 3600.0,
        max_state_bytes: int = 64 * 1024,
        replay_guard: str | ReplayGuard | None = None,
        max_inflight_rounds: int | None = None,
        max_loop_lag: float | None = None,
        shed_when: Callable[[], bool] | None = None,
        shed_clients: ShedClients | None = None,
        store: TaskStore | None = None,
        task_lease: float = 10.0,
        task_ttl: float | None = 3600.0,
        task_poll_interval: float = 0.5,
        task_scan_interval: float = 1.0,
        tasks: TaskEngine | None = None,
        fleet_bus: bool = True,
        bus: SubscriptionBus | None = None,
        require_shared_key: bool = False,
        strict: bool = False,
        public_url: str | None = None,
    ) -> None:
        self.mcp = mcp
        self.strict = strict
        self._callbacks = None if public_url is None else CallbackUrls(public_url, self.state_security)
        if self._callbacks is not None:
            route = mcp.custom_route(f"{CALLBACK_PATH}/{{task_id}}/{{name}}/{{token}}", methods=["POST"])
            route(callback_endpoint(lambda: self._callbacks, self._deliver_callback))
        self._store = store
        self._engine = tasks
        self._task_options: dict[str, Any] = {
            "lease": task_lease,
            "ttl": task_ttl,
            "poll_interval": task_poll_interval,
            "scan_interval": task_scan_interval,
        }
        self._extension: TasksExtension | None = None
        self._fleet_bus = fleet_bus
        self.bus: SubscriptionBus | None = bus
        """The bus task notifications ride (set when the first task flow is registered, unless given)."""
        self.limits = Limits(max_rounds=max_rounds, deadline=deadline, max_state_bytes=max_state_bytes)
        security = self.state_security()
        if security is None and require_shared_key:
            raise FlowDefinitionError(
                f"FastMCP server {mcp.name!r} has no request_state_security (Flows(require_shared_key=True)): every "
                "instance must seal with the same key ring: FastMCP(..., request_state_security="
                "RequestStateSecurity(keys=[...]))"
            )
        if security is None:
            logger.warning(
                "mrtr: FastMCP server %r has no request_state_security, so its requestState is sealed with a key "
                "only this process holds: a second instance (or this one after a restart) rejects every flow in "
                "flight with 'Invalid or expired requestState', after the user answered. Give every instance the "
                "same key ring: FastMCP(..., request_state_security=RequestStateSecurity(keys=[...]))",
                mcp.name,
            )
        self.replay_guard = None
        if replay_guard is not None:
            self.replay_guard = open_guard(replay_guard) if isinstance(replay_guard, str) else replay_guard
            if self.replay_guard.state_ttl is None:
                self.replay_guard.state_ttl = float(security.ttl) if security is not None else 600.0
        self.shedder = LoadShedder.from_options(max_inflight_rounds, max_loop_lag, shed_when, shed_clients)
        policies: tuple[RoundPolicy, ...] = tuple(p for p in (self.replay_guard, self.shedder) if p is not None)
        self.services = Services(policies=policies)
        answer_edge.install(internals.lowlevel_server(mcp))  # issue #35: a malformed answer is named
        self.specs: dict[str, FlowSpec] = {}
        """Every flow registered here, by name."""

    def state_security(self) -> RequestStateSecurity | None:
        """The policy FastMCP seals `requestState` with (None: a key of this process only)."""
        return internals.state_security(self.mcp)

    @property
    def audience(self) -> str:
        """The audience sealed into every `requestState`: the policy's own, else the server's name."""
        security = self.state_security()
        return (security.audience if security is not None else None) or self.mcp.name

    # -- registration ---------------------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        task: TaskSupport = "never",
        mrtr_first: bool = False,
        requires: Sequence[Capability] = (),
        max_rounds: int | None = None,
        deadline: float | None = None,
        max_state_bytes: int | None = None,
        **fastmcp_options: Any,
    ) -> Callable[[F], F]:
        """Register an async flow as a FastMCP tool; `fastmcp_options` are `FastMCP.tool`'s
        (title, description, tags, annotations, meta, icons, output_schema, timeout, auth, ...).

        `task="optional"|"required"` and `mrtr_first` mean what they mean for `mrtr.Flows.tool`:
        the call runs as a durable mrtr task when the client declares the tasks extension.
        """
        reject_bare_use(name, "tool")
        if task not in ("never", "optional", "required"):
            raise TypeError(
                f"mrtr.fastmcp: task={task!r} is not mrtr's; use task='optional' or 'required' (mrtr's durable "
                "tasks). FastMCP's own task=True belongs to the fastmcp-tasks extension, which cannot serve mrtr flows"
            )

        options = dict(fastmcp_options)
        app = options.pop("app", None)
        if app:  # as FastMCP.tool does: an app config is the tool's meta["ui"]
            options["meta"] = dict(options.get("meta") or {}) | {"ui": True if app is True else app}

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name or fn.__name__, max_rounds, deadline, max_state_bytes, requires)
            spec = self.specs[spec.name] = dataclasses.replace(spec, task=task, mrtr_first=mrtr_first)
            engine = self._tasks() if task != "never" else None
            tool = FunctionTool.from_function(self._entry(fn, spec, _refused_as_tool_error), name=spec.name, **options)
            self.mcp.add_tool(tool)
            if engine is not None:  # a task's result is converted by FastMCP, exactly as the call's would be
                engine.register(spec, functools.partial(_tool_result, tool))
            return fn

        return decorator

    def prompt(
        self,
        name: str | None = None,
        *,
        requires: Sequence[Capability] = (),
        max_rounds: int | None = None,
        deadline: float | None = None,
        max_state_bytes: int | None = None,
        **fastmcp_options: Any,
    ) -> Callable[[F], F]:
        """Register an async flow as a FastMCP prompt (`prompts/get` may take several rounds)."""
        reject_bare_use(name, "prompt")

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name or fn.__name__, max_rounds, deadline, max_state_bytes, requires)
            self.mcp.prompt(self._entry(fn, spec, refused_as_client_error(spec)), name=spec.name, **fastmcp_options)
            return fn

        return decorator

    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        requires: Sequence[Capability] = (),
        max_rounds: int | None = None,
        deadline: float | None = None,
        max_state_bytes: int | None = None,
        **fastmcp_options: Any,
    ) -> Callable[[F], F]:
        """Register an async flow as a FastMCP resource or resource template."""
        reject_bare_use(uri, "resource")

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name or fn.__name__, max_rounds, deadline, max_state_bytes, requires)
            entry = self._entry(fn, spec, refused_as_client_error(spec))
            self.mcp.resource(uri, name=spec.name, **fastmcp_options)(entry)
            return fn

        return decorator

    @property
    def runtime(self) -> TaskEngine:
        """The task engine (created, with the tasks extension, on first need)."""
        return self._tasks()

    async def send_event(self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None) -> bool:
        """Deliver event `name` to a durable task, from any instance (see `mrtr.Flows.send_event`)."""
        delivered: bool = await self._tasks().send_event(task_id, name, payload, event_id=event_id)
        return delivered

    async def _deliver_callback(self, task_id: str, name: str, payload: Any, event_id: str) -> bool:
        return await self.send_event(task_id, name, payload, event_id=event_id)

    # -- internals --------------------------------------------------------------------------

    def _tasks(self) -> TaskEngine:
        if self._extension is not None:
            return self._extension.engine
        engine = self._engine
        if engine is None:
            if self._store is None:
                from mrtr.stores._sqlite import SQLiteStore

                self._store = SQLiteStore("mrtr-tasks.db")  # the embedded default
                fleet.warn_about_default_store("mrtr-tasks.db")
            options = self._task_options | {"bind_principal": authenticated_principal}
            engine = self._engine = TaskRuntime(self._store, **options)
            engine.callbacks = self._callbacks
        else:
            options = self._task_options
            if self._callbacks is not None and hasattr(engine, "callbacks"):
                engine.callbacks = self._callbacks
            engine.configure(EngineOptions(options["ttl"], options["poll_interval"], authenticated_principal))
        self._extension = TasksExtension(engine)
        if internals.has_extension(self.mcp, TASKS_EXTENSION):
            raise RuntimeError(
                f"mrtr.fastmcp: this FastMCP server already has a {TASKS_EXTENSION} extension (fastmcp-tasks?); "
                "mrtr's durable tasks need that identifier: register mrtr task flows on a server without it"
            )
        bus, hears_every_task = self._task_bus(engine)
        if engine.on_change is None:
            engine.on_change = TaskEvents(bus).publish
        listen = ListenHandler(bus, self._extension if hears_every_task and engine.reports_every_change else None)
        serve_listen(self.mcp, listen)
        self.mcp.add_extension(FastMCPTasks(self._extension, bus if isinstance(bus, BrokerBus) else None))
        self.services.tasks = engine
        return engine

    def _task_bus(self, engine: TaskEngine) -> tuple[SubscriptionBus, bool]:
        """The bus for task notifications, and whether it hears every task change (see `Flows`)."""
        if self.bus is not None:
            return self.bus, True
        derive = getattr(engine.shared_store, "fleet_bus", None)
        bus = derive() if derive is not None and self._fleet_bus else None
        if bus is not None:
            self.bus = bus
            logger.info("mrtr: FastMCP server %r: task notifications ride the store's fleet bus", self.mcp.name)
            return bus, True
        self.bus = InMemorySubscriptionBus()
        if derive is not None:
            logger.warning(
                "mrtr: FastMCP server %r keeps an in-process bus beside a shared store: listens are acknowledged "
                "without task ids and task clients poll",
                self.mcp.name,
            )
            return self.bus, False
        return self.bus, engine.run_worker_here

    def _spec(
        self,
        fn: Callable[..., Any],
        name: str,
        max_rounds: int | None,
        deadline: float | None,
        max_state_bytes: int | None,
        requires: Sequence[Capability],
    ) -> FlowSpec:
        limits = flow_limits(fn, name, self.limits, max_rounds, deadline, max_state_bytes)
        ctx_param, style = _context_param(fn, name)
        if style == "mrtr" and ctx_param is not None:
            check_elicit_schemas(fn, name, ctx_param)
        spec = FlowSpec(
            name=name,
            fn=fn,
            ctx_param=ctx_param,
            limits=limits,
            audience=self.audience,
            requires=checked_capabilities(name, requires),
            wrap_context=functools.partial(_fastmcp_context, self.mcp) if style == "fastmcp" else None,
            strict=self.strict,
        )
        self.specs[name] = spec
        return spec

    def _entry(
        self, fn: Callable[..., Any], spec: FlowSpec, refused: Callable[[InputRefused], Exception]
    ) -> Callable[..., Any]:
        """A FastMCP-registrable function: the flow's signature without its context parameter."""
        services, security = self.services, self.state_security

        async def run(kwargs: dict[str, Any]) -> Any:
            ctx = get_context()
            wire = internals.request_wire(ctx)
            if wire is None:
                raise RuntimeError(f"flow {spec.name!r} runs only inside an MCP request")
            try:
                return await run_flow(spec, ctx, kwargs, services, wire=wire, state_security=security)
            except InputRefused as exc:
                raise refused(exc) from None
            except TaskCreated as created:
                box = created_box.get()
                if box is None:
                    raise
                box.append(created.result)
                # A result FastMCP passes through untouched; the tasks interceptor replaces it.
                return InputRequiredResult(request_state="mrtr:task-created")
            except MCPError as exc:  # issue #35: a client's mistake is one INFO line on FastMCP, not a traceback
                quiet = quiet_tool_error(exc) if refused is _refused_as_tool_error else None
                if quiet is None:
                    raise
                raise quiet from None

        return entry_point(fn, spec, run)


def _fastmcp_context(mcp: FastMCP[Any], flow: FlowContext) -> FlowsContext:
    """The request's FastMCP `Context`; in a durable task's run (no request), one bound to the server."""
    try:
        base = get_context()
    except RuntimeError:
        base = Context(fastmcp=mcp)
    return FlowsContext(flow, base)


def _context_param(fn: Callable[..., Any], flow: str) -> tuple[str | None, str]:
    """The flow's context parameter and its style: `mrtr` (FlowContext) or `fastmcp` (FastMCP's Context)."""
    hints = typing.get_type_hints(fn)
    for name, annotation in hints.items():
        if name == "return" or not inspect.isclass(annotation):
            continue
        if issubclass(annotation, FlowContext):
            return name, "mrtr"
        if issubclass(annotation, Context):
            return name, "fastmcp"
    for param in inspect.signature(fn).parameters.values():
        if param.name in ("ctx", "context") and param.annotation is inspect.Parameter.empty:
            raise FlowDefinitionError(
                f"flow {flow!r}: parameter {param.name!r} has no annotation, so it would be published as a "
                f"required argument; annotate it `{param.name}: mrtr.FlowContext` or `{param.name}: fastmcp.Context`"
            )
    return None, "none"  # a flow may also ask nothing and use only `mrtr.step` / `mrtr.gather`


def _tool_result(tool: FunctionTool, value: Any) -> CallToolResult:
    """A task flow's return value as its tool's `CallToolResult`, converted by FastMCP itself."""
    result = tool.convert_result(value)
    fields = {"content": result.content, "structuredContent": result.structured_content, "_meta": result.meta}
    return CallToolResult.model_validate({k: v for k, v in fields.items() if v is not None})


def _refused_as_tool_error(exc: InputRefused) -> Exception:
    return quiet_tool_error(exc) or ToolError(str(exc))  # a user who said no: INFO, not ERROR


__all__ = ["Flows"]
