"""Client side of durable tasks: opt in, listen (or poll), answer `input_required`, cancel, watch.

`TasksClient` is an SDK `ClientExtension`: given to `mcp.Client(extensions=[...])` it
declares `io.modelcontextprotocol/tasks` on every request and claims the `task` result
shape, so `client.call_tool(...)` transparently follows a task to its end. The same
elicitation, sampling and roots handlers that answer MRTR rounds answer the task's
`inputRequests` (all three kinds), through `tasks/update`. Where the server pushes
`notifications/tasks` the client listens for them (`mrtr.client._watch`) instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import mcp_types as t
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientSession, ElicitationFnT, ListRootsFnT, SamplingFnT
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, TypeAdapter

from mrtr._wire import (
    TASKS_EXTENSION,
    CreateTaskResult,
    DetailedTask,
    InputResponses,
    JSONObject,
    TaskRequestParams,
    UpdateTaskParams,
)
from mrtr.client._transport import NO_RETRY, RetryPolicy, TransportError, resending
from mrtr.client._watch import NotOffered, Reservation, TaskFeed

Answerer = Callable[[t.InputRequest], Awaitable[Any]]


class UnansweredInput(RuntimeError):
    """A task asked something none of this client's handlers answers."""


def answer_with(
    elicitation_callback: Callable[..., Awaitable[t.ElicitResult | t.ErrorData]] | None = None,
    sampling_callback: Callable[..., Awaitable[t.CreateMessageResult | t.CreateMessageResultWithTools | t.ErrorData]]
    | None = None,
    list_roots_callback: Callable[..., Awaitable[t.ListRootsResult | t.ErrorData]] | None = None,
) -> Answerer:
    """One `answer(request)` made of `mcp.Client`'s callbacks (each called with `context=None`)."""

    async def answer(request: t.InputRequest) -> Any:
        if isinstance(request, t.ElicitRequest) and elicitation_callback is not None:
            return await elicitation_callback(None, request.params)
        if isinstance(request, t.CreateMessageRequest) and sampling_callback is not None:
            return await sampling_callback(None, request.params)
        if isinstance(request, t.ListRootsRequest) and list_roots_callback is not None:
            return await list_roots_callback(None)
        raise UnansweredInput(f"the task asked {request.method}, which this client has no handler for")

    return answer


def tasks_client(
    server: Any,
    *,
    elicitation_callback: ElicitationFnT | None = None,
    sampling_callback: SamplingFnT | None = None,
    list_roots_callback: ListRootsFnT | None = None,
    on_status: Callable[[TaskSnapshot], Awaitable[None] | None] | None = None,
    retry: RetryPolicy | None = None,
    **client_options: Any,
) -> Any:
    """An `mcp.Client` that follows tasks, answering with these callbacks everywhere.

    It declares exactly the capabilities the callbacks cover (so a task may ask them), and the
    same callbacks answer inline rounds, legacy requests and task questions alike.
    """
    from mcp import Client

    extension = TasksClient(
        elicitation_callback=elicitation_callback,
        sampling_callback=sampling_callback,
        list_roots_callback=list_roots_callback,
        on_status=on_status,
        retry=retry,
    )
    extensions = [*client_options.pop("extensions", ()), extension]
    return Client(
        server,
        extensions=extensions,
        elicitation_callback=elicitation_callback,
        sampling_callback=sampling_callback,
        list_roots_callback=list_roots_callback,
        **client_options,
    )


class TaskCancelled(RuntimeError):
    """The task ended `cancelled`."""


CreatedTask = CreateTaskResult
"""The flat result a server returns instead of the tool's result (`mrtr._wire.CreateTaskResult`)."""


class _TaskRequest(t.Request[TaskRequestParams, str]):
    name_param = "taskId"  # the SDK mirrors it into the Mcp-Name routing header


class _UpdateRequest(t.Request[UpdateTaskParams, str]):
    name_param = "taskId"


class _AnyResult(BaseModel):
    """Any JSON object: `tasks/cancel` and `tasks/update` answer with an acknowledgement only.

    A model rather than a `TypeAdapter` of a dict: the SDK's `send_request` bounds its result
    type by `BaseModel`.
    """

    model_config = ConfigDict(extra="allow")


_ANY = _AnyResult
_DETAILED = TypeAdapter(DetailedTask)
# Through `cast`: with a warm incremental cache, mypy takes this union alias for a value.
_INPUT_REQUEST = TypeAdapter[t.InputRequest](cast(Any, t.InputRequest))


def as_wire(value: Any) -> Any:
    """A handler's answer as bare wire JSON (handlers may return models or plain dicts)."""
    return value.model_dump(mode="json", by_alias=True, exclude_none=True) if hasattr(value, "model_dump") else value


@dataclass(frozen=True)
class TaskSnapshot:
    """What one `tasks/get` said; handed to `on_status` whenever status or message changes."""

    task_id: str
    status: str
    status_message: str | None
    input_keys: tuple[str, ...]
    raw: JSONObject
    """The state as sent (`DetailedTask.wire()`)."""


