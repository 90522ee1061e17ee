"""The one place mrtr reaches into the official SDK's internals (tested against mcp 2.3).

Everything else in mrtr uses the SDK's public API. What is here has no public route yet,
and every use is guarded: if an SDK release moves a name, the error names it and the
version mrtr expects, at start-up where possible, instead of failing deep in a request.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import TYPE_CHECKING, Any, cast

from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp_types import _v2025_11_25, _v2026_07_28
from mcp_types.methods import CLIENT_RESULTS
from pydantic import BaseModel, TypeAdapter

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    import httpx2
    from mcp.client.session import ClientSession
    from mcp.server.extension import Extension
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.session import ServerSession
    from mcp.server.subscriptions import SubscriptionBus
    from mcp.shared.dispatcher import CallOptions


EXPECTED = "mcp>=2.3,<2.4"

# Through `cast`: with a warm incremental cache, mypy takes this union alias for a value.
FORM_FIELD = TypeAdapter[Any](cast(Any, _v2025_11_25.PrimitiveSchemaDefinition))
"""Validates one elicitation form field against the spec's `PrimitiveSchemaDefinition` (the SDK's
own gate for form fields; no public route yet)."""


_MODERN_CLIENT_RESULTS: dict[str, type[BaseModel]] = {
    "sampling/createMessage": _v2026_07_28.CreateMessageResult,
    "roots/list": _v2026_07_28.ListRootsResult,
    "elicitation/create": _v2026_07_28.ElicitResult,
}
_client_results: dict[tuple[str, str], TypeAdapter[Any]] = {}


def client_result_schema(method: str, version: str) -> TypeAdapter[Any]:
    """The wire schema of the client's answer to `method` under protocol `version`.

    Through 2025-11-25 the SDK's own surface map (`mcp_types.methods.CLIENT_RESULTS`) holds
    it. 2026-07-28 has no server-to-client requests, so the map has no row for it: the answer
    travels as an `inputResponses` value, whose schema only the version's generated package
    spells out (no public route yet). Unknown or newer versions get the newest schema.
    """
    adapter = _client_results.get((method, version))
    if adapter is None:
        wire = CLIENT_RESULTS.get((method, version)) or _MODERN_CLIENT_RESULTS[method]
        adapter = _client_results[(method, version)] = TypeAdapter[Any](cast(Any, wire))
    return adapter


class SDKChanged(RuntimeError):
    """An SDK internal mrtr relies on has moved: pin the SDK version mrtr was tested with."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the installed mcp SDK no longer has {what}; mrtr expects {EXPECTED}")


def _required(obj: Any, name: str, what: str) -> Any:
    value = getattr(obj, name, None)
    if value is None:
        raise SDKChanged(what)
    return value


# -- server -------------------------------------------------------------------------------


def install_extension(server: MCPServer[Any], extension: Extension) -> None:
    """Add an `Extension` to a server that already exists.

    The public route is `MCPServer(extensions=[...])` at construction (build the tasks
    extension first and hand it to `Flows(..., tasks_extension=...)`); `Flows` attaches to
    a built server, so it applies the extension the way the constructor does.
    """
    apply = _required(server, "_apply_extension", "MCPServer._apply_extension (extensions after construction)")
    install = _required(server, "_install_extension_interceptor", "MCPServer._install_extension_interceptor")
    apply(extension)
    install()


def has_extension(server: MCPServer[Any], extension: Extension) -> bool:
    """Whether `extension` is already installed (given at construction, `MCPServer(extensions=[...])`)."""
    installed = _required(server, "_extensions", "MCPServer._extensions (the server's extensions)")
    return any(e is extension for e in installed)


def subscription_bus(server: MCPServer[Any]) -> SubscriptionBus:
    """The `SubscriptionBus` the server's `ctx.notify_*` publish on (the SDK's default or `subscriptions=`)."""
    return _required(server, "_subscriptions", "MCPServer._subscriptions (the server's SubscriptionBus)")  # type: ignore[no-any-return]


