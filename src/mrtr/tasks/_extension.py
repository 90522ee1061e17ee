"""The `io.modelcontextprotocol/tasks` extension (SEP-2663) as an SDK `Extension`.

Wire layer only, shared by every task engine (`mrtr.tasks._seam.TaskEngine`: mrtr's lease
runtime, or Temporal): it checks the per-request opt-in and the `Mcp-Name` routing header,
binds tasks to their principal, validates answers against the requests they answer, and
shapes `DetailedTask`; the engine stores, runs, resumes and cancels. Any instance of the
fleet answers any `tasks/get`, `tasks/update` or `tasks/cancel`.

Tasks belong to their creator: a task created by an authenticated request records (a digest
of) the principal the SDK binds `requestState` to, and every `tasks/*` request (and the seed
dialect's) from any other principal, or unauthenticated, gets exactly the error an unknown
task id gets, so the answer reveals nothing. Tasks created without authentication are
open to anyone who holds their id, as before.

A task-augmented `tools/call` may carry `params._meta["mrtr/idempotencyKey"]` (1-200
printable characters, e.g. a UUID): a repeat with the same key, tool and principal returns
the task the first call created (see `TaskRuntime.start`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs among the project's dependencies
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
)
from pydantic import BaseModel, ValidationError

from mrtr._engine.asks import client_result
from mrtr._wire import TASKS_EXTENSION, CreateTaskResult, TaskRequestParams, UpdateTaskParams, declares_tasks
from mrtr.tasks._records import detailed_task, same_owner
from mrtr.tasks._seam import TaskEngine, TaskView, idempotency_key, unknown_task, valid_idempotency_key


class TaskCreated(MCPError):
    """Carries a `CreateTaskResult` out of the SDK's tool call to this extension's interceptor.

    `mrtr.Flows` raises it when the engine answers a call with `TaskStarted`: the SDK passes
    `MCPError`s through its tool wrapper untouched, and `TasksExtension.intercept_tool_call`
    answers with `result` instead.
    """

    def __init__(self, result: CreateTaskResult) -> None:
        super().__init__(code=INTERNAL_ERROR, message="task created outside the tasks extension")
        self.result = result


class TasksExtension(Extension):
    """The tasks extension over a task engine (`engine`; `runtime` is its older name)."""

    identifier = TASKS_EXTENSION

    def __init__(
        self, engine: TaskEngine, *, dialect: Callable[[TasksExtension], list[MethodBinding]] | None = None
    ) -> None:
        self.engine = engine
        self._dialect = dialect
        """More methods on the same tasks, from a pre-standard dialect (`Flows(dialects=["sep-2322-tasks"])`)."""

    @property
    def runtime(self) -> Any:
        """The engine (named for the lease runtime, the only engine there was)."""
        return self.engine

    def methods(self) -> list[MethodBinding]:
        methods = [
            MethodBinding("tasks/get", TaskRequestParams, self._get),
            MethodBinding("tasks/update", UpdateTaskParams, self._update),
            MethodBinding("tasks/cancel", TaskRequestParams, self._cancel),
        ]
        if self._dialect is not None:
            methods += self._dialect(self)
        return methods

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        idempotency_key(ctx)  # a malformed key is refused before anything runs, task or not
        try:
            return await call_next(ctx)
        except TaskCreated as created:
            return created.result.wire()

    # -- handlers ------------------------------------------------------------------------

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskRequestParams) -> dict[str, Any]:
        record = await self._load(ctx, params)
        return {"resultType": "complete", **detailed_task(record)}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        record = await self._load(ctx, params)
        await self.apply_answers(params.task_id, params.input_responses, strict=True, record=record)
        return {"resultType": "complete"}

    async def apply_answers(
        self, task_id: str, responses: dict[str, Any], *, strict: bool, record: TaskView | None = None
    ) -> None:
        """Record answers to outstanding input requests; the engine resumes the task once none is left.

        Keys that are not outstanding (never issued, already answered, superseded) are
        ignored. An answer that does not fit its request is a -32602 when `strict`
        (nothing is recorded), and is dropped otherwise (the request stays outstanding).
        """
        record = record if record is not None else await self.reload(task_id)
        outstanding = record.input_requests if record.status == "input_required" else {}
        accepted: dict[str, Any] = {}
        for key, answer in responses.items():
            if key not in outstanding:
                continue
            try:
                accepted[key] = _checked_answer(key, outstanding[key], answer)
            except MCPError:
                if strict:
                    raise
        if accepted:
            await self.engine.update(task_id, accepted, {k: outstanding[k] for k in accepted}, known=record)

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskRequestParams) -> dict[str, Any]:
        record = await self._load(ctx, params)
        await self.engine.cancel(params.task_id, known=record)
        return {"resultType": "complete"}  # idempotent, also on finished tasks

    # -- shared checks -------------------------------------------------------------------

    async def _load(self, ctx: ServerRequestContext[Any, Any], params: TaskRequestParams) -> TaskView:
        return await self.load_checked(ctx, params.task_id)

    async def load_checked(
        self, ctx: ServerRequestContext[Any, Any], task_id: str, *, check_name: bool = True
    ) -> TaskView:
        """The task, after the opt-in and routing-header checks every tasks/* request passes."""
        self.require_opt_in(ctx)
        headers = getattr(ctx.request, "headers", None)
        # Routing header (MUST on HTTP): checked when sent; clients that cannot set it still work.
        name = headers.get(MCP_NAME_HEADER) if headers is not None and check_name else None
        if name is not None and decode_header_value(name) != task_id:
            raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")
        self.engine.ensure_running()
        record = await self.reload(task_id)
        if not same_owner(record.owner, self.engine.owner_of(ctx)):
            raise unknown_task(task_id)  # exactly what an unknown id gets: no existence oracle
        return record

    def require_opt_in(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """-32021 unless the request declares the tasks extension (tasks/*, task notifications)."""
        if not declares_tasks(ctx.session.client_capabilities):
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message=f"{ctx.method} needs the {TASKS_EXTENSION} extension declared on the request",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )

    async def reload(self, task_id: str) -> TaskView:
        record: TaskView | None = await self.engine.get(task_id)
        if record is None:
            raise unknown_task(task_id)
        return record


def _checked_answer(key: str, request: dict[str, Any], answer: Any) -> Any:
    """Validate one `tasks/update` answer against the request it answers; -32602 if it does not fit."""
    method = request.get("method")
    if method in ("sampling/createMessage", "roots/list"):  # the version's wire schema; names the field
        return client_result(key, method, answer)
    models: dict[str | None, type[BaseModel]] = {
        "elicitation/create": ElicitResult,
        "sampling/createMessage": CreateMessageResult,
        "roots/list": ListRootsResult,
    }
    model = models.get(method, ElicitResult)
    try:
        parsed = model.model_validate(answer)
        if isinstance(parsed, ElicitResult) and parsed.action == "accept":
            schema = request.get("params", {}).get("requestedSchema")
            if schema is not None:
                jsonschema.validate(parsed.content or {}, schema)
    except (ValidationError, jsonschema.ValidationError) as exc:
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"inputResponses[{key!r}] does not answer the {method} request it is keyed to",
        ) from exc
    return parsed.model_dump(mode="json", by_alias=True, exclude_none=True)


__all__ = [
    "TaskCreated",
    "TasksExtension",
    "valid_idempotency_key",
]