_SDK_HTTP_ERROR = "Server returned an error response"
"""What the SDK's streamable HTTP client makes of an HTTP error without a JSON-RPC body (a 502...)."""


async def _polled(send: Callable[[], Awaitable[Any]]) -> Any:
    """Run one poll or update; failures the SDK's own transport invented become `TransportError`.

    Over `mcp.Client`'s HTTP transport a gateway 502 arrives as `MCPError(-32603, _SDK_HTTP_ERROR)`
    and a dropped stream as `CONNECTION_CLOSED`: no server sent those, and `tasks/get` and
    `tasks/update` are safe to repeat, so they are resent like any transport failure.
    """
    try:
        return await send()
    except MCPError as error:
        invented = error.code == t.CONNECTION_CLOSED or (
            error.code == t.INTERNAL_ERROR and error.error.message == _SDK_HTTP_ERROR
        )
        if invented:
            raise TransportError(f"task poll failed in transit: {error.error.message}") from error
        raise


async def get_task(session: ClientSession, task_id: str) -> DetailedTask:
    """`tasks/get`: the task's state, what it waits for or how it ended."""
    request = _TaskRequest(method="tasks/get", params=TaskRequestParams(task_id=task_id))
    return await session.send_request(request, _DETAILED)


async def cancel_task(session: ClientSession, task_id: str) -> None:
    """Ask the server to cancel task `task_id` (`tasks/cancel`); cancelling a finished task is a no-op."""
    await session.send_request(_TaskRequest(method="tasks/cancel", params=TaskRequestParams(task_id=task_id)), _ANY)


async def update_task(session: ClientSession, task_id: str, responses: InputResponses) -> None:
    """`tasks/update`: answers to some or all of the task's `inputRequests`."""
    params = UpdateTaskParams(task_id=task_id, input_responses=responses)
    await session.send_request(_UpdateRequest(method="tasks/update", params=params), _ANY)


async def follow_task(
    session: ClientSession,
    task_id: str,
    answer: Answerer,
    *,
    poll_interval: float = 0.5,
    on_status: Callable[[TaskSnapshot], Awaitable[None] | None] | None = None,
    retry: RetryPolicy = NO_RETRY,
    feed: TaskFeed | None = None,
    reservation: Reservation | None = None,
    created: CreatedTask | None = None,
) -> t.CallToolResult:
    """Follow a task to its end, answering its input requests; returns the tool's result.

    With a `feed` (a `TasksClient`'s) it listens for the task's `notifications/tasks` when the
    server offers them (see `mrtr.client._watch`), and polls `tasks/get` otherwise; with the
    `reservation` (`feed.reserve`) whose key created the task, on the stream that watched it
    ahead. Each
    `tasks/get` and `tasks/update` is bounded by the session's timeout and resent per `retry`
    after a `TransportError` (both are safe to repeat: an answer to a key that is no longer
    pending is ignored). The task itself may run as long as the server lets it.

    Raises:
        MCPError: The task `failed` (its JSON-RPC error).
        TaskCancelled: The task was cancelled.
    """
    follower = _Follower(session, task_id, answer, on_status, retry)
    if created is not None:  # the first state this client saw: `on_status` hears of it first
        await follower.report(DetailedTask.model_validate(created.model_dump(exclude={"result_type"})))
    if feed is not None and feed.offered(session):
        try:
            async with contextlib.aclosing(feed.states(session, task_id, follower.fetch, reservation)) as states:
                async for task in states:
                    if (done := await follower.step(task)) is not None:
                        return done
        except NotOffered:
            pass  # the server does not push: poll
    while True:
        task = await follower.fetch()
        if (done := await follower.step(task)) is not None:
            return done
        if task.status == "input_required" and follower.just_answered:
            continue  # look again at once: the answers may have finished the task
        interval = task.poll_interval_ms
        await asyncio.sleep(interval / 1000 if isinstance(interval, int) and interval > 0 else poll_interval)


