"""`Flows`: register flow functions as tools, prompts and resources of an `MCPServer`.

A flow is registered through the SDK's own decorators, wrapped in a function whose
signature is the flow's with the `FlowContext` parameter swapped for the SDK `Context`.
So names, descriptions, input and output schemas, argument validation and result
conversion are exactly what `@server.tool()` gives; only the body runs under the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts import Prompt
from mcp.server.mcpserver.utilities.func_metadata import func_metadata
from mcp.shared.uri_template import UriTemplate
from mcp_types import Annotations, Icon, ToolAnnotations
from starlette.applications import Starlette

from mrtr import _answer_edge as answer_edge
from mrtr import _fleet as fleet
from mrtr import _sdk as sdk
from mrtr._checks import check_elicit_schemas, flow_context_param, plain_function
from mrtr._dialects import Dialects
from mrtr._engine.asks import Capability
from mrtr._engine.engine import run_flow
from mrtr._engine.round import Services
from mrtr._engine.spec import FlowSpec, Limits, TaskSupport
from mrtr._errors import InputRefused
from mrtr._guard import ReplayGuard, as_guard
from mrtr._registration import (
    checked_capabilities,
    entry_point,
    flow_limits,
    one_step,
    refused_as_client_error,
    reject_bare_use,
)
from mrtr._sdk import install_extension  # noqa: F401  (was defined here; kept importable)
from mrtr._shedding import LoadShedder, ShedClients
from mrtr._static_resources import StaticResourceFlows
from mrtr.buses._base import BrokerBus
from mrtr.stores import TaskStore
from mrtr.tasks._callbacks import PATH as CALLBACK_PATH
from mrtr.tasks._callbacks import CallbackUrls
from mrtr.tasks._callbacks import endpoint as callback_endpoint
from mrtr.tasks._events import TaskEvents
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler
from mrtr.tasks._runtime import TaskRuntime, task_principal
from mrtr.tasks._seam import EngineOptions, TaskEngine

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("mrtr.flows")


async def _start_bus(bus: BrokerBus) -> None:
    """Subscribe before serving, so the first listen stream never waits; a broker that is down is not fatal."""
    try:
        await bus.start(timeout=5.0)
    except TimeoutError:
        logger.warning("the fleet bus could not reach its broker at start; it keeps trying in the background")


class Flows:
    """Adds flows to an existing `MCPServer`.

    Args:
        server: The official SDK server to register on. Its `request_state_security`
            seals every journal; share its keys (and its name) across a fleet.
        max_rounds: Default cap on client round trips per flow: 10, the official `mcp.Client`'s own
            default (`input_required_max_rounds`), so both stop at the same round; raise both together.
        deadline: Default seconds a flow may take from its first round; never renewed.
        max_state_bytes: Default cap on the sealed `requestState`.
        store: Where durable tasks live (`SQLiteStore`, `RedisStore`, `PostgresStore`);
            share one across the fleet. Defaults to `SQLiteStore("mrtr-tasks.db")` once a
            task flow is registered.
        task_lease: Seconds a silent worker keeps a task before another instance takes over.
        task_ttl: Seconds a task stays readable after creation (`None`: forever).
        task_poll_interval: The `pollIntervalMs` clients are told, in seconds.
        task_scan_interval: Seconds between this instance's looks for orphaned tasks.
        replay_guard: Make every round's `requestState` single-use fleet-wide: a store URL
            (`redis://...`, `postgresql://...`, `sqlite:///PATH`, as `mrtr.open_store`) or a
            `mrtr.ReplayGuard` (see `mrtr.ReplayGuard`). Off by default.
        max_inflight_rounds: Shed load (see `mrtr.LoadShedder`) while more MRTR rounds than
            this run on this instance.
        max_loop_lag: Shed load while the event loop runs timers this many seconds late.
        shed_when: Shed load while this callable returns True.
        shed_clients: Which clients a round may be shed to, `(client_info, capabilities) ->
            bool`; by default only (clients known to resend a
            state-only result: those declaring `mrtr/shedding`, like mrtr's own, and the
            official Python SDK's). Other clients' rounds run on (hosts such as claude.ai's
            connector show a state-only result as an error and never resend it).
        tasks: The task engine: by default mrtr's lease runtime over `store`; or another
            `mrtr.tasks.TaskEngine`, e.g. `mrtr.temporal.TemporalTasks(client,
            task_queue=...)` (tasks run as Temporal workflows; `store` and the lease options
            are then unused, `task_ttl` and `task_poll_interval` still apply); or a
            `mrtr.tasks.TasksExtension` you already gave the server at construction
            (`MCPServer(extensions=[...])`, the SDK's public route). Without one, `Flows`
            installs the extension itself when the first task flow is registered.
        dialects: Also serve the seeds' pre-standard wire shapes, any of `"sketch"`, `"draft"`
            (seed 001: its rounds, and its persistent workflow on tasks: `params.task`,
            `tasks/result`, the `input_responses` message), `"incomplete"`, `"saga"` and
            `"sep-2322-tasks"` (SEP-2322's later camelCase `tasks/result` +
            `tasks/input_response` beside the tasks extension); none by default (the tasks
            extension requires `tasks/result` to be unknown on its own wire). One name per dialect.
        fleet_bus: With a shared store (Redis, PostgreSQL) and no `MCPServer(subscriptions=...)`
            of its own, the server gets a fleet bus on the store's broker, so a listen stream
            hears of changes made on any instance (logged at start-up on logger `mrtr.fleet`). `False` keeps
            the SDK's in-process bus: listens are then acknowledged without task ids, and task
            clients poll. An explicit `subscriptions=` always wins.
        require_shared_key: Refuse to start (`FlowDefinitionError`) when the server seals
            `requestState` with a key only this process holds, instead of warning: a fleet then
            fails at deploy time, not after its users answered.
        instance_name: Name this instance in an `X-Mrtr-Instance` header on every response of
            `flows.streamable_http_app()` (`mrtr call` shows it per round; handy behind a load
            balancer). None (the default): no header.
        public_url: The fleet's base URL as outside systems reach it (`https://mcp.example.com`):
            `ctx.callback_url(name)` mints URLs under `<public_url>/mrtr/events/`, served by
            every instance's `streamable_http_app()`. None (the default): no callback URLs.
        strict: Log every replay of a flow's body at WARNING on logger `mrtr.replay` (DEBUG
            otherwise): code outside `ctx.step` runs again each round. `mrtr.testing.run_rounds`
            counts what ran more than once.
    """

    def __init__(
        self,
        server: MCPServer[Any],
        *,
        store: TaskStore | None = None,
        max_rounds: int = 10,
        deadline: float = 3600.0,
        max_state_bytes: int = 64 * 1024,
        task_lease: float = 10.0,
        task_ttl: float | None = 3600.0,
        task_poll_interval: float = 0.5,
        task_scan_interval: float = 1.0,
        replay_guard: str | ReplayGuard | None = None,
        max_inflight_rounds: int | None = None,
        max_loop_lag: float | None = None,
        shed_when: Callable[[], bool] | None = None,
        shed_clients: ShedClients | None = None,
        tasks: TasksExtension | TaskEngine | None = None,
        dialects: Sequence[str] = (),
        fleet_bus: bool = True,
        require_shared_key: bool = False,
        instance_name: str | None = None,
        strict: bool = False,
        public_url: str | None = None,
    ) -> None:
        self.server = server
        self._callbacks = None if public_url is None else CallbackUrls(public_url, lambda: sdk.state_security(server))
        if self._callbacks is not None:
            route = server.custom_route(f"{CALLBACK_PATH}/{{task_id}}/{{name}}/{{token}}", methods=["POST"])
            route(callback_endpoint(lambda: self._callbacks, self._deliver_callback))
        self.strict = strict
        sdk.track_default_keys()  # for servers built after this one (this one was built before)
        if require_shared_key:
            fleet.require_shared_key(server)
        else:
            fleet.warn_about_state_key(server)
        self.instance_name = instance_name
        """Sent as `X-Mrtr-Instance` on every response of `streamable_http_app()` (None: no header)."""
        self._dialects = Dialects(server, dialects) if dialects else None
        task_dialect = self._dialects.task_methods if self._dialects is not None else None
        # However the server is served (`flows.streamable_http_app()`, `server.streamable_http_app()`,
        # `server.run()`), its task worker starts with it and adopts orphaned tasks from boot.
        sdk.wrap_lifespan(server, self._worker_started)
        self.replay_guard = as_guard(replay_guard, server)
        self.shedder = LoadShedder.from_options(max_inflight_rounds, max_loop_lag, shed_when, shed_clients)
        policies = tuple(p for p in (self.replay_guard, self.shedder) if p is not None)
        self.services = Services(policies=policies)
        """What this instance lends its flows' rounds (the engine sees only these shapes)."""
        self.limits = Limits(max_rounds=max_rounds, deadline=deadline, max_state_bytes=max_state_bytes)
        self._static = StaticResourceFlows(server)
        answer_edge.install(sdk.lowlevel_server(server))  # issue #35: a malformed answer is named, not bare -32602
        self.specs: dict[str, FlowSpec] = {}
        """Every flow registered here, by name (replay tests look flows up in it)."""
        self._store = store
        binder = task_principal(server)
        self._task_options = {
            "lease": task_lease,
            "ttl": task_ttl,
            "poll_interval": task_poll_interval,
            "scan_interval": task_scan_interval,
            "bind_principal": binder,
        }
        self._runtime: TaskEngine | None = None
        self._task_dialect = task_dialect
        engine = tasks.engine if isinstance(tasks, TasksExtension) else tasks
        self._bus_hears_every_task = fleet.choose_bus(
            server,
            store if store is not None else (engine.shared_store if engine is not None else None),
            fleet_bus=fleet_bus,
            engine_spans_fleet=engine is not None and not isinstance(engine, TaskRuntime),
            worker_here=engine.run_worker_here if engine is not None else True,
        )
        self.bus = sdk.subscription_bus(server)
        """The server's `SubscriptionBus` (`MCPServer(subscriptions=mrtr.open_bus(url))` on a fleet)."""
        # `subscriptions/listen` as the SDK serves it, plus the tasks extension's `taskIds`.
        self._listen = ListenHandler(self.bus) if sdk.serves_listen(server) else None
        if self._listen is not None:
            sdk.serve_listen(server, self._listen)
        if isinstance(tasks, TasksExtension):  # the public route: MCPServer(extensions=[tasks]) at construction
            self._runtime = self.services.tasks = tasks.engine
            self._notify_tasks(tasks)
        elif tasks is not None:  # another engine (e.g. mrtr.temporal.TemporalTasks): same wire layer
            tasks.configure(EngineOptions(ttl=task_ttl, poll_interval=task_poll_interval, bind_principal=binder))
            self._runtime = self.services.tasks = tasks
            extension = TasksExtension(tasks, dialect=task_dialect)
            sdk.install_extension(self.server, extension)
            self._notify_tasks(extension)
        elif store is not None or task_dialect is not None:
            self._tasks()

    @contextlib.asynccontextmanager
    async def _worker_started(self) -> AsyncIterator[None]:
        if self._runtime is not None:
            self._runtime.ensure_running()
        yield

    @property
    def runtime(self) -> Any:
        """The task engine: a `TaskRuntime` unless another was given (created, with the tasks
        extension, on first need)."""
        return self._tasks()

    def _tasks(self) -> TaskEngine:
        if self._runtime is None:
            if self._store is None:
                from mrtr.stores._sqlite import SQLiteStore

                self._store = SQLiteStore("mrtr-tasks.db")  # the embedded default
                fleet.warn_about_default_store("mrtr-tasks.db")
            self._runtime = TaskRuntime(self._store, **self._task_options)  # type: ignore[arg-type]
            extension = TasksExtension(self._runtime, dialect=self._task_dialect)
            sdk.install_extension(self.server, extension)
            self.services.tasks = self._runtime
            self._notify_tasks(extension)
        return self._runtime

    async def send_event(self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None) -> bool:
        """Deliver event `name` with a JSON `payload` to a durable task, from any instance.

        The task's `ctx.wait_for_event(name)` returns `payload`; an event that comes before
        the flow waits for it is kept in the task's record until it does. Idempotent per
        `event_id`: a resend returns False and changes nothing (None: a fresh id, so every
        call delivers).

        Raises:
            mrtr.EventNotDelivered: The task is unknown or expired, or finished.
            ValueError: A malformed name, or a payload that is not JSON or too large.
        """
        delivered: bool = await self._tasks().send_event(task_id, name, payload, event_id=event_id)
        return delivered

    async def _deliver_callback(self, task_id: str, name: str, payload: Any, event_id: str) -> bool:
        return await self.send_event(task_id, name, payload, event_id=event_id)

    def _notify_tasks(self, extension: TasksExtension) -> None:
        """Publish task state changes on the server's bus; let listen streams watch task ids."""
        engine = extension.engine
        if self._callbacks is not None and hasattr(engine, "callbacks"):
            engine.callbacks = self._callbacks
        if self.bus is not None and engine.on_change is None:
            engine.on_change = TaskEvents(self.bus).publish
        # A bus that cannot hear every change (the in-process bus on a fleet) or an engine that
        # cannot report every change (`reports_every_change = False`) leaves task ids out of
        # the acknowledgement, so clients poll instead of waiting on silence.
        if self._listen is not None and self._bus_hears_every_task and engine.reports_every_change:
            self._listen.tasks = extension

    def streamable_http_app(self, **options: Any) -> Starlette:
        """`server.streamable_http_app(**options)`, with this instance's task worker tied to its lifespan.

        The worker then adopts orphaned tasks from boot, not only once a `tasks/*` request
        arrives, and stops with the app (its leases lapse, so another instance resumes).
        """
        app = self.server.streamable_http_app(**options)
        if self._dialects is not None:
            self._dialects.mount(app, options.get("streamable_http_path", "/mcp"))
        if self.instance_name is not None:
            app.add_middleware(_InstanceHeader, name=self.instance_name)
        runtime = self._runtime
        bus = self.bus if isinstance(self.bus, BrokerBus) else None
        if runtime is None and bus is None:
            return app
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(instance: Starlette) -> AsyncIterator[Any]:
            async with inner(instance) as state:
                if bus is not None:
                    await _start_bus(bus)
                if runtime is not None:
                    runtime.ensure_running()
                try:
                    yield state
                finally:
                    if runtime is not None:
                        await runtime.close()
                    if bus is not None:
                        await bus.close()

        app.router.lifespan_context = lifespan
        return app

    def tool(
        self,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        icons: list[Icon] | None = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
        *,
        task: TaskSupport = "never",
        mrtr_first: bool = False,
        requires: Sequence[Capability] = (),
        max_rounds: int | None = None,
        deadline: float | None = None,
        max_state_bytes: int | None = None,
    ) -> Callable[[F], F]:
        """Register an async flow function as a tool (same metadata options as `@server.tool()`).

        `task="optional"` runs the call as a durable task when the client declares the tasks
        extension (and inline otherwise); `task="required"` refuses clients that do not
        (-32021). The same body serves every case: in a task, its asks park the task in
        `input_required` until `tasks/update` answers. With `mrtr_first=True` the call
        first asks inline, as MRTR rounds, and becomes a task at its first step or
        `ctx.continue_as_task()` (SEP-2663's composition). `requires=["sampling", ...]`
        names the client capabilities the flow will need: a request that lacks one fails
        with -32021 in round 1, before the user has answered anything.
        """
        reject_bare_use(name, "tool")
        if task not in ("never", "optional", "required"):
            raise ValueError(f"task must be 'never', 'optional' or 'required', not {task!r}")

        def decorator(fn: F) -> F:
            runtime = self._tasks() if task != "never" else None
            spec = self._spec(fn, name or fn.__name__, max_rounds, deadline, max_state_bytes, task)
            spec = self.specs[spec.name] = dataclasses.replace(
                spec, mrtr_first=mrtr_first, requires=checked_capabilities(spec.name, requires)
            )
            wrapper = _sdk_entry_point(fn, spec, self.services, refused=_refused_as_tool_error)
            if runtime is not None:
                shape = func_metadata(wrapper, skip_names=[spec.request_param], structured_output=structured_output)
                runtime.register(spec, shape.convert_result)
            self.server.add_tool(
                wrapper,
                name=spec.name,
                title=title,
                description=description,
                annotations=annotations,
                icons=icons,
                meta=meta,
                structured_output=structured_output,
            )
            return fn

        return decorator

    def prompt(
        self,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        icons: list[Icon] | None = None,
        *,
        max_rounds: int | None = None,
        deadline: float | None = None,
        max_state_bytes: int | None = None,
    ) -> Callable[[F], F]:
        """Register an async flow function as a prompt (`prompts/get` may take several rounds)."""
        reject_bare_use(name, "prompt")

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name or fn.__name__, max_rounds, deadline, max_state_bytes)
            wrapper = _sdk_entry_point(fn, spec, self.services, refused=refused_as_client_error(spec))
            prompt = Prompt.from_function(wrapper, name=spec.name, title=title, description=description, icons=icons)
            self.server.add_prompt(prompt)
            return fn

        return decorator

    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        icons: list[Icon] | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
        max_rounds: int | None = None,
        deadline: float | None = None,
        max_state_bytes: int | None = None,
    ) -> Callable[[F], F]:
        """Register an async flow function as a resource; `uri` may be a template or a fixed URI."""
        reject_bare_use(uri, "resource")

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name or fn.__name__, max_rounds, deadline, max_state_bytes)
            wrapper = _sdk_entry_point(fn, spec, self.services, refused=refused_as_client_error(spec))
            options: dict[str, Any] = dict(
                name=name, title=title, description=description, mime_type=mime_type,
                icons=icons, annotations=annotations, meta=meta,
            )  # fmt: skip
            if UriTemplate.parse(uri).variable_names:
                self.server.resource(uri, **options)(wrapper)
            else:
                # The SDK gives fixed-URI resources no Context; those are served by middleware.
                self._static.add(uri, spec, wrapper, options)
            return fn

        return decorator

    def _spec(
        self,
        fn: Callable[..., Any],
        name: str,
        max_rounds: int | None,
        deadline: float | None,
        max_state_bytes: int | None,
        task: TaskSupport = "never",
    ) -> FlowSpec:
        limits = flow_limits(fn, name, self.limits, max_rounds, deadline, max_state_bytes)
        body: Callable[..., Any] = fn
        ctx_param: str | None = None
        if task != "never" and plain_function(fn):
            body = one_step(fn)  # a durable task that never asks: the whole call is one step
        else:
            ctx_param = flow_context_param(fn, name)
            check_elicit_schemas(fn, name, ctx_param)
        spec = FlowSpec(
            name=name,
            fn=body,
            ctx_param=ctx_param,
            limits=limits,
            audience=sdk.state_audience(self.server),
            task=task,
            strict=self.strict,
        )
        self.specs[name] = spec
        return spec


class _InstanceHeader:
    """ASGI middleware: `X-Mrtr-Instance: <name>` on every HTTP response (`Flows(instance_name=...)`)."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.header = (b"x-mrtr-instance", name.encode("latin-1", "replace"))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, stamped)


def _refused_as_tool_error(exc: InputRefused) -> Exception:
    return ToolError(str(exc))


def _sdk_entry_point(
    fn: Callable[..., Any], spec: FlowSpec, services: Services, refused: Callable[[InputRefused], Exception]
) -> Callable[..., Any]:
    """An SDK-registrable function: the flow's signature, with the SDK `Context` injected."""
    request_param = spec.request_param

    async def run(kwargs: dict[str, Any]) -> Any:
        request = kwargs.pop(request_param)
        try:
            return await run_flow(spec, request, kwargs, services)
        except InputRefused as exc:
            raise refused(exc) from None

    injected = inspect.Parameter(request_param, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    return entry_point(fn, spec, run, extra=[injected])


__all__ = ["Flows"]
