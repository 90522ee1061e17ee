"""A `Host` with no framework behind it: what the host core needs, recorded.

The core (`mrtr._host.core.HostCore`) reaches its framework only through `Host`; this one
keeps what the core asked of it (routes, the tasks it installed, the lifespan hook) so a
unit test can read the core's decisions without an `MCPServer` or a `FastMCP`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

from mcp.server.request_state import RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, SubscriptionBus
from mcp_types import ClientCapabilities

from mrtr._host.adapter import Host, Running
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler

SHARED_KEY = b"k" * 32


class FakeHost(Host):
    kind = "Fake"

    def __init__(self, *, security: RequestStateSecurity | None = None, bus: SubscriptionBus | None = None) -> None:
        super().__init__(SimpleNamespace(name="fake"))
        self.security = security
        self.bus = bus
        self.routes: list[str] = []
        self.installed: list[tuple[TasksExtension, ListenHandler, Running]] = []

    def add_route(self, path: str, endpoint: Callable[..., Awaitable[Any]], methods: Sequence[str]) -> None:
        self.routes.append(path)

    def state_security(self) -> RequestStateSecurity | None:
        return self.security

    def given_bus(self) -> SubscriptionBus | None:
        return self.bus

    def use_bus(self, bus: SubscriptionBus | None) -> SubscriptionBus:
        return bus if bus is not None else (self.bus or InMemorySubscriptionBus())

    def install_tasks(self, extension: TasksExtension, listen: ListenHandler, running: Running) -> None:
        self.installed.append((extension, listen, running))


def shared_host() -> FakeHost:
    """A host whose `requestState` is sealed with a key ring other instances can hold."""
    return FakeHost(security=RequestStateSecurity(keys=[SHARED_KEY]))


MODERN = "2026-07-28"


def wire(*, state: str | None = None, answers: dict[str, Any] | None = None, name: str = "flow") -> Any:
    """The parts of the SDK's `ServerRequestContext` a round reads: a `tools/call` of `name`."""
    params: dict[str, Any] = {"name": name}
    if state is not None:
        params["requestState"] = state
    if answers is not None:
        params["inputResponses"] = answers
    capabilities = ClientCapabilities.model_validate({"elicitation": {"form": {}}})
    session = SimpleNamespace(client_params=None, client_capabilities=capabilities)
    return SimpleNamespace(params=params, session=session, method="tools/call", protocol_version=MODERN)
