"""`Flows`: register flow functions as tools, prompts and resources of an `MCPServer`.

A flow is registered through the SDK's own decorators, wrapped in a function whose
signature is the flow's with the `FlowContext` parameter swapped for the SDK `Context`.
So names, descriptions, input and output schemas, argument validation and result
conversion are exactly what `@server.tool()` gives; only the body runs under the engine.
Everything else (options, the key, store, guard and bus choices, task engines, warnings)
is the host core's (`mrtr._host`), shared with `mrtr.fastmcp.Flows`; this module is the
SDK's adapter to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts import Prompt
from mcp.server.mcpserver.utilities.func_metadata import func_metadata
from mcp.server.request_state import RequestStateSecurity
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import UriTemplate
from mcp_types import Annotations, Icon, InputRequiredResult, ToolAnnotations
from starlette.applications import Starlette
from typing_extensions import Unpack

from mrtr import _answer_edge as answer_edge
from mrtr import _sdk as sdk
from mrtr._dialects import Dialects
from mrtr._engine.spec import FlowSpec, TaskStarted
from mrtr._errors import InputRefused
from mrtr._host.adapter import Host, Running
from mrtr._host.base import BaseFlows
from mrtr._host.call import Failure, Refused, Value
from mrtr._host.core import HostCore
from mrtr._host.instance import InstanceHeader
from mrtr._host.options import FlowOptions, FlowsOptions, HostOptions, ToolOptions, flow_options
from mrtr._host.registration import entry_point, refused_as_client_error, reject_bare_use
from mrtr._static_resources import StaticResourceFlows
from mrtr.tasks._extension import TaskCreated, TasksExtension
from mrtr.tasks._listen import ListenHandler

F = TypeVar("F", bound=Callable[..., Any])


class Flows(BaseFlows):
    """Adds flows to an existing `MCPServer`.

    Args:
        server: The official SDK server to register on. Its `request_state_security`
            seals every journal; share its keys (and its name) across a fleet.
        **options: Any of `mrtr.FlowsOptions` (limits, `store`, `replay_guard`, `tasks`,
            shedding, `fleet_bus`, `bus`, `require_shared_key`, `require_shared_store`,
            `instance_name`, `public_url`, `dialects`, `strict`, `protocol_versions`): the same keywords, defaults
            and meanings as `mrtr.fastmcp.Flows`.
    """

    def __init__(self, server: MCPServer[Any], /, **options: Unpack[FlowsOptions]) -> None:
        sdk.track_default_keys()  # for servers built after this one (this one was built before)
        self.server = server
        resolved = HostOptions.of(options)
        self._dialects = Dialects(server, resolved.dialects) if resolved.dialects else None
        task_dialect = self._dialects.task_methods if self._dialects is not None else None
        self._core = HostCore(_SDKHost(server), resolved, task_dialect=task_dialect)
        self._static = StaticResourceFlows(server)
        answer_edge.install(sdk.lowlevel_server(server))  # issue #35: a malformed answer is named, not bare -32602

    def streamable_http_app(self, **options: Any) -> Starlette:
        """`server.streamable_http_app(**options)`, with the seed dialects' endpoints and the
        `X-Mrtr-Instance` header. The fleet bus and the task worker run with the server's
        lifespan, here as however else it is served (`_SDKHost.install_tasks`)."""
        app = self.server.streamable_http_app(**options)
        if self._dialects is not None:
            self._dialects.mount(app, options.get("streamable_http_path", "/mcp"))
        if self.instance_name is not None:
            app.add_middleware(InstanceHeader, name=self.instance_name)
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
        **flow: Unpack[ToolOptions],
    ) -> Callable[[F], F]:
        """Register an async flow function as a tool (same metadata options as `@server.tool()`).

        `task="optional"` runs the call as a durable task when the client declares the tasks
        extension (and inline otherwise); `task="required"` refuses clients that do not
        (-32021). The same body serves every case: in a task, its asks park the task in
        `input_required` until `tasks/update` answers. With `mrtr_first=True` the call
        first asks inline, as MRTR rounds, and becomes a task at its first step or
        `ctx.continue_as_task()` (SEP-2663's composition). `flow` takes `mrtr.ToolOptions`
        (`task=`, `mrtr_first=`, `requires=`, `max_rounds=`, `deadline=`, `max_state_bytes=`).
        """
        reject_bare_use(name, "tool")
        options, _ = flow_options("tool", flow)

        def decorator(fn: F) -> F:
            spec = self._core.spec(fn, name, options)
            wrapper = _sdk_entry_point(fn, spec, self._core, refused=_refused_as_tool_error)
            if spec.task != "never":
                shape = func_metadata(wrapper, skip_names=[spec.request_param], structured_output=structured_output)
                self._core.register_task(spec, shape.convert_result)
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
        **flow: Unpack[FlowOptions],
    ) -> Callable[[F], F]:
        """Register an async flow function as a prompt (`prompts/get` may take several rounds)."""
        reject_bare_use(name, "prompt")
        options, _ = flow_options("prompt", flow)

        def decorator(fn: F) -> F:
            spec = self._core.spec(fn, name, options)
            wrapper = _sdk_entry_point(fn, spec, self._core, refused=refused_as_client_error(spec))
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
        **flow: Unpack[FlowOptions],
    ) -> Callable[[F], F]:
        """Register an async flow function as a resource; `uri` may be a template or a fixed URI."""
        reject_bare_use(uri, "resource")
        checked, _ = flow_options("resource", flow)

        def decorator(fn: F) -> F:
            spec = self._core.spec(fn, name, checked)
            wrapper = _sdk_entry_point(fn, spec, self._core, refused=refused_as_client_error(spec))
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


class _SDKHost(Host):
    """The SDK's `MCPServer` as the host core sees it."""

    kind = "MCPServer"
    server: MCPServer[Any]

    def state_security(self) -> RequestStateSecurity | None:
        return sdk.state_security(self.server)

    def server_middleware(self) -> list[Any]:
        chain: list[Any] = sdk.lowlevel_server(self.server).middleware
        return chain

    def shares_state_key(self) -> bool:  # the SDK fills in a key of this process's own when given none
        return super().shares_state_key() and not sdk.uses_process_local_key(self.server)

    def given_bus(self) -> SubscriptionBus | None:
        return None if sdk.uses_default_bus(self.server) else sdk.subscription_bus(self.server)

    def use_bus(self, bus: SubscriptionBus | None) -> SubscriptionBus:
        if bus is not None and bus is not sdk.subscription_bus(self.server):
            sdk.set_subscription_bus(self.server, bus)
        return sdk.subscription_bus(self.server)

    def install_tasks(self, extension: TasksExtension, listen: ListenHandler, running: Running) -> None:
        if not sdk.has_extension(self.server, extension):  # the public route is MCPServer(extensions=[...])
            sdk.install_extension(self.server, extension)
        if sdk.serves_listen(self.server):  # `subscriptions/listen` as the SDK serves it, plus `taskIds`
            sdk.serve_listen(self.server, listen)
        # The low-level server's lifespan is what `server.run()` (stdio, streamable HTTP) and every
        # streamable-HTTP app's session manager enter, once per serving (`flows.streamable_http_app()`
        # included): `running` enters with it.
        sdk.wrap_lifespan(self.server, running)


def _refused_as_tool_error(exc: InputRefused) -> Exception:
    return ToolError(str(exc))


def _sdk_entry_point(
    fn: Callable[..., Any], spec: FlowSpec, core: HostCore, refused: Callable[[InputRefused], Exception]
) -> Callable[..., Any]:
    """An SDK-registrable function: the flow's signature, with the SDK `Context` injected.

    A call that becomes a task leaves the SDK's tool wrapper as `TaskCreated` (an `MCPError`,
    which the SDK passes through untouched) for the tasks extension to answer with.
    """
    request_param, call = spec.request_param, core.call

    async def run(kwargs: dict[str, Any]) -> Any:
        outcome = await call(spec, kwargs.pop(request_param), kwargs)
        if type(outcome) is Value:
            return outcome.value
        if type(outcome) is InputRequiredResult:
            return outcome
        if isinstance(outcome, TaskStarted):
            raise TaskCreated(outcome.result)
        if isinstance(outcome, Refused):
            raise refused(outcome.error) from None
        raise cast(Failure[MCPError], outcome).error  # Unavailable, Rejected: the SDK sends it as it is

    injected = inspect.Parameter(request_param, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    return entry_point(fn, spec, run, extra=[injected])


__all__ = ["Flows"]
