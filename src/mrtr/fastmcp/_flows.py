"""`mrtr.fastmcp.Flows`: flows registered as ordinary FastMCP tools, prompts and resources.

A flow is wrapped in a plain async function with the flow's own parameters (so FastMCP
derives the same schema) that runs mrtr's engine on the request FastMCP is serving. The
engine answers with the flow's value or an `InputRequiredResult`, which FastMCP's own
guard-pattern path carries to the wire; FastMCP's `RequestStateBoundary` seals the journal
with the server's `request_state_security`, so any instance sharing that key serves any
round. FastMCP's middleware, auth, tags, `mcp.http_app()` and `mcp.run()` see ordinary
components. Everything else (options, the key, store, guard and bus choices, task engines,
warnings) is the host core's (`mrtr._host`), shared with `mrtr.Flows`; this module is
FastMCP's adapter to it.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar, cast

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_context
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import FunctionTool, ToolResult
from mcp.server.request_state import RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, InputRequiredResult
from starlette.applications import Starlette
from typing_extensions import Unpack

from mrtr import _answer_edge as answer_edge
from mrtr._engine.context import FlowContext
from mrtr._engine.spec import FlowSpec, TaskStarted
from mrtr._errors import FlowDefinitionError, InputRefused
from mrtr._host.adapter import Host, Running
from mrtr._host.base import BaseFlows
from mrtr._host.call import Refused, Rejected, Unavailable, Value
from mrtr._host.core import HostCore
from mrtr._host.instance import InstanceHeader
from mrtr._host.options import FlowsOptions, HostOptions, ToolOptions, flow_options
from mrtr._host.registration import entry_point, refused_as_client_error, reject_bare_use
from mrtr._wire import TASKS_EXTENSION
from mrtr.fastmcp import _internals as internals
from mrtr.fastmcp._client_errors import QuietClientError, quiet_prompt_error, quiet_tool_error
from mrtr.fastmcp._context import FlowsContext
from mrtr.fastmcp._tasks import FastMCPTasks, TaskStartedResult, serve_listen
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler

F = TypeVar("F", bound=Callable[..., Any])

_FASTMCP_KEYWORDS = {
    kind: frozenset(inspect.signature(getattr(FastMCP, kind)).parameters) - {"self", "name_or_fn", "uri", "name"}
    for kind in ("tool", "prompt", "resource")
}
"""The keywords FastMCP's own decorators take, passed on to them (read once, from their signatures)."""


