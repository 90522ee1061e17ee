"""What a framework lends the host core: the `Host` each `Flows` implements.

The core (`mrtr._host.core.HostCore`) decides everything that does not depend on the
framework: limits, the key, store, guard and bus choices, task engines, specs, warnings.
It reaches the framework only through these few methods, the way httpx's `BaseClient`
reaches a transport: `mrtr._flows` implements them over the SDK's `MCPServer`,
`mrtr.fastmcp._flows` over FastMCP. What both frameworks spell alike (a server's name, a
custom HTTP route) is written here once.

The lifecycle contract: `install_tasks` ties `running` (the core's `HostCore.running`: fleet bus
start, task worker, engine close, bus close) to the framework's own server lifespan, the one
every way of serving enters: the SDK's `server.run()` (stdio, streamable HTTP),
`server.streamable_http_app()` and `flows.streamable_http_app()`; FastMCP's `run()`,
`run_http_async()`, `http_app()` and `flows.http_app()`. An adapter never enters it a second
time from an app of its own; where a framework nests lifespans (an in-process client per
connection), the core starts on the first entry and stops on the last exit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server.request_state import RequestStateSecurity
    from mcp.server.subscriptions import SubscriptionBus
    from starlette.requests import Request
    from starlette.responses import Response

    from mrtr.tasks._extension import TasksExtension
    from mrtr.tasks._listen import ListenHandler

Running = Callable[[], AbstractAsyncContextManager[None]]
"""The host core's background work (fleet bus, task worker), entered for the server's lifespan."""


class Host:
    """One MCP framework's server, as the host core needs it."""

    kind = "server"
    """How the framework's server is built, for messages: `"MCPServer"`, `"FastMCP"`."""

    def __init__(self, server: Any) -> None:
        self.server = server

    @property
    def name(self) -> str:
        """The server's name (log lines, the default `requestState` audience)."""
        return str(self.server.name)

    def add_route(self, path: str, endpoint: Callable[[Request], Awaitable[Response]], methods: Sequence[str]) -> None:
        """Serve a plain HTTP route beside the MCP endpoint (callback URLs): both frameworks'
        `custom_route`."""
        self.server.custom_route(path, methods=list(methods))(endpoint)

    def state_security(self) -> RequestStateSecurity | None:
        """The policy the server seals `requestState` with (None: a key of this process only)."""
        raise NotImplementedError

    def server_middleware(self) -> list[Any]:
        """The SDK low-level server's middleware chain (outermost first), which wraps every request
        the framework serves, `initialize` included, on every transport."""
        raise NotImplementedError

    def shares_state_key(self) -> bool:
        """Whether the server seals `requestState` with a key ring other instances can hold: by
        default, whether it was given one at all."""
        return self.state_security() is not None

    def given_bus(self) -> SubscriptionBus | None:
        """A bus the server was built with (`MCPServer(subscriptions=...)`), if any."""
        raise NotImplementedError

    def use_bus(self, bus: SubscriptionBus | None) -> SubscriptionBus:
        """Serve listens and publish on `bus` (None: the host's in-process bus); returns the bus in use."""
        raise NotImplementedError

    def install_tasks(self, extension: TasksExtension, listen: ListenHandler, running: Running) -> None:
        """Serve the tasks extension and `subscriptions/listen` (`listen`); enter `running()` (the
        fleet bus, the task worker) with the server's lifespan, however the framework runs it
        (the lifecycle contract, in the module docstring). Called once, when the task engine
        is created."""
        raise NotImplementedError


__all__ = ["Host", "Running"]
