"""mrtr's tasks extension on FastMCP: the same `tasks/get|update|cancel` and task engine, as a
FastMCP `ServerExtension`.

FastMCP's extension API mirrors the SDK's: method handlers take the SDK's request context
and validated params, and a `tools/call` interceptor wraps the tool body. This adapter
hands both to mrtr's `TasksExtension` unchanged, turns the `CreateTaskResult` it answers a
task-augmented call with into a model FastMCP serializes, and ties the engine's background
work (the lease scanner that adopts orphaned tasks) to the server's lifespan.

FastMCP masks exceptions a tool body raises into `isError` results, so a call that becomes a
task cannot leave the body as the SDK host's `TaskCreated` does: the tool entry returns
`TaskStartedResult`, a `ToolResult` FastMCP passes through untouched, and the interceptor
answers with the `CreateTaskResult` it carries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastmcp import Context, FastMCP
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation, ToolCallOutcome
from fastmcp.tools import ToolResult
from mcp.server.context import ServerRequestContext
from mcp_types import CallToolRequestParams, SubscriptionsListenRequestParams
from pydantic import BaseModel, PrivateAttr

from mrtr._engine.spec import TaskStarted
from mrtr._wire import TASKS_EXTENSION
from mrtr.fastmcp import _internals as internals
from mrtr.tasks._extension import TasksExtension
from mrtr.tasks._listen import ListenHandler


class TaskStartedResult(ToolResult):
    """A tool call that became a durable task: `started` carries its `CreateTaskResult`."""

    _started: TaskStarted = PrivateAttr()

    def __init__(self, started: TaskStarted) -> None:
        super().__init__(content=[])
        self._started = started

    @property
    def started(self) -> TaskStarted:
        return self._started


class FastMCPTasks(ServerExtension):
    """`io.modelcontextprotocol/tasks` on a FastMCP server, served by mrtr's `TasksExtension`."""

    identifier = TASKS_EXTENSION

    def __init__(self, tasks: TasksExtension, running: Callable[[], AbstractAsyncContextManager[None]]) -> None:
        self.tasks = tasks
        self.running = running
        """The host core's background work (fleet bus, task worker), entered with the server's lifespan."""

    def clone(self) -> FastMCPTasks:
        return FastMCPTasks(self.tasks, self.running)  # the engine is shared state, never deep-copied

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

        outcome = await self.tasks.intercept_tool_call(params, wire, proceed)
        if isinstance(outcome, TaskStartedResult):  # the call became a task: answer with its CreateTaskResult
            return outcome.started.result
        if not isinstance(outcome, BaseModel):
            raise RuntimeError("the tool call produced no result")
        return outcome  # the tool's own result, as FastMCP produced it

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        """Adopt orphaned tasks from boot, not from the first tasks/* request; stop with the server."""
        return self.running()


def serve_listen(mcp: FastMCP[Any], handler: ListenHandler) -> None:
    """Serve `subscriptions/listen` with mrtr's handler: FastMCP 4.2 does not serve it at all."""
    internals.add_request_handler(mcp, "subscriptions/listen", SubscriptionsListenRequestParams, handler)


__all__ = ["FastMCPTasks", "TaskStartedResult", "serve_listen"]