class Flows(BaseFlows):
    """Adds flows to a `fastmcp.FastMCP` server (see the module docstring).

    Args:
        mcp: The FastMCP server. Its `request_state_security` seals every journal: give every
            instance the same key ring (and the same server name).
        **options: Any of `mrtr.FlowsOptions`: the same keywords, defaults and meanings as
            `mrtr.Flows`. `dialects` is refused: the seed dialects are endpoints and middleware
            of the SDK's own HTTP app, which a FastMCP server does not serve.
    """

    def __init__(self, mcp: FastMCP[Any], /, **options: Unpack[FlowsOptions]) -> None:
        self.mcp = mcp
        resolved = HostOptions.of(options)
        if resolved.dialects:
            raise FlowDefinitionError(
                f"mrtr.fastmcp.Flows(dialects={list(resolved.dialects)!r}): the seed dialects are endpoints and "
                "middleware of the SDK's own HTTP app, served by mrtr.Flows on an MCPServer; a FastMCP server "
                "serves the 2026-07-28 wire only"
            )
        self._host = _FastMCPHost(mcp)
        self._core = HostCore(self._host, resolved)
        mcp.add_middleware(_ProtocolErrors(self._core.specs))
        answer_edge.install(internals.lowlevel_server(mcp))  # issue #35: a malformed answer is named

    def http_app(self, **options: Any) -> Starlette:
        """`mcp.http_app(**options)`, with the `X-Mrtr-Instance` header (`instance_name=`).

        The task worker and fleet bus run with the server's lifespan however it is served.
        """
        app = self.mcp.http_app(**options)
        if self.instance_name is not None:
            app.add_middleware(InstanceHeader, name=self.instance_name)
        return app

    def tool(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Register an async flow as a FastMCP tool. `options` are `FastMCP.tool`'s (title,
        description, tags, annotations, meta, icons, output_schema, timeout, auth, ...) and
        `mrtr.ToolOptions` (`task=`, `mrtr_first=`, `requires=`, `max_rounds=`, `deadline=`,
        `max_state_bytes=`).

        `task="optional"|"required"` and `mrtr_first` mean what they mean for `mrtr.Flows.tool`:
        the call runs as a durable mrtr task when the client declares the tasks extension.
        """
        reject_bare_use(name, "tool")
        flow, fastmcp_options = flow_options("tool", options, _FASTMCP_KEYWORDS["tool"])
        app = fastmcp_options.pop("app", None)
        if app:  # as FastMCP.tool does: an app config is the tool's meta["ui"]
            fastmcp_options["meta"] = dict(fastmcp_options.get("meta") or {}) | {"ui": True if app is True else app}

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name, flow)
            entry = self._entry(fn, spec, _refused_as_tool_error)
            tool = FunctionTool.from_function(entry, name=spec.name, **fastmcp_options)
            self.mcp.add_tool(tool)
            if spec.task != "never":  # a task's result is converted by FastMCP, exactly as the call's would be
                self._core.register_task(spec, functools.partial(_tool_result, tool))
            return fn

        return decorator

    def prompt(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Register an async flow as a FastMCP prompt (`prompts/get` may take several rounds);
        `options` are `FastMCP.prompt`'s and `mrtr.FlowOptions`."""
        reject_bare_use(name, "prompt")
        flow, fastmcp_options = flow_options("prompt", options, _FASTMCP_KEYWORDS["prompt"])

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name, flow)
            self.mcp.prompt(self._entry(fn, spec, refused_as_client_error(spec)), name=spec.name, **fastmcp_options)
            return fn

        return decorator

    def resource(self, uri: str, *, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Register an async flow as a FastMCP resource or resource template; `options` are
        `FastMCP.resource`'s and `mrtr.FlowOptions`."""
        reject_bare_use(uri, "resource")
        flow, fastmcp_options = flow_options("resource", options, _FASTMCP_KEYWORDS["resource"])

        def decorator(fn: F) -> F:
            spec = self._spec(fn, name, flow)
            self.mcp.resource(uri, name=spec.name, **fastmcp_options)(
                self._entry(fn, spec, refused_as_client_error(spec))
            )
            return fn

        return decorator

    # -- internals --------------------------------------------------------------------------

    def _spec(self, fn: Callable[..., Any], name: str | None, flow: ToolOptions) -> FlowSpec:
        wrap = functools.partial(_fastmcp_context, self.mcp)
        return self._core.spec(fn, name, flow, host_context=Context, wrap_host_context=wrap)

    def _entry(
        self, fn: Callable[..., Any], spec: FlowSpec, refused: Callable[[InputRefused], Exception]
    ) -> Callable[..., Any]:
        """A FastMCP-registrable function: the flow's signature without its context parameter.

        A call that becomes a task returns `TaskStartedResult`, a `ToolResult` FastMCP passes
        through untouched to the tasks interceptor, which answers with its `CreateTaskResult`.
        """
        call, security = self._core.call, self._host.state_security
        tool = refused is _refused_as_tool_error

        async def run(kwargs: dict[str, Any]) -> Any:
            ctx = get_context()
            wire = internals.request_wire(ctx)
            if wire is None:
                raise RuntimeError(f"flow {spec.name!r} runs only inside an MCP request")
            outcome = await call(spec, ctx, kwargs, wire=wire, state_security=security)
            if type(outcome) is Value:
                return outcome.value
            if type(outcome) is InputRequiredResult:
                return outcome
            if isinstance(outcome, TaskStarted):
                return TaskStartedResult(outcome)
            _raise_quietly(cast(Refused | Unavailable | Rejected, outcome), tool, refused)

        return entry_point(fn, spec, run)


def _raise_quietly(
    outcome: Refused | Unavailable | Rejected, tool: bool, refused: Callable[[InputRefused], Exception]
) -> NoReturn:
    """Raise an error outcome as FastMCP should log it: what the client caused, without a traceback."""
    if isinstance(outcome, Refused):
        error = refused(outcome.error)
        raise (error if tool else quiet_prompt_error(error, outcome.error)) from None
    exc = outcome.error
    if isinstance(outcome, Unavailable):  # retryable, logged once per burst by the store: no traceback here
        if tool:  # FastMCP logs the ToolError at DEBUG; `_ProtocolErrors` sends `exc` itself
            raise ToolError(exc.error.message, log_level=logging.DEBUG) from exc
        raise QuietClientError(exc) from None
    # issue #35: a client's mistake is one INFO line (mrtr.engine), no traceback
    quiet = quiet_tool_error(exc) if tool else quiet_prompt_error(exc)
    if quiet is None or quiet is exc:
        raise exc
    raise quiet from exc  # FastMCP logs it quietly; the wire still gets `exc` (`_ProtocolErrors` for tools)


class _ProtocolErrors(Middleware):
    """A flow's protocol errors reach the wire as JSON-RPC errors, as on `MCPServer`.

    FastMCP masks whatever a tool body raises into an `isError` result, `MCPError`s included
    (it raises a `ToolError` from them). The SDK passes them through: a flow past its round
    cap or deadline, a state this server cannot read or a round the replay guard refuses is a
    -32602 (or -32603) the client can act on, not a tool result. For mrtr's flows only, this
    middleware raises the `MCPError` FastMCP wrapped again.
    """

    def __init__(self, specs: Mapping[str, FlowSpec]) -> None:
        self.specs = specs

    async def on_call_tool(
        self, context: MiddlewareContext[CallToolRequestParams], call_next: CallNext[CallToolRequestParams, ToolResult]
    ) -> ToolResult:
        try:
            return await call_next(context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, MCPError) and context.message.name in self.specs:
                raise cause from None
            raise


class _FastMCPHost(Host):
    """A FastMCP server as the host core sees it."""

    kind = "FastMCP"
    server: FastMCP[Any]

    def state_security(self) -> RequestStateSecurity | None:
        return internals.state_security(self.server)

    def server_middleware(self) -> list[Any]:
        chain: list[Any] = internals.lowlevel_server(self.server).middleware
        return chain

    def given_bus(self) -> SubscriptionBus | None:
        return None  # FastMCP takes no bus of its own: Flows(bus=...) gives one

    def use_bus(self, bus: SubscriptionBus | None) -> SubscriptionBus:
        return bus if bus is not None else InMemorySubscriptionBus()

    def install_tasks(self, extension: TasksExtension, listen: ListenHandler, running: Running) -> None:
        if internals.has_extension(self.server, TASKS_EXTENSION):
            raise FlowDefinitionError(
                f"mrtr.fastmcp: this FastMCP server already has a {TASKS_EXTENSION} extension (fastmcp-tasks?); "
                "mrtr's durable tasks need that identifier: register mrtr task flows on a server without it"
            )
        serve_listen(self.server, listen)  # FastMCP serves no `subscriptions/listen` of its own
        self.server.add_extension(FastMCPTasks(extension, running))  # its lifespan runs the worker and the bus


def _fastmcp_context(mcp: FastMCP[Any], flow: FlowContext) -> FlowsContext:
    """The request's FastMCP `Context`; in a durable task's run (no request), one bound to the server."""
    try:
        base = get_context()
    except RuntimeError:
        base = Context(fastmcp=mcp)
    return FlowsContext(flow, base)


def _tool_result(tool: FunctionTool, value: Any) -> CallToolResult:
    """A task flow's return value as its tool's `CallToolResult`, converted by FastMCP itself."""
    result = tool.convert_result(value)
    fields = {"content": result.content, "structuredContent": result.structured_content, "_meta": result.meta}
    return CallToolResult.model_validate({k: v for k, v in fields.items() if v is not None})


def _refused_as_tool_error(exc: InputRefused) -> Exception:
    return quiet_tool_error(exc) or ToolError(str(exc))  # a user who said no: INFO, not ERROR


__all__ = ["Flows"]
