"""The original SEP-2322 persistent workflow, as an opt-in compatibility dialect.

Before the tasks extension, SEP-2322 drafts had a client that sees `input_required` on
`tasks/get` call `tasks/result` to fetch the `inputRequests`, then answer with
`tasks/input_response` (the task id in `_meta["io.modelcontextprotocol/related-task"]`),
and call `tasks/result` again for the final result. Some early clients speak only that.
The tasks extension requires `tasks/result` to be *unknown* (-32601), so this dialect is
off unless a server asks for it (`Flows(..., dialects=["sep-2322-tasks"])`); both then act
on the same tasks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from mcp.server.context import ServerRequestContext
from mcp.server.extension import MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from pydantic import ConfigDict

from mrtr._wire import RELATED_TASK, InputResponses, JSONObject, TaskRequestParams, TaskView


class TaskAccess(Protocol):
    """What the seed dialect needs of the tasks extension (which owns the checks)."""

    async def load_checked(
        self, ctx: ServerRequestContext[Any, Any], task_id: str, *, check_name: bool = True
    ) -> TaskView: ...

    async def reload(self, task_id: str) -> TaskView: ...

    async def apply_answers(self, task_id: str, responses: InputResponses, *, strict: bool) -> Any: ...


_RESULT_WAIT = 25.0  # seconds tasks/result holds a request while the task is still working


class InputResponseParams(RequestParams):
    model_config = ConfigDict(extra="allow")
    input_responses: InputResponses


def seed_methods(extension: TaskAccess) -> list[MethodBinding]:

    async def result(ctx: ServerRequestContext[Any, Any], params: TaskRequestParams) -> JSONObject:
        record = await extension.load_checked(ctx, params.task_id)
        deadline = time.monotonic() + _RESULT_WAIT
        while record.status == "working" and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, record.poll_interval_ms / 1000))
            record = await extension.reload(params.task_id)
        related = {"_meta": {RELATED_TASK: {"taskId": record.task_id}}}
        if record.status == "input_required":
            return {"resultType": "input_required", "inputRequests": record.input_requests, **related}
        if record.status == "completed" and record.result is not None:
            return {**record.result, **related}
        if record.status == "failed" and record.error is not None:
            raise MCPError(code=record.error["code"], message=record.error["message"], data=record.error.get("data"))
        if record.status == "cancelled":
            raise MCPError(code=INVALID_PARAMS, message=f"task {record.task_id} was cancelled")
        return {"resultType": "input_required", **related}  # still working: state-only, retry

    async def input_response(ctx: ServerRequestContext[Any, Any], params: InputResponseParams) -> JSONObject:
        meta = (ctx.params or {}).get("_meta") or {}
        task_id = (meta.get(RELATED_TASK) or {}).get("taskId")
        if not isinstance(task_id, str):
            raise MCPError(code=INVALID_PARAMS, message=f"tasks/input_response needs _meta[{RELATED_TASK!r}].taskId")
        await extension.load_checked(ctx, task_id, check_name=False)
        # The seed's rule for answers that do not fit: acknowledge, keep asking.
        await extension.apply_answers(task_id, params.input_responses, strict=False)
        return {"_meta": {RELATED_TASK: {"taskId": task_id}}}

    return [
        MethodBinding("tasks/result", TaskRequestParams, result),
        MethodBinding("tasks/input_response", InputResponseParams, input_response),
    ]


__all__ = ["InputResponseParams", "TaskAccess", "seed_methods"]
