"""The one place `mrtr.fastmcp` reaches into FastMCP's internals (tested against fastmcp 4.2).

FastMCP has no public route yet for what is here; every use names what it needs, so a
FastMCP release that moves one fails at start-up with the name and the version mrtr
expects, not deep in a request.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastmcp import Context, FastMCP
from mcp.server.request_state import RequestStateSecurity

EXPECTED = "fastmcp>=4.2,<5"


class FastMCPChanged(RuntimeError):
    """A FastMCP internal mrtr relies on has moved: pin the FastMCP version mrtr was tested with."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the installed fastmcp no longer has {what}; mrtr.fastmcp expects {EXPECTED}")


def request_wire(ctx: Context) -> Any | None:
    """The SDK's `ServerRequestContext` of the request `ctx` serves (None outside a wire request).

    `FastMCPRequestContext._srctx` is FastMCP's documented escape hatch to it.
    """
    request = ctx.request_context
    if request is None:
        return None
    if not hasattr(request, "_srctx"):
        raise FastMCPChanged("FastMCPRequestContext._srctx (the SDK request context)")
    return request._srctx


def state_security(mcp: FastMCP[Any]) -> RequestStateSecurity | None:
    """The `request_state_security` the server was built with (None: FastMCP seals with a process-local key)."""
    if not hasattr(mcp, "_request_state_security"):
        raise FastMCPChanged("FastMCP._request_state_security")
    security: RequestStateSecurity | None = mcp._request_state_security
    return security


def has_extension(mcp: FastMCP[Any], identifier: str) -> bool:
    """Whether an extension with `identifier` is registered on the server."""
    extensions = getattr(mcp, "_extensions", None)
    if extensions is None:
        raise FastMCPChanged("FastMCP._extensions (registered server extensions)")
    return identifier in extensions


async def component_auth_allows(component: Any) -> bool:
    """Whether a FastMCP component's own `auth` admits the current request, decided as FastMCP decides it
    for a direct call (stdio trusted, else the request's access token through `run_auth_checks`)."""
    from fastmcp.server import server as fastmcp_server

    allows = getattr(fastmcp_server, "_component_auth_allows", None)
    if allows is None:
        raise FastMCPChanged("fastmcp.server.server._component_auth_allows (a component's auth check)")
    allowed: bool = await allows(component)
    return allowed


def lowlevel_server(mcp: FastMCP[Any]) -> Any:
    """The SDK low-level `Server` FastMCP wraps (`FastMCP._mcp_server`), for its server middleware."""
    lowlevel = getattr(mcp, "_mcp_server", None)
    if lowlevel is None or not isinstance(getattr(lowlevel, "middleware", None), list):
        raise FastMCPChanged("FastMCP._mcp_server.middleware (the SDK low-level server's middleware)")
    return lowlevel


@contextmanager
def serving(mcp: FastMCP[Any]) -> Iterator[None]:
    """FastMCP's current-server variable set to `mcp` while dependencies resolve, if nothing set it.

    A request sets it; a durable task's run on a worker has no request, and FastMCP's
    `CurrentFastMCP()` (and other dependencies reading the server) need it.
    """
    from fastmcp.server import dependencies

    current = getattr(dependencies, "_current_server", None)
    if current is None:
        raise FastMCPChanged("fastmcp.server.dependencies._current_server (the server dependencies resolve for)")
    ref = current.get()
    if ref is not None and ref() is not None:
        yield
        return
    token = current.set(weakref.ref(mcp))
    try:
        yield
    finally:
        current.reset(token)


def add_request_handler(mcp: FastMCP[Any], method: str, params_type: Any, handler: Any) -> None:
    """Serve a spec method FastMCP does not serve, through the SDK's public `Server.add_request_handler`
    on the low-level server FastMCP wraps (`FastMCP._mcp_server`). Extension `MethodBinding`s
    cannot bind spec methods, which `subscriptions/listen` is."""
    lowlevel = getattr(mcp, "_mcp_server", None)
    if lowlevel is None or not hasattr(lowlevel, "add_request_handler"):
        raise FastMCPChanged("FastMCP._mcp_server (the SDK low-level server it wraps)")
    lowlevel.add_request_handler(method, params_type, handler)


__all__ = [
    "EXPECTED",
    "FastMCPChanged",
    "add_request_handler",
    "component_auth_allows",
    "has_extension",
    "lowlevel_server",
    "request_wire",
    "serving",
    "state_security",
]
