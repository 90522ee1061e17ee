"""The floor for `benchmarks/fastmcp_tasks.py`: the least code that serves its two tools as durable tasks.

A hand-written task server (issue 49): the official SDK's low-level `Server` under uvicorn, speaking
2026-07-28 with the tasks extension (`io.modelcontextprotocol/tasks`) on the same Redis as mrtr,
so mrtr's `FlowClient(url, tasks=True)` drives it unchanged. Per task it does only this:

  tools/call     one SET: the task record (`working`), then the tool runs in a background asyncio
                 task of this process; the answer is the `CreateTaskResult` (`resultType: "task"`).
  the work       one SET for the step's checkpoint (its result under a key of its own), one SET
                 for the final record (`completed`, with the tool's result).
  one question   one SET parks the record `input_required` with the elicitation; `tasks/update`
                 writes the answer into the record (one SET, back to `working`) and wakes the
                 waiting tool in this process, which then writes the final record (one SET).
  tasks/get      one GET: the record is stored as the wire `DetailedTask`, sent as it is. A task
                 still `working` in this process is first awaited until its next state change (at
                 most the poll interval): a long poll, so a poll that comes early costs no sleep
                 of a poll interval and no second poll (FlowClient's first poll is sent at once).

It is the floor, not a task system: no sealing at rest, no replay guard, no lease (a task whose
process dies is never resumed: the record is durable, the run is not), no owner check, no
idempotency key (a resent `tools/call` makes a second task), no answer validation, no history,
no listing, no cancel, no `notifications/tasks` (clients poll `tasks/get`, long-polled as above;
`FlowClient` asks to listen once per session, is refused with -32601, and polls from then on). The record's JSON is
written once per state change and read back as text: one `json.dumps` per write, one `json.loads`
per `tasks/get` (the SDK's runner wants a dict to stamp).

    python benchmarks/fastmcp_tasks_floor.py REDIS_URL PREFIX    # prints its port, serves until killed
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mcp_types as t
import redis.asyncio as aioredis
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from mrtr._wire import TASKS_EXTENSION, TaskRequestParams, UpdateTaskParams

TTL_MS = 3_600_000
"""A task's record lives an hour (mrtr's default `task_ttl`)."""
POLL_MS = 500
"""The `pollIntervalMs` clients are told (mrtr's default `task_poll_interval`)."""
QUESTION = "Go on?"
GO_SCHEMA = {"type": "object", "properties": {"go": {"type": "boolean"}}, "required": ["go"]}
ASK = t.ElicitRequest(params=t.ElicitRequestFormParams(message=QUESTION, requested_schema=GO_SCHEMA)).model_dump(
    mode="json", by_alias=True, exclude_none=True
)
"""The one question, as wire JSON (built once: the record holds it as sent)."""
TOOLS = [
    t.Tool(name=name, input_schema={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]})
    for name in ("one_step", "one_answer")
]