def uses_default_bus(server: MCPServer[Any]) -> bool:
    """Whether the server kept the SDK's in-process bus (no `subscriptions=` of its own)."""
    from mcp.server.subscriptions import InMemorySubscriptionBus

    return type(subscription_bus(server)) is InMemorySubscriptionBus


def set_subscription_bus(server: MCPServer[Any], bus: SubscriptionBus) -> None:
    """Make `bus` the server's `SubscriptionBus`, as `MCPServer(subscriptions=bus)` would have.

    Every request's `Context` is built with the server's current bus, so `ctx.notify_*`
    publish on it from then on; `subscriptions/listen` is served by mrtr's handler on it.
    """
    subscription_bus(server)  # fails clearly if the SDK moved the attribute
    server._subscriptions = bus


def serves_listen(server: MCPServer[Any]) -> bool:
    """Whether the server answers `subscriptions/listen` (not built with `subscriptions=False`)."""
    handlers = _required(lowlevel_server(server), "_request_handlers", "Server._request_handlers")
    return "subscriptions/listen" in handlers


def serve_listen(server: MCPServer[Any], handler: Any) -> None:
    """Serve `subscriptions/listen` with `handler` instead of the SDK's `ListenHandler`."""
    from mcp_types import SubscriptionsListenRequestParams

    lowlevel_server(server).add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, handler)


async def notify_in_request(session: ServerSession, method: str, params: Mapping[str, Any]) -> None:
    """Send a notification on the current request's stream with `params` exactly as given.

    `ServerSession.send_notification` takes a typed model and drops `None` fields; a
    `notifications/tasks` must carry `ttlMs: null` exactly as `tasks/get` shows it.
    """
    outbound = _required(session, "_request_outbound", "ServerSession._request_outbound")
    await outbound.notify(method, params)


def request_wire(request: Context[Any, Any]) -> Any:
    """`request.request_context` (the SDK's plain per-request context), read directly.

    The public property goes through pydantic's private-attribute lookup, which costs more
    than an engine round's own bookkeeping; the stored value is the same object.
    """
    private = getattr(request, "__pydantic_private__", None)
    wire = private.get("_request_context") if isinstance(private, dict) else None
    return wire if wire is not None else request.request_context  # the property raises when absent


def lowlevel_server(server: MCPServer[Any]) -> Any:
    """The low-level `Server` an `MCPServer` wraps (what `serve_one` dispatches to)."""
    return _required(server, "_lowlevel_server", "MCPServer._lowlevel_server")


def wrap_lifespan(server: MCPServer[Any], around: Callable[[], AbstractAsyncContextManager[None]]) -> None:
    """Enter `around()` inside the server's lifespan, however it is served.

    `server.streamable_http_app()` (its session manager, once per app), `server.run()` (once per
    connection: stdio's one) and the in-process `mcp.Client(server)` (once per client) all enter
    the low-level server's `lifespan`; wrapping it there makes every way of serving the server
    start and stop what `around` runs (the task worker, the fleet bus), not only `Flows`' own app.
    """
    lowlevel = lowlevel_server(server)
    inner = _required(lowlevel, "lifespan", "Server.lifespan (the low-level server's lifespan)")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with inner(app) as state, around():
            yield state

    lowlevel.lifespan = lifespan


def http_lifespan_state(server: MCPServer[Any]) -> Any:
    """The lifespan state the running streamable-HTTP app entered (no public route yet)."""
    manager = server.session_manager
    if not hasattr(manager, "_lifespan_state"):
        raise SDKChanged("StreamableHTTPSessionManager._lifespan_state")
    return manager._lifespan_state


def state_security(server: MCPServer[Any]) -> RequestStateSecurity | None:
    """The `RequestStateSecurity` the server's request-state boundary enforces."""
    lowlevel = lowlevel_server(server)
    for middleware in getattr(lowlevel, "middleware", ()):
        if isinstance(middleware, RequestStateBoundary):
            return _required(middleware, "_security", "RequestStateBoundary._security")  # type: ignore[no-any-return]
    return None


