"""Seed 001's persistent workflow ("Example Flow for Persistent Tools"), on the draft's endpoint.

A `tools/call` carrying `params.task: {ttl}` becomes the 2026-07-28 call with the tasks
extension declared on the request, so the same flow and the same task engine make the task;
`tasks/get`, `tasks/result`, `tasks/cancel` and the seed's answer message (an id, no method,
`input_responses` plus `_meta["io.modelcontextprotocol/related-task"]`) become `tasks/get`,
`tasks/update` and `tasks/cancel` against the same server, so the tasks stay bound to their
creator (another principal gets exactly the error an unknown task id gets) and any instance
of the fleet answers any step. The shapes are the seed's: `result.task` on creation, the
task's fields (`taskId`, `status`, `statusMessage`, `createdAt`, `ttl`, `pollInterval`) on
`tasks/get`, top-level `input_requests` from `tasks/result` while the task waits.

Choices where the seed is ambiguous (one each; docs/dialects.md says the same):

- status: the tasks extension's lowercase values (`working`, `completed`); the seed's "Working" is read as those.
- ttl: `params.task.ttl` asks; the answer's `ttl` is the server's (`Flows(task_ttl=)`), as tasks allow.
- answer message: acked `result: {_meta: related-task}`; checked like `tasks/update` (-32602 if one does not fit).
- `tasks/result` on a working task: held up to 25 s for input or the end, then answered like `tasks/get`.
- `tasks/result` of a failed task: its JSON-RPC error; of a cancelled one: -32602.
- `mrtr_first=True` flows first answer with ephemeral `input_requests` (the seed's "Interactions" section).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, cast

import anyio
from mcp_types import INVALID_PARAMS, ErrorData

from mrtr._dialects.draft import NAME, DraftReply
from mrtr._dialects.plumbing import (
    Caller,
    DialectError,
    Gateway,
    Origin,
    Reply,
    invalid,
    is_input_required,
    modern_params,
    plain_result,
    unwrap_answer,
)
from mrtr._wire import RELATED_TASK, TASKS_EXTENSION, InputResponses, JSONObject

Incoming = Callable[[Mapping[str, Any]], tuple[InputResponses, str | None]]
"""A message-level dialect's reading of a round: the answers and sealed state a message carries."""
Outgoing = Callable[[Any, Mapping[str, Any]], Mapping[str, object]]
"""A message-level dialect's writing of a round that needs input: the JSON-RPC body (its own shape)."""

METHODS = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})
"""The task methods the draft endpoint serves itself (anything else there is a round or passes through)."""
RESULT_WAIT = 25.0
"""Seconds `tasks/result` holds a request while the task is still working."""

_MESSAGES = {
    "working": "Task is working.",
    "input_required": "Input Required to Proceed call tasks/result",
    "completed": "Task has been completed successfully, call tasks/result",
    "failed": "Task has failed, call tasks/result",
    "cancelled": "Task has been cancelled.",
}


def handles(message: Mapping[str, Any]) -> bool:
    """Whether a draft message belongs to the persistent workflow (served by `serve`)."""
    method = message.get("method")
    if method is None:
        return "input_responses" in message and "id" in message
    if method in METHODS:
        return True
    params = message.get("params")
    return method == "tools/call" and isinstance(params, dict) and isinstance(params.get("task"), dict)


async def serve(
    gateway: Gateway,
    origin: Origin,
    message: Mapping[str, Any],
    caller: Caller,
    incoming: Incoming,
    outgoing: Outgoing,
) -> Mapping[str, object]:
    """The JSON-RPC body answering one persistent-workflow message (see `handles`).

    `incoming` / `outgoing` are the draft's round shape, for a task call that first asks
    inline. Raises `DialectError` for what the server refuses.
    """
    request_id = message.get("id")
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        raise invalid("a request id must be a string or an integer", "malformed_request")
    tasks_caller = _declaring_tasks(caller)
    method = message.get("method")
    params = message.get("params")
    params = cast(JSONObject, params) if isinstance(params, dict) else {}
    if method is None:
        return await _answer(gateway, origin, request_id, message, tasks_caller)
    if method == "tools/call":
        return await _create(gateway, origin, request_id, message, params, tasks_caller, incoming, outgoing)
    task_id = params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise invalid(f"{method} needs params.taskId", "missing_task_id")
    if method == "tasks/get":
        task = await _get(gateway, origin, request_id, task_id, tasks_caller)
        return _reply(request_id, seed_task(task))
    if method == "tasks/cancel":
        await gateway.call(origin, request_id, "tasks/cancel", _params({"taskId": task_id}, tasks_caller), dialect=NAME)
        task = await _get(gateway, origin, request_id, task_id, tasks_caller)
        return _reply(request_id, seed_task(task))
    return await _result(gateway, origin, request_id, task_id, tasks_caller)


class SeedTask(TypedDict):
    """A tasks-extension `Task` as seed 001 writes it: `ttl` and `pollInterval`, always a `statusMessage`."""

    taskId: str | None
    status: str
    statusMessage: str
    createdAt: str | None
    ttl: int | None
    pollInterval: int | None


