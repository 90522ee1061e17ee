"""`ctx.report_progress` inside a durable task: the task's `statusMessage`, on both hosts and every store.

A task that reports "chunk 2 of 3" shows it in `tasks/get` while it works: the same flow on
`mrtr.Flows` (the SDK's `MCPServer`, `ctx: mrtr.FlowContext`) and `mrtr.fastmcp.Flows`
(`ctx: fastmcp.Context`, FastMCP's own `report_progress`), over real HTTP, with the task in
SQLite, Redis or PostgreSQL. Each chunk is a step the test holds open, so every state is read
while the task is really `working`, not after the fact.

Also here, on one store: a replay does not report again (the status the task settles with,
then the runs after an answer, write no message the flow reported before its journal's
frontier), and a flow reporting a thousand times a second costs a bounded number of writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Context, FastMCP
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
import mrtr.fastmcp
from mrtr.client import CreatedTask, TaskSnapshot, tasks_client, update_task
from mrtr.stores import TaskRecord, TaskStore
from mrtr.stores._sqlite import SQLiteStore
from mrtr.tasks._seam import TASK_LEASE
from tests.support.flowkit import SHARED_KEY, new_server, served, task_state
from tests.support.markers import backends
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.in_process]  # unless a store's parameter says otherwise


class Go(BaseModel):
    go: bool


@dataclass
class Gates:
    """The test's hold on each chunk: the flow's step for chunk n waits until `release(n)`."""

    opened: dict[int, asyncio.Event] = field(default_factory=dict)

    def gate(self, n: int) -> asyncio.Event:
        return self.opened.setdefault(n, asyncio.Event())

    async def wait(self, n: int) -> int:
        await self.gate(n).wait()
        return n

    def release(self, n: int) -> None:
        self.gate(n).set()


async def _unused(*args: Any) -> Any:
    raise AssertionError("task questions are answered with tasks/update here")


def _store(kind: str, tmp_path: Path, token: str) -> TaskStore:
    if kind == "sqlite":
        return SQLiteStore(str(tmp_path / "tasks.db"))
    if kind == "redis":
        from mrtr.stores._redis import RedisStore

        return RedisStore(REDIS_URL, prefix=f"mrtr-progress-{token}:")
    from mrtr.stores._postgres import PostgresStore

    return PostgresStore(POSTGRES_DSN, table=f"mrtr_progress_{token}")


async def _require(kind: str) -> None:
    if kind == "sqlite":
        return
    why = await service_problem(kind)
    if why is None:
        return
    message = f"the local {kind} is unreachable ({why})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so the {kind} store must be tested", pytrace=False)
    pytest.skip(message)


def _chunked_server(host: str, store: TaskStore, gates: Gates) -> Any:
    """One flow, three chunks, each announced with `ctx.report_progress` before its (held) step."""
    if host == "mcpserver":
        server = new_server("progress")
        flows = mrtr.Flows(server, store=store, task_poll_interval=0.05)

        @flows.tool(task="required")
        async def chunks(ctx: mrtr.FlowContext) -> str:
            for n in (1, 2, 3):
                await ctx.report_progress(n, 3, f"chunk {n} of 3")
                await ctx.step(f"chunk-{n}", gates.wait, n)
            return "3 chunks"

        return server
    mcp: FastMCP[Any] = FastMCP("progress", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    fm_flows = mrtr.fastmcp.Flows(mcp, store=store, task_poll_interval=0.05)

    @fm_flows.tool(task="required")
    async def chunks(ctx: Context) -> str:
        for n in (1, 2, 3):
            await ctx.report_progress(n, 3, f"chunk {n} of 3")  # FastMCP's own call
            await mrtr.step(f"chunk-{n}", gates.wait, n)
        return "3 chunks"

    return mcp


async def _status_becomes(session: Any, task_id: str, message: str, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task.get("statusMessage") == message:
                return task
            assert task["status"] == "working", task
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("kind", backends("sqlite", "redis", "postgres"))
@pytest.mark.parametrize("host", ["mcpserver", "fastmcp"])
async def test_a_task_shows_its_latest_progress_in_tasks_get_while_it_works(
    host: str, kind: str, tmp_path: Path
) -> None:
    await _require(kind)
    token = uuid.uuid4().hex[:12]
    store = _store(kind, tmp_path, token)
    gates = Gates()
    try:
        async with (
            served(_chunked_server(host, store, gates)) as url,
            httpx2.AsyncClient(trust_env=False, timeout=20.0) as http,
            tasks_client(streamable_http_client(url, http_client=http), elicitation_callback=_unused) as client,
        ):
            created = await client.session.call_tool("chunks", {}, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            for n in (1, 2, 3):
                task = await _status_becomes(client.session, created.task_id, f"chunk {n} of 3")
                assert task["status"] == "working"
                gates.release(n)
            async with asyncio.timeout(10):
                while (task := await task_state(client.session, created.task_id))["status"] == "working":
                    await asyncio.sleep(0.02)
            assert task["status"] == "completed", task
            assert task["result"]["content"][0]["text"] == "3 chunks"
            assert "statusMessage" not in task or task["statusMessage"] != "chunk 3 of 3"
    finally:
        if kind != "sqlite":
            await drop_namespace(kind, f"mrtr-progress-{token}" if kind == "redis" else f"mrtr_progress_{token}")


# -- one store: what is written, and how often -------------------------------------------------------------


class CountingStore(SQLiteStore):
    """SQLite, noting every record it saved: the status messages the runs wrote, in order."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.saved: list[TaskRecord] = []

    async def save(self, record: TaskRecord) -> bool:
        stored = await super().save(record)
        if stored:
            self.saved.append(record)
        return stored

    def messages(self) -> list[str | None]:
        """Each status message as it changed from one saved record to the next."""
        changes: list[str | None] = []
        for record in self.saved:
            if not changes or changes[-1] != record.status_message:
                changes.append(record.status_message)
        return changes