# The SDK installs `RequestStateSecurity.ephemeral()` when a server is built without a
# policy and keeps no record of it. To say so at start-up, mrtr notes the policies that
# classmethod creates — once the server API is first used (`mrtr.Flows` resolved or
# built), never on import: importing mrtr or `mrtr.client` changes nothing in the SDK.
_ephemeral: weakref.WeakSet[RequestStateSecurity] = weakref.WeakSet()


def track_default_keys() -> None:
    """Note every process-local policy the SDK makes from now on (idempotent)."""
    if getattr(RequestStateSecurity.ephemeral, "_mrtr_tracked", False):
        return
    make = RequestStateSecurity.ephemeral.__func__  # type: ignore[attr-defined]

    def tracked(cls: type[RequestStateSecurity], /, **options: Any) -> RequestStateSecurity:
        security: RequestStateSecurity = make(cls, **options)
        _ephemeral.add(security)
        return security

    tracked._mrtr_tracked = True  # type: ignore[attr-defined]
    RequestStateSecurity.ephemeral = classmethod(tracked)  # type: ignore[assignment,method-assign]


def uses_process_local_key(server: MCPServer[Any]) -> bool:
    """Whether the server's `requestState` key exists only in this process (no shared ring).

    Known for servers built after mrtr's server API was first used (`from mrtr import Flows`
    or `mrtr.Flows`, as every example does before building its server); unknown counts as shared.
    """
    return state_security(server) in _ephemeral


def state_audience(server: MCPServer[Any]) -> str:
    """The audience sealed into every `requestState`: the policy's own, else the server's name."""
    security = state_security(server)
    return (security.audience if security is not None else None) or server.name


# -- sealed state size --------------------------------------------------------------------

# Per codec: (fixed bytes, bytes per payload byte), measured by sealing two real payloads.
_codec_costs: weakref.WeakKeyDictionary[Any, tuple[float, float]] = weakref.WeakKeyDictionary()
_DEFAULT_CODEC: Any = None


def codec_cost(request: Context[Any, Any]) -> tuple[float, float]:
    """What the request's server's state codec adds: (fixed bytes, bytes per payload byte).

    Measured once per codec by sealing two payloads with it, so a custom `codec=` is
    estimated right too.
    """
    server = getattr(request, "_mcp_server", None)  # Context.mcp_server raises when absent
    return security_cost(state_security(server) if server is not None else None)


def security_cost(security: RequestStateSecurity | None) -> tuple[float, float]:
    """`codec_cost` for a known policy (None: the SDK's default AES-GCM codec)."""
    global _DEFAULT_CODEC
    if security is None:
        if _DEFAULT_CODEC is None:
            _DEFAULT_CODEC = RequestStateSecurity(keys=[bytes(32)]).codec  # only measured, never seals state
        codec = _DEFAULT_CODEC
    else:
        codec = security.codec
    try:
        return _codec_costs[codec]
    except (KeyError, TypeError):
        pass
    small, large = (len(codec.seal(b"x" * n)) for n in (0, 3000))
    cost = (float(small), (large - small) / 3000)
    with contextlib.suppress(TypeError):  # a codec that cannot be weakly referenced: measured every time
        _codec_costs[codec] = cost
    return cost


# -- client -------------------------------------------------------------------------------


async def send_stamped(session: ClientSession, method: str, data: dict[str, Any]) -> dict[str, Any]:
    """Send `data` through the session's own envelope stamp and dispatcher; the raw result.

    `FlowClient` reads 2026-07-28 results by the spec's client rules rather than the SDK's
    typed parser (which rejects a result without `resultType`, which the spec says to treat
    as complete), while `_meta`, routing headers and transport stay exactly the SDK's.
    """
    stamp = _required(session, "_stamp", "ClientSession._stamp")
    dispatcher = _required(session, "_dispatcher", "ClientSession._dispatcher")
    options: CallOptions = {}
    stamp(data, options)
    return dict(await dispatcher.send_raw_request(method, data["params"], options))


def http_client() -> httpx2.AsyncClient:
    """An HTTP client configured the way the SDK's own transports configure theirs."""
    try:
        from mcp.shared._httpx_utils import create_mcp_http_client
    except ImportError as exc:  # pragma: no cover - only when the SDK moves it
        raise SDKChanged("mcp.shared._httpx_utils.create_mcp_http_client") from exc
    return create_mcp_http_client()