class _Follower:
    """What following one task remembers, whether its states are polled or pushed."""

    def __init__(
        self,
        session: ClientSession,
        task_id: str,
        answer: Answerer,
        on_status: Callable[[TaskSnapshot], Awaitable[None] | None] | None,
        retry: RetryPolicy,
    ) -> None:
        self.session, self.task_id, self.answer, self.on_status, self.retry = session, task_id, answer, on_status, retry
        self.answered: set[str] = set()
        self.last: tuple[str, str | None] | None = None
        self.just_answered = False

    async def fetch(self) -> DetailedTask:
        return await resending(self.retry, partial(_polled, partial(get_task, self.session, self.task_id)))

    async def report(self, task: DetailedTask) -> None:
        """Tell `on_status` of a new status or message."""
        if self.on_status is not None and (task.status, task.status_message) != self.last:
            self.last = (task.status, task.status_message)
            requests = tuple(task.input_requests or ())
            hook = self.on_status(TaskSnapshot(self.task_id, task.status, task.status_message, requests, task.wire()))
            if hook is not None:
                await hook

    async def step(self, task: DetailedTask) -> t.CallToolResult | None:
        """Act on one state of the task: its result when it ended, else None (after answering what it asks)."""
        status = task.status
        requests = task.input_requests or {}
        self.just_answered = False
        await self.report(task)
        if status == "completed":
            return t.CallToolResult.model_validate(task.result or {"content": []})
        if status == "failed":
            error = task.error or {"code": t.INTERNAL_ERROR, "message": "task failed"}
            raise MCPError.from_error_data(t.ErrorData.model_validate(error))
        if status == "cancelled":
            raise TaskCancelled(task.status_message or f"task {self.task_id} was cancelled")
        # Snapshots repeat pending keys on every poll: answer each key once.
        fresh = {k: v for k, v in requests.items() if k not in self.answered} if status == "input_required" else {}
        if fresh:
            parsed = {k: _INPUT_REQUEST.validate_python(v) for k, v in fresh.items()}
            values = await asyncio.gather(*(self.answer(r) for r in parsed.values()))
            wire = {k: as_wire(v) for k, v in zip(parsed, values, strict=True)}
            await resending(self.retry, partial(_polled, partial(update_task, self.session, self.task_id, wire)))
            self.answered |= set(fresh)
            self.just_answered = True
        return None


class TasksClient(ClientExtension):
    """Declares the tasks extension and follows `task` results to completion.

    Task questions are answered by the same handlers as everywhere: `mcp.Client`'s callbacks
    (`elicitation_callback`, `sampling_callback`, `list_roots_callback`, each called with
    `context=None`), or one `answer(request)` for all three. An extension cannot declare the
    client's capabilities, and a server refuses to ask what the client did not declare: give
    the `mcp.Client` the same callbacks, or build both with `tasks_client(...)`.

    Args:
        answer: Turns one input request (elicitation, sampling, roots) into its result.
        elicitation_callback: `mcp.Client`'s elicitation callback (instead of `answer`).
        sampling_callback: `mcp.Client`'s sampling callback (instead of `answer`).
        list_roots_callback: `mcp.Client`'s roots callback (instead of `answer`).
        on_status: Called with each new status (for progress displays).
        on_created: Called with the `CreatedTask` before following it.
        retry: Resends of `tasks/get` / `tasks/update` after a transport failure (a
            `mrtr.client._transport.TransportError`, or the SDK transport's own stand-in errors for
            an HTTP error status or a dropped stream); default `RetryPolicy()`. A connection reset
            still ends every call on an `mcp.Client` over HTTP (SDK behaviour): use `FlowClient`.
        listen: Follow tasks by `subscriptions/listen` (`notifications/tasks`) where the server
            offers it, polling `tasks/get` elsewhere (default); False: always poll.
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        answer: Answerer | None = None,
        *,
        elicitation_callback: Callable[..., Awaitable[t.ElicitResult | t.ErrorData]] | None = None,
        sampling_callback: Callable[
            ..., Awaitable[t.CreateMessageResult | t.CreateMessageResultWithTools | t.ErrorData]
        ]
        | None = None,
        list_roots_callback: Callable[..., Awaitable[t.ListRootsResult | t.ErrorData]] | None = None,
        on_status: Callable[[TaskSnapshot], Awaitable[None] | None] | None = None,
        on_created: Callable[[CreatedTask], Awaitable[None] | None] | None = None,
        retry: RetryPolicy | None = None,
        listen: bool = True,
    ) -> None:
        callbacks = (elicitation_callback, sampling_callback, list_roots_callback)
        if answer is not None and any(callbacks):
            raise ValueError("give answer= or the mcp.Client callbacks, not both")
        if answer is None and not any(callbacks):
            raise ValueError("TasksClient needs answer= or at least one mcp.Client callback")
        self._answer = answer or answer_with(*callbacks)
        self._retry = retry or RetryPolicy()
        self._on_status = on_status
        self._on_created = on_created
        self.feed = TaskFeed() if listen else None
        """Where pushed `notifications/tasks` go (None: this client only polls)."""

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [self.feed.binding()] if self.feed is not None else []

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> t.CallToolResult:
        if self._on_created is not None:
            hook = self._on_created(created)
            if hook is not None:
                await hook
        interval = (created.poll_interval_ms or 500) / 1000
        return await follow_task(
            ctx.session,
            created.task_id,
            self._answer,
            poll_interval=interval,
            on_status=self._on_status,
            retry=self._retry,
            feed=self.feed,
            created=created,
        )


__all__ = [
    "UnansweredInput",
    "answer_with",
    "tasks_client",
    "CreatedTask",
    "TaskCancelled",
    "TaskSnapshot",
    "TasksClient",
    "cancel_task",
    "follow_task",
    "get_task",
    "update_task",
]
