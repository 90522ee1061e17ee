"""The host core: everything a `Flows` does that does not depend on its framework, written once.

`mrtr.Flows` (the SDK's `MCPServer`) and `mrtr.fastmcp.Flows` (FastMCP) are thin adapters:
each implements `mrtr._host.adapter.Host` over its framework and registers the function the
core builds (`HostCore.entry_point`) with the framework's own decorator. What the core holds:

- the options (`HostOptions`), the default limits and each flow's `FlowSpec`;
- the start-up checks: the state key, the store (`require_shared_store`), the guard;
- the round policies: the replay guard (on by default wherever a shared store is configured)
  and load shedding;
- every request of every flow (`call`: the engine's answer as a typed `Outcome`, which each
  adapter only translates to its framework);
- the task engine (mrtr's lease runtime over `store`, or another `TaskEngine`), its tasks
  extension, the bus its notifications ride, callback URLs and `send_event`.

So a keyword, a default, a warning or an error is the same on both hosts by construction.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp.server.extension import MethodBinding
from mcp.server.request_state import RequestStateCodec, authenticated_principal
from mcp.server.subscriptions import SubscriptionBus

from mrtr._engine.asks import Capability
from mrtr._engine.context import FlowContext
from mrtr._engine.round import RoundPolicy, Services
from mrtr._engine.spec import FlowSpec, Limits
from mrtr._errors import FlowDefinitionError
from mrtr._guard import GUARD_OUTAGES, ReplayGuard, open_guard
from mrtr._host import call, fleet
from mrtr._host.checks import calls_flow_api, check_elicit_schemas, context_class, context_param
from mrtr._host.identity import FirstRounds
from mrtr._host.options import HostOptions, ToolOptions
from mrtr._host.registration import checked_capabilities, flow_limits, one_step
from mrtr._host.versions import ServedVersions, served_versions
from mrtr._shedding import LoadShedder
from mrtr.buses._base import BrokerBus
from mrtr.stores._abilities import is_shared, redacted
from mrtr.stores._sealed import RecordSeal
from mrtr.tasks._callbacks import PATH as CALLBACK_PATH
from mrtr.tasks._callbacks import CallbackUrls
from mrtr.tasks._callbacks import endpoint as callback_endpoint
from mrtr.tasks._events import TaskEvents
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler
from mrtr.tasks._runtime import TaskRuntime
from mrtr.tasks._seam import ConvertResult, EngineOptions, PrincipalBinder, TaskEngine
from mrtr.tasks._start import HostStarter

if TYPE_CHECKING:
    from mrtr._host.adapter import Host

logger = logging.getLogger("mrtr.fleet")

DEFAULT_STORE = "tasks-{server}.db"
"""The SQLite file durable tasks fall back to without `store=` (one host's only), in
`default_state_dir()`: one per server name, never in the working directory."""


def default_state_dir() -> Path:
    """Where mrtr keeps a user's own state: `$MRTR_STATE_DIR`, else the per-user state directory
    (`$XDG_STATE_HOME/mrtr`, `~/.local/state/mrtr`; `%LOCALAPPDATA%\\mrtr` on Windows)."""
    explicit = os.environ.get("MRTR_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "mrtr"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "mrtr"


def default_store_path(server: str) -> Path:
    """The default task store of server `server`: `default_state_dir()/tasks-<server>.db`."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", server).strip("._") or "server"
    return default_state_dir() / DEFAULT_STORE.format(server=safe[:80])


TaskDialect = Callable[[TasksExtension], list[MethodBinding]]


