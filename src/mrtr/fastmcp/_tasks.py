"""mrtr's tasks extension on FastMCP: the same `tasks/get|update|cancel` and task engine, as a
FastMCP `ServerExtension`.

FastMCP's extension API mirrors the SDK's: method handlers take the SDK's request context
and validated params, and a `tools/call` interceptor wraps the tool body. This adapter
hands both to mrtr's `TasksExtension` unchanged, turns the `CreateTaskResult` it answers a
task-augmented call with into a model FastMCP serializes, and ties the engine's background
work (the lease scanner that adopts orphaned tasks) to the server's lifespan.

FastMCP masks exceptions a tool body raises into `isError` results, so the engine's
`TaskCreated` cannot travel up to the interceptor as it does on `MCPServer`: the tool entry
drops the `CreateTaskResult` into the box this interceptor set for the call (`created_box`)
and ends the body with a placeholder the interceptor replaces.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from typing import Any

from fastmcp import Context, FastMCP
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation, ToolCallOutcome
from mcp.server.context import ServerRequestContext
from mcp_types import CallToolRequestParams, SubscriptionsListenRequestParams

from mrtr._wire import TASKS_EXTENSION, CreateTaskResult
from mrtr.buses._base import BrokerBus
from mrtr.fastmcp import _internals as internals
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler

logger = logging.getLogger("mrtr.fleet")

created_box: ContextVar[list[dict[str, Any]] | None] = ContextVar("mrtr_fastmcp_created_task", default=None)
"""Set by the interceptor for one `tools/call`; the tool entry puts the task it created in it."""


class FastMCPTasks(ServerExtension):
    """`io.modelcontextprotocol/tasks` on a FastMCP server, served by mrtr's `TasksExtension`."""

    identifier = TASKS_EXTENSION

    def __init__(self, tasks: TasksExtension, bus: BrokerBus | None = None) -> None:
        self.tasks = tasks
        self.bus = bus
        """A fleet bus to start and close with the server (None: an in-process bus, nothing to run)."""

    def clone(self) -> FastMCPTasks:
        return FastMCPTasks(self.tasks, self.bus)  # the engine is shared state, never deep-copied

    def methods(self) -> Sequence[MethodBinding]:
        return [MethodBinding(b.method, b.params_type, b.handler) for b in self.tasks.methods()]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, context: Context, call_next: ToolCallContinuation
    ) -> ToolCallOutcome:
        wire = internals.request_wire(context)
        if wire is None:  # not a wire request (a background call): nothing to turn into a task
            return await call_next()

        async def proceed(_: ServerRequestContext[Any, Any]) -> Any:
            return await call_next()

        box: list[dict[str, Any]] = []
        token = created_box.set(box)
        try:
            outcome = await self.tasks.intercept_tool_call(params, wire, proceed)
        finally:
            created_box.reset(token)
        if box:  # the call became a task: its CreateTaskResult replaces the body's placeholder
            return CreateTaskResult.model_validate(box[0])
        if isinstance(outcome, dict):
            return CreateTaskResult.model_validate(outcome)
        if outcome is None:
            raise RuntimeError("the tool call produced no result")
        return outcome  # the tool's own result, as FastMCP produced it

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        if self.bus is not None:
            try:
                await self.bus.start(timeout=5.0)
            except Exception:
                logger.warning("the fleet bus could not reach its broker at start; it keeps trying in the background")
        self.tasks.engine.ensure_running()  # adopt orphaned tasks from boot, not from the first tasks/* request
        try:
            yield
        finally:
            await self.tasks.engine.close()
            if self.bus is not None:
                await self.bus.close()

    def lifespan(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._running()


def serve_listen(mcp: FastMCP[Any], handler: ListenHandler) -> None:
    """Serve `subscriptions/listen` with mrtr's handler: FastMCP 4.2 does not serve it at all."""
    internals.add_request_handler(mcp, "subscriptions/listen", SubscriptionsListenRequestParams, handler)


__all__ = ["FastMCPTasks", "created_box", "serve_listen"]
