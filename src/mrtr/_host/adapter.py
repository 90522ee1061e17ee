"""What a framework lends the host core: the `Host` protocol each `Flows` implements.

The core (`mrtr._host.core.HostCore`) decides everything that does not depend on the
framework: limits, the key, store, guard and bus choices, task engines, specs, warnings.
It reaches the framework only through these few methods, the way httpx's `BaseClient`
reaches a transport: `mrtr._flows` implements them over the SDK's `MCPServer`,
`mrtr.fastmcp._flows` over FastMCP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mcp.server.request_state import RequestStateSecurity
    from mcp.server.subscriptions import SubscriptionBus
    from starlette.requests import Request
    from starlette.responses import Response

    from mrtr.tasks._extension import TasksExtension
    from mrtr.tasks._listen import ListenHandler


class Host(Protocol):
    """One MCP framework's server, as the host core needs it."""

    kind: str
    """How the framework's server is built, for messages: `"MCPServer"`, `"FastMCP"`."""

    @property
    def name(self) -> str:
        """The server's name (log lines, the default `requestState` audience)."""
        ...

    def state_security(self) -> RequestStateSecurity | None:
        """The policy the server seals `requestState` with (None: a key of this process only)."""
        ...

    def shares_state_key(self) -> bool:
        """Whether the server seals `requestState` with a key ring other instances can hold."""
        ...

    def given_bus(self) -> SubscriptionBus | None:
        """A bus the server was built with (`MCPServer(subscriptions=...)`), if any."""
        ...

    def use_bus(self, bus: SubscriptionBus | None) -> SubscriptionBus:
        """Serve listens and publish on `bus` (None: the host's in-process bus); returns the bus in use."""
        ...

    def install_tasks(
        self,
        extension: TasksExtension,
        listen: ListenHandler,
        running: Callable[[], AbstractAsyncContextManager[None]],
    ) -> None:
        """Serve the tasks extension and `subscriptions/listen` (`listen`); enter `running()` (the
        fleet bus, the task worker) with the server's lifespan, however the framework runs it."""
        ...

    def add_route(self, path: str, endpoint: Callable[[Request], Awaitable[Response]], methods: Sequence[str]) -> None:
        """Serve a plain HTTP route beside the MCP endpoint (callback URLs)."""
        ...


__all__ = ["Host"]
