"""The pre-standard MRTR wire shapes of the seed documents, served by the same flows.

`mrtr.Flows(server, dialects=["sketch", "draft", "incomplete", "saga", "sep-2322-tasks"])` enables
any subset:

| name | seed | wire |
|---|---|---|
| `sketch` | 000 | `dependent_requests` / `dependent_responses` on the JSON-RPC message (`/mcp/sketch`) |
| `draft` | 001 | `input_requests` / `input_responses` / `request_state` on the message (`/mcp/draft`); its tasks too |
| `incomplete` | 002 | `result_type: "incomplete"` results, negotiated by protocol version `2026-06-XX` |
| `saga` | 003 | `tools/callSaga` / `tools/resumeSaga`, `sagaToken`, `completedSteps` |
| `sep-2322-tasks` | 004 (drafts) | `tasks/result` + `tasks/input_response` beside the tasks extension |

Each adapter only translates its wire to a 2026-07-28 request and back (`plumbing`); the
flow, its journal and its sealing are the ones every client gets. A dialect that is not
enabled is not recognised at all, and with none enabled nothing is installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateBoundary
from starlette.applications import Starlette
from starlette.routing import Route

from mrtr._dialects import draft, incomplete, saga, sketch
from mrtr._dialects.http import DialectEndpoint, DialectServer, MainEndpoint, Shape
from mrtr._dialects.plumbing import Gateway
from mrtr._dialects.sep2322_tasks import seed_methods
from mrtr._dialects.stdio import DialectMiddleware

TASK_DIALECT = "sep-2322-tasks"
NAMES = ("sketch", "draft", "incomplete", "saga", TASK_DIALECT)
"""Every dialect, by the name `Flows(dialects=...)` takes."""
ENDPOINT_DIALECTS = ("sketch", "draft")
"""The shapes with an endpoint of their own, `<path>/<name>` (and a declaration at `initialize`)."""

_SHAPES = {
    sketch.NAME: Shape(sketch.NAME, sketch.incoming, sketch.outgoing),
    draft.NAME: Shape(draft.NAME, draft.incoming, draft.outgoing, tasks=True),
    incomplete.NAME: Shape(incomplete.NAME, incomplete.incoming, incomplete.outgoing, version=incomplete.VERSION),
}


class Dialects:
    """The enabled dialects of one server; `mount` adds them to its streamable HTTP app."""

    def __init__(self, server: MCPServer[Any], names: Iterable[str]) -> None:
        enabled = list(dict.fromkeys(names))
        unknown = [name for name in enabled if name not in NAMES]
        if unknown:
            raise ValueError(f"unknown dialect(s) {unknown}; choose from {list(NAMES)}")
        self.enabled = frozenset(enabled)
        self.task_methods = seed_methods if TASK_DIALECT in self.enabled else None
        """Methods the tasks extension adds for the task dialect, if enabled."""
        shapes = {name: shape for name, shape in _SHAPES.items() if name in self.enabled}
        gateway = Gateway(server)
        self._server = DialectServer(gateway, shapes, saga_enabled=saga.NAME in self.enabled)
        if saga.NAME in self.enabled or incomplete.NAME in self.enabled:
            # stdio: just outside the request-state boundary, so the boundary verifies what it hands on.
            middleware = DialectMiddleware(
                gateway, saga_enabled=saga.NAME in self.enabled, incomplete_enabled=incomplete.NAME in self.enabled
            )
            chain = server.middleware
            at = next((i for i, m in enumerate(chain) if isinstance(m, RequestStateBoundary)), len(chain))
            chain.insert(at, middleware)

    def mount(self, app: Starlette, path: str = "/mcp") -> None:
        """Add `<path>/sketch` and `<path>/draft` beside `path`, and recognise the rest on `path`.

        Endpoints get the same authentication requirement as `path` itself.
        """
        main = next((r for r in app.router.routes if isinstance(r, Route) and r.path == path), None)
        if main is None:
            raise RuntimeError(f"no {path} route to serve dialects beside")
        guard = main.app if isinstance(main.app, RequireAuthMiddleware) else None
        inner = guard.app if guard is not None else main.app
        server = self._server

        def protect(endpoint: Any) -> Any:
            if guard is None:
                return endpoint
            return RequireAuthMiddleware(endpoint, guard.required_scopes, guard.resource_metadata_url)

        declared = frozenset(name for name in ENDPOINT_DIALECTS if name in self.enabled)
        for name in sorted(declared):
            app.router.routes.insert(
                0, Route(f"{path}/{name}", endpoint=protect(DialectEndpoint(server, _SHAPES[name])))
            )
        if declared or incomplete.NAME in self.enabled or saga.NAME in self.enabled:
            wrapped = MainEndpoint(inner, server, declared)
            if guard is not None:
                guard.app = wrapped
            else:
                main.app = wrapped


__all__ = ["ENDPOINT_DIALECTS", "NAMES", "TASK_DIALECT", "Dialects"]