@pytest.fixture
def counting(tmp_path: Path) -> Iterator[CountingStore]:
    yield CountingStore(str(tmp_path / "tasks.db"))


@dataclass
class Ran:
    reports: int = 0
    seconds: float = 0.0


@contextlib.asynccontextmanager
async def _served_task(server: Any, tool: str) -> AsyncIterator[tuple[Any, str]]:
    async with (
        served(server) as url,
        httpx2.AsyncClient(trust_env=False, timeout=20.0) as http,
        tasks_client(streamable_http_client(url, http_client=http), elicitation_callback=_unused) as client,
    ):
        created = await client.session.call_tool(tool, {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        yield client.session, created.task_id


async def _until(session: Any, task_id: str, status: str) -> dict[str, Any]:
    async with asyncio.timeout(15):
        while (task := await task_state(session, task_id))["status"] != status:
            assert task["status"] in ("working", "input_required"), task
            await asyncio.sleep(0.02)
    return task


async def test_a_replay_does_not_report_again(counting: CountingStore) -> None:
    server = new_server("progress-replay")
    flows = mrtr.Flows(server, store=counting, task_poll_interval=0.05)
    gates = Gates()

    @flows.tool(task="required")
    async def two_halves(ctx: mrtr.FlowContext) -> str:
        await ctx.report_progress(1, 2, "first half")
        await asyncio.sleep(0.1)  # time enough to write it, were it reported again on a replay
        await ctx.step("first", gates.wait, 1)
        ok = await ctx.elicit("Go on?", Go)
        await ctx.report_progress(2, 2, "second half")
        await ctx.step("second", gates.wait, 2)
        return f"went on: {ok.go}"

    async with _served_task(server, "two_halves") as (session, task_id):
        await _status_becomes(session, task_id, "first half")
        gates.release(1)
        asked = await _until(session, task_id, "input_required")
        ((key, _),) = asked["inputRequests"].items()
        await update_task(session, task_id, {key: {"action": "accept", "content": {"go": True}}})
        await _status_becomes(session, task_id, "second half")
        gates.release(2)
        done = await _until(session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "went on: True"
    # "first half" was written by the first run only: the run after the answer replayed past it silently.
    # (The task was created with no message; it had none while it asked.)
    assert counting.messages() == ["first half", None, "second half", None], counting.messages()


async def test_a_thousand_reports_a_second_cost_a_bounded_number_of_writes(counting: CountingStore) -> None:
    from mrtr._engine.progress import STATUS_INTERVAL

    server = new_server("progress-burst")
    flows = mrtr.Flows(server, store=counting, task_poll_interval=0.05)
    ran = Ran()

    @flows.tool(task="required")
    async def busy(ctx: mrtr.FlowContext) -> str:
        started = await ctx.step("start", time.monotonic)
        for n in range(1, 1001):
            await ctx.report_progress(n, 1000, f"item {n} of 1000")
            await asyncio.sleep(0.0005)  # a thousand a second or more, as fast as the loop goes
        ran.reports, ran.seconds = 1000, time.monotonic() - started
        return "done"

    async with _served_task(server, "busy") as (session, task_id):
        await _until(session, task_id, "completed")
    written = [m for m in counting.messages() if m is not None and m.startswith("item ")]
    # The first report is written at once, then the latest at most once per interval.
    bound = 2 + ran.seconds / STATUS_INTERVAL
    assert ran.reports == 1000 and 1 <= len(written) <= bound, (len(written), ran.seconds)
    assert written[0] == "item 1 of 1000"
    status_writes = sum(1 for r in counting.saved if r.status_message and r.status_message.startswith("item "))
    # Beside the status writes only the heartbeat (every lease/3 s) re-saves the same message.
    assert status_writes <= bound + ran.seconds / (TASK_LEASE / 3) + 2, status_writes


async def test_listeners_hear_each_status_message_as_a_task_notification(tmp_path: Path) -> None:
    """mrtr's client follows the task on `subscriptions/listen`: each "chunk n of 3" reaches it pushed, not polled.

    One host: both publish through the same engine hook (`on_change`), which the test above reads on both."""
    host = "mcpserver"
    gates = Gates()
    heard: list[str | None] = []
    polled: list[str] = []

    def on_status(snapshot: TaskSnapshot) -> None:
        heard.append(snapshot.status_message)
        for n in (1, 2, 3):
            if snapshot.status_message == f"chunk {n} of 3":
                gates.release(n)

    async def note(request: httpx2.Request) -> None:
        if request.method == "POST" and b'"tasks/get"' in request.content:
            polled.append("tasks/get")

    server = _chunked_server(host, SQLiteStore(str(tmp_path / "tasks.db")), gates)
    async with served(server) as url, httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        http.event_hooks["request"].append(note)
        transport = streamable_http_client(url, http_client=http)
        async with tasks_client(transport, elicitation_callback=_unused, on_status=on_status) as client:
            result = await asyncio.wait_for(client.call_tool("chunks", {}), 20)
    assert result.content[0].text == "3 chunks"
    assert [m for m in heard if m and m.startswith("chunk")] == ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]
    assert not polled, "every state was pushed on the listen stream"


async def test_mrtr_tasks_show_and_the_console_say_chunk_2_of_3_while_it_works(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mrtr.cli._app import app as cli_app
    from mrtr.console import app as console_app
    from mrtr.stores import RecordSeal
    from tests.fleet.test_console import serving

    path = tmp_path / "tasks.db"
    gates = Gates()
    gates.release(1)
    server = _chunked_server("mcpserver", SQLiteStore(str(path)), gates)

    def show(task_id: str) -> str:
        argv = ["tasks", "show", task_id, "--store", f"sqlite:///{path}"]
        done = CliRunner().invoke(cli_app, argv, env={"MRTR_STATE_KEY": SHARED_KEY.hex(), "COLUMNS": "200"})
        assert done.exit_code == 0, done.output
        return done.output

    async with _served_task(server, "chunks") as (session, task_id):
        await _status_becomes(session, task_id, "chunk 2 of 3")
        assert "message: chunk 2 of 3" in await asyncio.to_thread(show, task_id)
        console = console_app(SQLiteStore(str(path)), seal=RecordSeal.from_keys([SHARED_KEY]))
        async with serving(console) as url, httpx2.AsyncClient(trust_env=False) as http:
            listed = (await http.get(f"{url}/")).text
            page = (await http.get(f"{url}/tasks/{task_id}")).text
        assert "chunk 2 of 3" in page and "chunk 2 of 3" in listed
        gates.release(2)
        gates.release(3)
        await _until(session, task_id, "completed")