def seed_task(task: Mapping[str, Any], message: str | None = None) -> SeedTask:
    """A tasks-extension `Task` as the seed writes it: `ttl` and `pollInterval`, always a `statusMessage`."""
    status = str(task.get("status"))
    return {
        "taskId": task.get("taskId"),
        "status": status,
        "statusMessage": task.get("statusMessage") or message or _MESSAGES.get(status, f"Task is {status}."),
        "createdAt": task.get("createdAt"),
        "ttl": task.get("ttlMs"),
        "pollInterval": task.get("pollIntervalMs"),
    }


def related(task_id: str) -> JSONObject:
    return {RELATED_TASK: {"taskId": task_id}}


# -- the steps -------------------------------------------------------------------------------------


async def _create(
    gateway: Gateway,
    origin: Origin,
    request_id: str | int,
    message: Mapping[str, Any],
    params: Mapping[str, Any],
    caller: Caller,
    incoming: Incoming,
    outgoing: Outgoing,
) -> Mapping[str, object]:
    answers, state = incoming(message)
    plain = {k: v for k, v in params.items() if k != "task"}
    result = await gateway.call(
        origin, request_id, "tools/call", modern_params(plain, answers, state, caller), dialect=NAME
    )
    if is_input_required(result):
        return outgoing(request_id, result)
    if result.get("resultType") == "task":
        name = params.get("name")
        created = f"Task has been created for {name} tool invocation."
        return _reply(request_id, {"task": seed_task(result, created if result.get("status") == "working" else None)})
    return _reply(request_id, plain_result(result))


async def _get(gateway: Gateway, origin: Origin, request_id: str | int, task_id: str, caller: Caller) -> Any:
    return await gateway.call(origin, request_id, "tasks/get", _params({"taskId": task_id}, caller), dialect=NAME)


async def _result(
    gateway: Gateway, origin: Origin, request_id: str | int, task_id: str, caller: Caller
) -> Reply | DraftReply:
    task = await _get(gateway, origin, request_id, task_id, caller)
    deadline = time.monotonic() + RESULT_WAIT
    while task.get("status") == "working" and time.monotonic() < deadline:
        interval = task.get("pollIntervalMs")
        await anyio.sleep(min(max((interval if isinstance(interval, int) else 500) / 1000, 0.05), 1.0))
        task = await _get(gateway, origin, request_id, task_id, caller)
    status = task.get("status")
    if status == "input_required":
        asking: DraftReply = {
            "jsonrpc": "2.0",
            "id": request_id,
            "input_requests": dict(task.get("inputRequests") or {}),
            "_meta": related(task_id),
        }
        return asking
    if status == "completed" and isinstance(task.get("result"), dict):
        result = plain_result(task["result"])
        result["_meta"] = {**(result.get("_meta") or {}), **related(task_id)}
        return _reply(request_id, result)
    if status == "failed" and isinstance(task.get("error"), dict):
        raise DialectError(ErrorData.model_validate(task["error"]))
    if status == "cancelled":
        raise DialectError(ErrorData(code=INVALID_PARAMS, message=f"task {task_id} was cancelled"))
    return _reply(request_id, {**seed_task(task), "_meta": related(task_id)})  # still working: poll on


async def _answer(
    gateway: Gateway, origin: Origin, request_id: str | int, message: Mapping[str, Any], caller: Caller
) -> Reply:
    task_id = _related_task(message)
    responses = message.get("input_responses")
    if not isinstance(responses, dict):
        raise invalid("input_responses must be an object keyed like input_requests", "malformed_answers")
    answers = {k: answer for k, v in responses.items() if (answer := unwrap_answer(v)) is not None}
    update = _params({"taskId": task_id}, caller)
    update["inputResponses"] = answers
    await gateway.call(origin, request_id, "tasks/update", update, dialect=NAME)
    return _reply(request_id, {"_meta": related(task_id)})


# -- helpers ------------------------------------------------------------------------------------------


def _related_task(message: Mapping[str, Any]) -> str:
    """The task an answer message names: `_meta` on the message (the seed), or in `params._meta` (lenient)."""
    params = message.get("params")
    for meta in (message.get("_meta"), params.get("_meta") if isinstance(params, dict) else None):
        task = meta.get(RELATED_TASK) if isinstance(meta, dict) else None
        task_id = task.get("taskId") if isinstance(task, dict) else None
        if isinstance(task_id, str) and task_id:
            return task_id
    raise invalid(f"input_responses for a task need _meta[{RELATED_TASK!r}].taskId", "missing_related_task")


def _declaring_tasks(caller: Caller) -> Caller:
    """The caller, with the tasks extension declared: the seed's `params.task` (and task methods) opt in."""
    capabilities = dict(caller.capabilities)
    extensions = capabilities.get("extensions")
    capabilities["extensions"] = {**(extensions if isinstance(extensions, dict) else {}), TASKS_EXTENSION: {}}
    return Caller(capabilities=capabilities, client_info=caller.client_info, protocol_version=caller.protocol_version)


def _params(params: Mapping[str, Any], caller: Caller) -> JSONObject:
    return modern_params(params, None, None, caller)


def _reply(request_id: str | int, result: Mapping[str, Any]) -> Reply:
    return {"jsonrpc": "2.0", "id": request_id, "result": dict(result)}


__all__ = [
    "METHODS",
    "RESULT_WAIT",
    "Incoming",
    "Outgoing",
    "SeedTask",
    "handles",
    "related",
    "seed_task",
    "serve",
]