class ListenStream:
    """One open `subscriptions/listen` stream opened by `listen_stream` (events go to the session's bindings)."""

    def __init__(self, honored: Any, ended: Any) -> None:
        self.honored = honored
        """The acknowledged filter (`SubscriptionFilter`; extension keys such as `taskIds` in `model_extra`)."""
        self.ended = ended
        """An `anyio.Event` set when the stream ends, however it ends."""
        self.error: Exception | None = None
        """Why it ended, when the server or the connection ended it."""


@contextlib.asynccontextmanager
async def listen_stream(
    session: ClientSession, notifications: Mapping[str, Any], on_end: Any = None
) -> AsyncIterator[ListenStream]:
    """`mcp.client.subscriptions.listen` with a raw filter, so extension keys (`taskIds`) can be asked for.

    The SDK's `listen()` builds its filter from the core flags only. This opens the same
    stream through the same session machinery (its listen route consumes the acknowledgement;
    other frames reach the session's notification bindings), returns once acknowledged, and
    calls `on_end()` when the stream ends. Raises what the SDK's `listen()` raises.
    """
    import anyio
    import mcp_types as types
    from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
    from mcp.shared.exceptions import MCPError
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    if session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        raise ListenNotSupportedError(session.protocol_version)
    register = _required(session, "_register_listen_route", "ClientSession._register_listen_route")
    unregister = _required(session, "_unregister_listen_route", "ClientSession._unregister_listen_route")
    stamp = _required(session, "_stamp", "ClientSession._stamp")
    dispatcher = _required(session, "_dispatcher", "ClientSession._dispatcher")
    task_group = _required(session, "_task_group", "ClientSession._task_group (an entered session)")
    timeout = getattr(session, "_session_read_timeout_seconds", None)
    request_id = f"mrtr-listen-{next(_listen_ids)}"
    data = types.SubscriptionsListenRequest(
        params=types.SubscriptionsListenRequestParams(
            notifications=types.SubscriptionFilter.model_validate(notifications)
        )
    ).model_dump(by_alias=True, mode="json", exclude_none=True)
    options: CallOptions = {"request_id": request_id}
    stamp(data, options)
    ended = anyio.Event()
    stream = ListenStream(None, ended)
    scope = anyio.CancelScope()

    def finish(error: Exception | None) -> None:
        if not ended.is_set():
            stream.error = error
            ended.set()
            if on_end is not None:
                on_end()

    async def drive() -> None:
        with scope:
            try:
                await dispatcher.send_raw_request(data["method"], data.get("params"), options)
                route.set_acked(types.SubscriptionFilter())  # a result is the graceful close
                route.settle("graceful")
                finish(None)
            except Exception as error:  # an error answer, or the connection broke
                route.settle("lost", error=error if isinstance(error, MCPError) else None)
                finish(error)
        finish(None)

    route = register(request_id)
    try:
        task_group.start_soon(drive)
        with anyio.fail_after(timeout):
            await route.acked.wait()
        if route.honored is None or (ended.is_set() and stream.error is not None):
            if isinstance(stream.error, Exception):
                raise stream.error
            raise SubscriptionLost(f"subscription {request_id!r} ended before it was acknowledged")
        stream.honored = route.honored
        yield stream
    finally:
        scope.cancel()
        unregister(request_id)
        finish(None)


_listen_ids = itertools.count(1)
"""`mrtr-listen-N`: string ids, so they never collide with the session's own integer ids."""


__all__ = [
    "EXPECTED",
    "ListenStream",
    "FORM_FIELD",
    "SDKChanged",
    "client_result_schema",
    "codec_cost",
    "has_extension",
    "http_client",
    "http_lifespan_state",
    "install_extension",
    "listen_stream",
    "lowlevel_server",
    "notify_in_request",
    "request_wire",
    "send_stamped",
    "serve_listen",
    "serves_listen",
    "set_subscription_bus",
    "state_audience",
    "state_security",
    "subscription_bus",
    "track_default_keys",
    "uses_default_bus",
    "uses_process_local_key",
]
