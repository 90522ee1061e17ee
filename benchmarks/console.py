"""The console with 100,000 tasks in the store: time to the first byte of its pages.

For each store (a SQLite file, Redis, PostgreSQL) the script fills the store with `--tasks`
task records (default 100,000; five statuses, twenty tools, created over a day), starts the
console (`mrtr.console.app`, this file with `--serve`) in its own uvicorn process, and times,
from this process over loopback HTTP, the first byte of:

  (1) the tasks page, newest first (`/`);
  (2) a filtered page: one status and one tool (`/?status=failed&tool=tool-7`);
  (3) an id search (`/?q=<prefix>`);
  (4) the live-update fragment the page polls (`/fragment`);
  (5) a task's own page (`/tasks/<id>`);
  (6)-(8) the wait and age filters (#38): waiting for input and older than 12 h; waiting for a
      timer, one tool; waiting for a callback and older than 20 h;
  (9) a bulk action's confirmation page: every `working` task of one tool waiting for a
      callback (about 1,250 at 100,000 tasks: the page lists the newest 1,000).

A quarter of the `working` tasks wait for nothing, a quarter for a timer, a quarter for an
event, a quarter for an event a callback URL delivers.

`--rounds` requests each, interleaved; reported as p50 / p90 / max. A PostgreSQL table is
`ANALYZE`d after the fill, as autovacuum would within a minute. The records are written
straight into the store (`TaskStore.create`): creating 100,000 tasks by running them would
measure task runs, not the console.

Usage: python benchmarks/console.py [--stores sqlite,redis,postgres] [--tasks N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from benchkit import loopback_socket
from benchkit import server_processes as spawn
from tasks import DEFAULT_URLS, STORES, StoreRun, Unreachable, _drop, make_store, prepare_store

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr._wire import Wait
from mrtr.stores import TaskRecord, TaskStore

STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
TOOLS = 20
FILL_CONCURRENCY = 8


def serve(kind: str, target: str, namespace: str) -> None:
    import uvicorn

    from mrtr.console import app

    async def run() -> None:
        sock = loopback_socket()
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(app(make_store(kind, target, namespace)), log_level="warning", lifespan="on")
        await uvicorn.Server(config).serve(sockets=[sock])

    asyncio.run(run())


_WAITS: tuple[list[Wait], ...] = (
    [],
    [{"kind": "timer", "name": None, "until": 253402300799.0}],
    [{"kind": "event", "name": "approved", "until": None}],
    [{"kind": "event", "name": "ci", "until": None, "via": "callback"}],
)


def record(i: int, now: float, journal: str, rng: random.Random) -> TaskRecord:
    status = STATUSES[i % len(STATUSES)]
    created = now - rng.uniform(0, 86400)
    return TaskRecord(
        task_id=secrets.token_urlsafe(18),
        flow=f"tool-{i % TOOLS}",
        arguments={"item": i},
        capabilities={},
        status=status,  # type: ignore[arg-type]
        created_at=created,
        updated_at=created + 1,
        ttl_ms=None,
        poll_interval_ms=500,
        journal=journal,
        input_requests={"confirm": {"method": "elicitation/create", "params": {"message": "Go?"}}}
        if status == "input_required"
        else {},
        waiting=_WAITS[(i // 20) % len(_WAITS)] if status == "working" else [],
        result={"content": [{"type": "text", "text": "done"}]} if status == "completed" else None,
        error={"code": -32603, "message": "boom"} if status == "failed" else None,
    )


async def fill(store: TaskStore, count: int) -> list[TaskRecord]:
    journal = Journal.start()
    journal.steps["fetch"] = ("d", {"rows": 12})
    encoded = journal_codec.encode(journal)
    rng = random.Random(7)
    now = time.time()
    records = [record(i, now, encoded, rng) for i in range(count)]
    queue = iter(records)

    async def worker() -> None:
        for item in queue:
            await store.create(item)

    await asyncio.gather(*(worker() for _ in range(FILL_CONCURRENCY)))
    return records


async def analyze(dsn: str, table: str) -> None:
    """Give the planner the table's statistics, as autovacuum does within a minute of a bulk load
    (measured right after one, a table without them gets plans no live table gets)."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))


async def first_byte(http: httpx2.AsyncClient, url: str) -> float:
    began = time.perf_counter()
    async with http.stream("GET", url) as response:
        async for _ in response.aiter_raw():
            elapsed = time.perf_counter() - began
            break
        else:
            elapsed = time.perf_counter() - began
        assert response.status_code == 200, (url, response.status_code)
    return elapsed


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return (
        f"p50 {statistics.median(ordered) * 1000:7.1f} ms · p90 {p90 * 1000:7.1f} ms · max {ordered[-1] * 1000:7.1f} ms"
    )


async def bench_store(kind: str, options: argparse.Namespace, workdir: Path) -> None:
    try:
        run: StoreRun = await prepare_store(kind, workdir, DEFAULT_URLS)
    except Unreachable as exc:
        if os.environ.get("CI"):
            raise
        print(f"\n== {kind}: skipped: {exc}")
        return
    print(f"\n== {run.describe}")
    store = run.open()
    try:
        began = time.perf_counter()
        records = await fill(store, options.tasks)
        print(f"   filled {options.tasks:,} tasks in {time.perf_counter() - began:.1f} s")
        if run.kind == "postgres":
            await analyze(run.target, run.namespace)
        some = records[options.tasks // 2]
        pages = {
            "(1) tasks page, newest first": "/",
            "(2) status + tool filter": "/?status=failed&tool=tool-7",
            "(3) id search": f"/?q={some.task_id[:6]}",
            "(4) live-update fragment": "/fragment",
            "(5) one task's page": f"/tasks/{some.task_id}",
            "(6) input wait, older 12h": "/?waiting=input&older=12h",
            "(7) timer wait, one tool": "/?waiting=timer&tool=tool-5",
            "(8) callback wait, older 20h": "/?waiting=callback&older=20h",
            "(9) bulk confirmation (1,000)": "/bulk?action=cancel&waiting=callback&tool=tool-10",
        }
        async with (
            spawn(Path(__file__), [run.kind, run.target, run.namespace], 1, logdir=workdir) as (server,),
            httpx2.AsyncClient(timeout=30) as http,
        ):
            base = server.url.removesuffix("/mcp")
            timings: dict[str, list[float]] = {label: [] for label in pages}
            for path in pages.values():  # warm up: pools, caches, the Redis index check
                await first_byte(http, base + path)
            for _ in range(options.rounds):
                for label, path in pages.items():
                    timings[label].append(await first_byte(http, base + path))
            for label, values in timings.items():
                print(f"{label:32} {summary(values)}")
    finally:
        await store.close()
        print(f"   cleanup: {await _drop(run)}")


async def main(options: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="mrtr-console-bench-"))
    try:
        print(f"mrtr console benchmark · Python {sys.version.split()[0]} · {os.cpu_count()} cores · time to first byte")
        for kind in options.stores.split(","):
            await bench_store(kind, options, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", nargs=3, metavar=("KIND", "TARGET", "NAMESPACE"), help=argparse.SUPPRESS)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 tasks, 5 rounds")
    options = parser.parse_args()
    if options.serve:
        serve(*options.serve)
    else:
        if options.quick:
            options.tasks, options.rounds = 2000, 5
        asyncio.run(main(options))