def _now() -> str:
    return datetime.fromtimestamp(time.time(), UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def work(item: str) -> str:
    return f"done {item}"


class Floor:
    """The whole server: a Redis client, the records' key prefix, and the questions waiting in this process."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.waiting: dict[str, tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = {}
        """Parked tasks of this process: their record, and the future their tool awaits the answer on."""
        self.running: set[asyncio.Task[None]] = set()
        self.settling: dict[str, asyncio.Event] = {}
        """Tasks `working` in this process: set (and dropped) when one parks or ends (the long poll)."""

    def key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    async def write(self, record: dict[str, Any]) -> None:
        record["lastUpdatedAt"] = _now()
        await self.redis.set(self.key(record["taskId"]), json.dumps(record, separators=(",", ":")), px=TTL_MS)
        if record["status"] != "working" and (settled := self.settling.pop(record["taskId"], None)) is not None:
            settled.set()

    # -- handlers ------------------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: t.PaginatedRequestParams | None
    ) -> t.ListToolsResult:
        return t.ListToolsResult(tools=TOOLS)

    async def call_tool(self, ctx: ServerRequestContext[Any], params: t.CallToolRequestParams) -> dict[str, Any]:
        if params.name not in ("one_step", "one_answer"):
            raise MCPError(code=t.INVALID_PARAMS, message=f"unknown tool {params.name!r}")
        now = _now()
        record = {"taskId": secrets.token_urlsafe(18), "status": "working", "createdAt": now, "lastUpdatedAt": now,
                  "ttlMs": TTL_MS, "pollIntervalMs": POLL_MS}  # fmt: skip
        await self.write(record)
        self.settling[record["taskId"]] = asyncio.Event()
        created = {"resultType": "task", **record}
        run = asyncio.create_task(self.run(record, params.name, str((params.arguments or {}).get("item", ""))))
        self.running.add(run)
        run.add_done_callback(self.running.discard)
        return created

    async def get(self, ctx: ServerRequestContext[Any], params: TaskRequestParams) -> dict[str, Any]:
        if (settled := self.settling.get(params.task_id)) is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), POLL_MS / 1000)
        raw = await self.redis.get(self.key(params.task_id))
        if raw is None:
            raise MCPError(code=t.INVALID_PARAMS, message=f"unknown task {params.task_id!r}")
        record: dict[str, Any] = json.loads(raw)
        return record

    async def update(self, ctx: ServerRequestContext[Any], params: UpdateTaskParams) -> dict[str, Any]:
        parked = self.waiting.pop(params.task_id, None)
        if parked is None:
            return {}  # nothing asked (or already answered): ignored, as the extension says
        record, waiter = parked
        record = {k: v for k, v in record.items() if k != "inputRequests"}
        record.update(status="working", answers=params.input_responses)
        await self.write(record)
        self.settling[params.task_id] = asyncio.Event()
        waiter.set_result(params.input_responses)
        return {}

    # -- the work, in this process ----------------------------------------------------------------

    async def run(self, record: dict[str, Any], tool: str, item: str) -> None:
        try:
            value = await work(item)
            checkpoint = f"{self.key(record['taskId'])}:step:work"
            await self.redis.set(checkpoint, json.dumps(value), px=TTL_MS)
            text = value
            if tool == "one_answer":
                answer = await self.ask(record)
                text = f"go={answer.get('action') == 'accept' and (answer.get('content') or {}).get('go') is True}"
            final = {k: v for k, v in record.items() if k not in ("inputRequests", "answers")}
            final.update(status="completed", result={"content": [{"type": "text", "text": text}], "isError": False})
            await self.write(final)
        except Exception as exc:  # the floor still ends every task
            failed = {**record, "status": "failed", "error": {"code": t.INTERNAL_ERROR, "message": str(exc)}}
            await self.write(failed)

    async def ask(self, record: dict[str, Any]) -> dict[str, Any]:
        """Park the record `input_required` with the one question; the answer `tasks/update` writes."""
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        parked = {**record, "status": "input_required", "inputRequests": {"go": ASK}}
        await self.write(parked)
        self.waiting[record["taskId"]] = (parked, waiter)
        answers = await waiter
        answer: dict[str, Any] = answers.get("go") or {}
        return answer


def build_floor_app(redis_url: str, prefix: str) -> tuple[Any, Floor]:
    """The floor's ASGI app, and its `Floor` (the counting script reads what it holds)."""
    floor = Floor(aioredis.Redis.from_url(redis_url), prefix)
    server: Server[Any] = Server("floor", on_list_tools=floor.list_tools, on_call_tool=floor.call_tool)  # type: ignore[arg-type]
    server.add_request_handler("tasks/get", TaskRequestParams, floor.get)
    server.add_request_handler("tasks/update", UpdateTaskParams, floor.update)
    server.extensions[TASKS_EXTENSION] = {}
    return server.streamable_http_app(), floor


def serve_floor(redis_url: str, prefix: str) -> None:
    from benchmarks.fastmcp_tasks_drive import serve_app

    serve_app(build_floor_app(redis_url, prefix)[0])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    serve_floor(sys.argv[1], sys.argv[2])