class HostCore:
    """One `Flows`' state and decisions, whatever its framework (see the module docstring)."""

    def __init__(self, host: Host, options: HostOptions, *, task_dialect: TaskDialect | None = None) -> None:
        self.host = host
        self.options = opts = options
        self.limits = Limits(
            max_rounds=opts.max_rounds,
            deadline=opts.deadline,
            max_state_bytes=opts.max_state_bytes,
            task_max_rounds=opts.task_max_rounds,
        )
        self.specs: dict[str, FlowSpec] = {}
        fleet.check_state_key(host, required=opts.require_shared_key)
        if opts.protocol_versions is not None:
            served = served_versions(opts.protocol_versions, opts.dialects)
            host.server_middleware().insert(0, ServedVersions(served))  # outermost: before anything reads the request
        self.record_seal = self._record_seal()
        """The server's key ring for what this instance keeps at rest (task records, kept round
        outcomes); None with `seal_at_rest=False`."""
        if opts.require_shared_store:
            self._require_shared_store()
        self.callbacks = None if opts.public_url is None else CallbackUrls(opts.public_url, host.state_security)
        if self.callbacks is not None:
            path = f"{CALLBACK_PATH}/{{task_id}}/{{name}}/{{token}}"
            host.add_route(path, callback_endpoint(lambda: self.callbacks, self._deliver_callback), ["POST"])
        self.replay_guard = self._guard()
        self.first_rounds = self._first_rounds()
        """Round 1 of a call, once fleet-wide where its resend can be told from a new call
        (`mrtr._host.identity`); None without a guard whose ledger keeps progress."""
        self.shedder = LoadShedder.from_options(
            opts.max_inflight_rounds, opts.max_loop_lag, opts.shed_when, opts.shed_clients
        )
        policies: tuple[RoundPolicy, ...] = tuple(
            p for p in (self.first_rounds, self.replay_guard, self.shedder) if p is not None
        )
        self.services = Services(policies=policies)
        """What this instance lends its flows' rounds (the engine sees only these shapes)."""
        self.call = functools.partial(call.run_request, self.services)
        """Run one request of a flow with these services: `call(spec, request, arguments, *, wire=None,
        state_security=None)`, how it ended as an `Outcome` (`mrtr._host.call`) for the adapter to
        translate. Bound once, so a round pays for no extra frame."""
        self.bus: SubscriptionBus | None = None
        """The bus listen streams and task notifications ride (chosen with the task engine)."""
        self.listen: ListenHandler | None = None
        """What serves `subscriptions/listen`, with task ids when the bus hears every task (set with the engine)."""
        self._fleet_bus: BrokerBus | None = None
        self._engine: TaskEngine | None = None
        self._serving = 0
        """How many lifespans have entered `running()` and not yet left it."""
        self._task_dialect = task_dialect
        if opts.store is not None or opts.tasks is not None or task_dialect is not None:
            self.engine()  # a fleet's store is known now: choose its bus and adopt orphaned tasks from boot

    # -- start-up decisions ------------------------------------------------------------------

    def _require_shared_store(self) -> None:
        opts = self.options
        if opts.tasks is not None:
            engine = opts.tasks.engine if isinstance(opts.tasks, TasksExtension) else opts.tasks
            store = engine.shared_store
            if store is None or is_shared(store):  # an engine of its own (Temporal), or a shared store
                return
            fleet.refuse_unshared_store(self.host, f"the task engine's store ({type(store).__name__})")
        if opts.store is None:
            where = str(default_store_path(self.host.name))
            fleet.refuse_unshared_store(self.host, f"the default SQLite file {where!r} (no store= given)")
        if not is_shared(opts.store):
            fleet.refuse_unshared_store(self.host, f"a {type(opts.store).__name__}")

    def _guard(self) -> ReplayGuard | None:
        """The replay guard: the option's, or by default the shared store's (see `FlowsOptions.replay_guard`)."""
        value, outage = self.options.replay_guard, self.options.replay_guard_outage
        if outage is not None and outage not in GUARD_OUTAGES:
            raise FlowDefinitionError(
                f"Flows(replay_guard_outage={outage!r}): use one of {list(GUARD_OUTAGES)} (default 'fail_closed')"
            )
        if value is False:
            fleet.log_guard(self.host, None)
            return None
        if value is None or value is True:
            store = self.options.store
            if not is_shared(store):
                if value is True:
                    raise FlowDefinitionError(
                        "Flows(replay_guard=True) records rounds in the shared store: give store= a Redis or "
                        "PostgreSQL store, or replay_guard= a store URL"
                    )
                return None  # one host's store, or none: nothing the fleet shares to record rounds in
            guard = ReplayGuard(store)
            where = store.where
        else:
            guard = open_guard(value) if isinstance(value, str) else value
            where = redacted(value) if isinstance(value, str) else type(guard.ledger).__name__
        if outage is not None:
            guard.on_outage = outage
        if guard.on_outage == "degrade":
            logger.info("replay guard: rounds run unguarded while its store does not answer (replay_guard_outage)")
        if guard.seal is None:
            guard.seal = self.record_seal
        if guard.state_ttl is None:
            security = self.host.state_security()
            guard.state_ttl = float(security.ttl) if security is not None else None
        fleet.log_guard(self.host, where)
        return guard

    def _first_rounds(self) -> FirstRounds | None:
        """Resent first rounds join their first copy wherever the guard's ledger keeps progress."""
        guard = self.replay_guard
        if guard is None or not FirstRounds.available(guard):
            return None
        return FirstRounds(guard, self.options.request_id_header, lambda wire: self.bind_principal()(wire))

    # -- specs -------------------------------------------------------------------------------

    def spec(
        self,
        fn: Callable[..., Any],
        name: str | None,
        flow: ToolOptions,
        *,
        host_context: type | None = None,
        wrap_host_context: Callable[[Any], Any] | None = None,
    ) -> FlowSpec:
        """The flow's `FlowSpec`, checked and remembered under its name (`name`, else the function's).

        `flow` is what `mrtr._host.options.flow_options` let through. A flow may take the host's
        own context class (`host_context`, FastMCP's `Context`) in place of `FlowContext`: its
        context is then `wrap_host_context(flow_context)`, and its asks' schemas are the
        framework's to check.

        A task flow that takes no context and never steps is one step as a whole, so a worker
        that dies mid-call runs it again on another instance under the same
        `mrtr.current_step().idempotency_key` (at least once), on both hosts.
        """
        name = name or fn.__name__
        task, mrtr_first = flow.get("task", "never"), flow.get("mrtr_first", False)
        ctx_param = context_param(fn, name, host_context=host_context, task=task != "never")
        wrap_context = None
        if ctx_param is not None and host_context is not None:
            kind = context_class(typing.get_type_hints(fn).get(ctx_param), (FlowContext, host_context), name, ctx_param)
            if kind is not None and not issubclass(kind, FlowContext):
                wrap_context = wrap_host_context
        limits = flow_limits(
            fn,
            name,
            self.limits,
            flow.get("max_rounds"),
            flow.get("deadline"),
            flow.get("max_state_bytes"),
            flow.get("task_max_rounds"),
        )
        requires: Sequence[Capability] = flow.get("requires", ())
        body = fn
        if ctx_param is None and task != "never" and not calls_flow_api(fn):
            body = one_step(fn)  # a durable task that never asks or steps: the whole call is one step
        elif ctx_param is not None and wrap_context is None:
            check_elicit_schemas(fn, name, ctx_param)
        spec = FlowSpec(
            name=name,
            fn=body,
            ctx_param=ctx_param,
            limits=limits,
            audience=self.audience,
            task=task,
            mrtr_first=mrtr_first,
            requires=checked_capabilities(name, requires),
            wrap_context=wrap_context,
            strict=self.options.strict,
        )
        self.specs[name] = spec
        return spec

    @property
    def audience(self) -> str:
        """The audience sealed into every `requestState`: the policy's own, else the server's name."""
        security = self.host.state_security()
        return (security.audience if security is not None else None) or self.host.name

    # -- tasks -------------------------------------------------------------------------------

    def register_task(self, spec: FlowSpec, convert: ConvertResult) -> None:
        """Serve `spec` as a task flow; its result converted by `convert` (the framework's own conversion)."""
        self.engine().register(spec, convert)

    @property
    def has_engine(self) -> bool:
        """Whether a task engine exists yet (it is created on first need)."""
        return self._engine is not None

    def engine(self) -> TaskEngine:
        """The task engine, created with its extension, bus and listen handler on first need."""
        if self._engine is None:
            self._engine = self._start_tasks()
        return self._engine

    def _start_tasks(self) -> TaskEngine:
        opts, host = self.options, self.host
        given = opts.tasks
        extension: TasksExtension | None = None
        engine: TaskEngine
        if isinstance(given, TasksExtension):  # built by the user, options and all
            extension, engine = given, given.engine
        elif given is not None:  # another engine (e.g. mrtr.temporal.TemporalTasks): same wire layer
            engine = given
            engine.configure(self._engine_options())
        else:
            engine = TaskRuntime(self._store(), self._engine_options())
        if extension is None:
            extension = TasksExtension(engine, dialect=self._task_dialect)
        self.services.tasks = HostStarter(engine)
        built_with = host.given_bus()
        if opts.bus is not None and built_with is not None and built_with is not opts.bus:
            raise FlowDefinitionError(
                f"server {host.name!r} was built with a bus of its own and Flows(bus=...) names another: give one"
            )
        bus, hears = fleet.choose_bus(
            host,
            opts.store if opts.store is not None else engine.shared_store,
            given=opts.bus or built_with,
            fleet_bus=opts.fleet_bus,
            engine_spans_fleet=not isinstance(engine, TaskRuntime),
            worker_here=engine.run_worker_here,
        )
        self.bus = host.use_bus(bus)
        self._fleet_bus = self.bus if isinstance(self.bus, BrokerBus) else None
        if engine.on_change is None:
            engine.on_change = TaskEvents(self.bus).publish
        # A bus that cannot hear every change (an in-process bus on a fleet) or an engine that
        # cannot report every change (`reports_every_change = False`) leaves task ids out of
        # listen acknowledgements, so clients poll instead of waiting on silence.
        self.listen = ListenHandler(self.bus, extension if hears and engine.reports_every_change else None)
        host.install_tasks(extension, self.listen, self.running)
        return engine

    def _engine_options(self) -> EngineOptions:
        """The task options, once: the lease runtime is built with them, another engine configured."""
        opts = self.options
        return EngineOptions(
            ttl=opts.task_ttl,
            poll_interval=opts.task_poll_interval,
            bind_principal=self.bind_principal(),
            callbacks=self.callbacks,
            seal=self.record_seal,
            lease=opts.task_lease,
            scan_interval=opts.task_scan_interval,
        )

    def _record_seal(self) -> RecordSeal | None:
        """The server's key ring for records at rest (read on first use: the SDK installs its
        policy late); None with `seal_at_rest=False`, which is said once at start-up."""
        host = self.host
        fleet.log_sealing(host, self.options.seal_at_rest)
        if not self.options.seal_at_rest:
            return None

        def codec() -> RequestStateCodec | None:
            security = host.state_security()
            return security.codec if security is not None and host.shares_state_key() else None

        return RecordSeal(codec)

    def bind_principal(self) -> PrincipalBinder:
        """Who sent a request, as the server's `RequestStateSecurity` binds it (the SDK's default if
        it sets none): tasks belong to exactly the principal `requestState` is bound to."""
        security = self.host.state_security()
        if security is not None and security.bind_principal is not None:
            return security.bind_principal
        return authenticated_principal

    def _store(self) -> Any:
        store = self.options.store
        if store is None:
            from mrtr.stores._sqlite import SQLiteStore

            path = default_store_path(self.host.name)  # the embedded default, never in the working directory
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            store = SQLiteStore(str(path))
            fleet.warn_about_default_store(str(path))
        return store

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """This instance's background work while the server serves: the fleet bus and the task worker.

        The worker adopts orphaned tasks from boot, not only once a `tasks/*` request arrives,
        and stops with the server (its leases lapse, so another instance resumes). Entered
        however the server is served (the `Host.install_tasks` contract); nested entries (an
        in-process client per connection, an app whose lifespan wraps the server's) share one
        start and one stop: the first in starts, the last out stops.
        """
        self._serving += 1
        try:
            if self._serving == 1:
                await self._start_serving()
            yield
        finally:
            self._serving -= 1
            if self._serving == 0:
                await self._stop_serving()

    async def _start_serving(self) -> None:
        bus, engine = self._fleet_bus, self._engine
        if bus is not None:  # subscribe before serving, so the first listen stream never waits
            try:
                await bus.start(timeout=5.0)
            except TimeoutError:
                logger.warning("the fleet bus could not reach its broker at start; it keeps trying in the background")
        if engine is not None:
            engine.ensure_running()

    async def _stop_serving(self) -> None:
        bus, engine = self._fleet_bus, self._engine
        try:
            if self.replay_guard is not None:  # the outcomes of rounds that already answered
                await self.replay_guard.drain()
            if engine is not None:
                await engine.close()
        finally:
            if bus is not None:
                await bus.close()

    async def send_event(self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None) -> bool:
        """`Flows.send_event` (see `mrtr._host.base.BaseFlows.send_event`)."""
        delivered: bool = await self.engine().send_event(task_id, name, payload, event_id=event_id)
        return delivered

    def _deliver_callback(self, task_id: str, name: str, payload: Any, event_id: str) -> Awaitable[bool]:
        return self.send_event(task_id, name, payload, event_id=event_id)


__all__ = ["DEFAULT_STORE", "HostCore", "TaskDialect", "default_state_dir", "default_store_path"]
