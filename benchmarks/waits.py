"""Durable waits at scale: what parked tasks cost, and how close to their due time they wake.

For each store (a SQLite file, Redis, PostgreSQL) the script starts two uvicorn server
processes sharing that store (this file with `--serve`; both serve the same flows with
the default `task_scan_interval` of 1 s) and measures:

  (1) idle cost: the CPU time of both server processes over a quiet window (`--idle`
      seconds), first with no task in the store (the baseline), then with `--parked`
      tasks (default 10,000) parked in it: half on `ctx.sleep` (due in an hour), half on
      `ctx.wait_for_event` with no timeout. Reported as ms of CPU per second per process.
  (2) timer wake-up: `--wake` tasks (default 10,000) whose sleeps fall due spread evenly
      over `--window` seconds, beside the parked ones; each flow's first step after the
      sleep records `time.time()`, and lateness = that - the due time. p50 / p99 / max.
  (3) event -> resumed: `--events` tasks parked on `ctx.wait_for_event("go")`; one at a
      time, the benchmark calls a tool on one of the two instances (alternating) that calls
      `flows.send_event`; lateness = (the flow's next step's `time.time()`) - (the time the
      tool called `send_event`). p50 / p99.

The parked and sleeping tasks of (1) and (2) are written straight into the store, exactly as a
run that parked leaves them (status `working`, no lease holder, `lease_until` = the wake
time, the wait journaled under `@sleep` / `@event.go`): creating 20,000 tasks over MCP would
take minutes and measure task creation, not waiting. Their wake-ups and (3) run the real
scanner, claim, replay and steps. Clocks are the same host's.

Usage: python benchmarks/waits.py [--stores sqlite,redis,postgres] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchkit import ServerProc, loopback_socket
from benchkit import server_processes as spawn
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from tasks import DEFAULT_URLS, STORES, StoreRun, Unreachable, _drop, make_store, prepare_store

import mrtr
from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr.stores import RecordSeal, SealedStore, TaskRecord, TaskStore
from mrtr.stores._base import WAIT_FOREVER

KEY_ENV = "MRTR_BENCH_STATE_KEY"
SLEEP_TOOL = "sleeper"
WAIT_TOOL = "waiter"
SEND_TOOL = "send"
CLK_TCK = os.sysconf("SC_CLK_TCK")
FILL_BATCH = 16  # concurrent writes: within the stores' connection pools


# -- the server (child process) ----------------------------------------------------------------


def build_app(kind: str, target: str, namespace: str) -> Any:
    security = RequestStateSecurity(keys=[bytes.fromhex(os.environ[KEY_ENV])])
    server: MCPServer[Any] = MCPServer("waits-bench", request_state_security=security, log_level="WARNING")
    flows = mrtr.Flows(server, store=make_store(kind, target, namespace), task_ttl=None)

    @flows.tool(name=SLEEP_TOOL, task="required")
    async def sleeper(delay: float, ctx: mrtr.FlowContext) -> float:
        """Sleep, then say when it woke."""
        await ctx.sleep(delay)
        woke: float = await ctx.step("woke", time.time)
        return woke

    @flows.tool(name=WAIT_TOOL, task="required")
    async def waiter(ctx: mrtr.FlowContext) -> float:
        """Wait for event `go`, then say how long after its sending the flow went on."""
        payload = await ctx.wait_for_event("go")
        resumed: float = await ctx.step("resumed", time.time)
        return resumed - float(payload["sent"])

    @server.tool(name=SEND_TOOL)
    async def send(task_id: str) -> bool:
        """Deliver event `go` to a task, stamped with the moment of sending."""
        return await flows.send_event(task_id, "go", {"sent": time.time()})

    return flows.streamable_http_app(stateless_http=True)


def serve(kind: str, target: str, namespace: str) -> None:
    import uvicorn

    async def run() -> None:
        sock = loopback_socket()
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(build_app(kind, target, namespace), log_level="warning", lifespan="on")
        await uvicorn.Server(config).serve(sockets=[sock])

    asyncio.run(run())


# -- parked tasks, as a run that parked leaves them --------------------------------------------


def parked(flow: str, arguments: dict[str, Any], key: str, due: float | None, now: float) -> TaskRecord:
    journal = Journal.start()
    journal.steps[key] = ("", {"due": due})
    wait = {"kind": "timer", "name": None, "until": due} if key == "@sleep" else {"kind": "event", "name": "go"}
    if key != "@sleep":
        wait["until"] = None
    return TaskRecord(
        task_id=secrets.token_urlsafe(18),
        flow=flow,
        arguments=arguments,
        capabilities={},
        status="working",
        created_at=now,
        updated_at=now,
        ttl_ms=None,
        poll_interval_ms=500,
        journal=journal_codec.encode(journal),
        status_message="parked by benchmarks/waits.py",
        lease_until=WAIT_FOREVER if due is None else due,
        waiting=[wait],
    )


async def fill(store: TaskStore, records: Sequence[TaskRecord]) -> None:
    for i in range(0, len(records), FILL_BATCH):
        await asyncio.gather(*(store.create(r) for r in records[i : i + FILL_BATCH]))


async def results(store: TaskStore, records: Sequence[TaskRecord]) -> dict[str, float]:
    """Each completed task's returned number, by task id."""
    found: dict[str, float] = {}
    for i in range(0, len(records), FILL_BATCH):
        batch = records[i : i + FILL_BATCH]
        loaded = await asyncio.gather(*(store.load(r.task_id, time.time()) for r in batch))
        for record in loaded:
            if record is not None and record.status == "completed" and record.result is not None:
                found[record.task_id] = float(record.result["content"][0]["text"])
    return found


# -- measuring ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def idle_cpu(servers: Sequence[ServerProc], seconds: float) -> float:
    """Milliseconds of CPU per second, per server process, over `seconds` of quiet."""
    before = [cpu_seconds(s.pid) for s in servers]
    await asyncio.sleep(seconds)
    spent = [cpu_seconds(s.pid) - b for s, b in zip(servers, before, strict=True)]
    return statistics.mean(spent) / seconds * 1000


def quantiles(values: Sequence[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "no samples"
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50 * 1000:.1f} ms · p99 {p99 * 1000:.1f} ms · max {ordered[-1] * 1000:.1f} ms (n={len(ordered)})"


async def bench_store(kind: str, options: argparse.Namespace, workdir: Path) -> None:
    try:
        run: StoreRun = await prepare_store(kind, workdir, DEFAULT_URLS)
    except Unreachable as exc:
        if os.environ.get("CI"):
            raise
        print(f"\n== {kind}: skipped: {exc}")
        return
    print(f"\n== {run.describe}")
    env = dict(os.environ) | {KEY_ENV: secrets.token_hex(32)}
    store = run.open()
    # The servers seal what they write (sealed at rest, the default): results are read with their key.
    opened = SealedStore(store, RecordSeal.from_keys([bytes.fromhex(env[KEY_ENV])]))
    try:
        async with spawn(Path(__file__), [run.kind, run.target, run.namespace], 2, env=env, logdir=workdir) as servers:
            await asyncio.sleep(1.5)  # both scanners up and settled
            empty = idle_cpu(servers, options.idle)
            baseline = await empty
            now = time.time()
            half = options.parked // 2
            sleeping = [parked(SLEEP_TOOL, {"delay": 3600}, "@sleep", now + 3600, now) for _ in range(half)]
            waiting = [parked(WAIT_TOOL, {}, "@event.go", None, now) for _ in range(options.parked - half)]
            began = time.perf_counter()
            await fill(store, sleeping + waiting)
            print(f"   filled {options.parked:,} parked tasks in {time.perf_counter() - began:.1f} s")
            await asyncio.sleep(1.5)
            loaded = await idle_cpu(servers, options.idle)
            print(
                f"(1) idle CPU per server process over {options.idle:g} s: {baseline:.2f} ms/s with an empty store, "
                f"{loaded:.2f} ms/s with {options.parked:,} tasks parked (sleeping or waiting)"
            )

            start = time.time() + 5.0
            step = options.window / max(1, options.wake)
            wakers = [parked(SLEEP_TOOL, {"delay": 1.0}, "@sleep", start + i * step, now) for i in range(options.wake)]
            await fill(store, wakers)
            due = {r.task_id: r.lease_until for r in wakers}
            deadline = start + options.window + 30
            woke: dict[str, float] = {}
            while time.time() < deadline and len(woke) < len(wakers):
                await asyncio.sleep(1.0)
                if time.time() > start + options.window:
                    woke = await results(opened, wakers)
            late = [woke[task_id] - due[task_id] for task_id in woke]
            print(
                f"(2) {options.wake:,} timers due over {options.window:g} s, beside the parked ones, two instances: "
                f"woke {len(woke):,}; lateness {quantiles(late)}"
            )

            if options.events:
                waiters = [parked(WAIT_TOOL, {}, "@event.go", None, time.time()) for _ in range(options.events)]
                await fill(store, waiters)
                clients = [Client(s.url) for s in servers]
                async with clients[0], clients[1]:
                    for i, record in enumerate(waiters):
                        await clients[i % 2].call_tool(SEND_TOOL, {"task_id": record.task_id})
                        await asyncio.sleep(0.02)
                resumed: dict[str, float] = {}
                for _ in range(30):
                    resumed = await results(opened, waiters)
                    if len(resumed) == len(waiters):
                        break
                    await asyncio.sleep(0.5)
                print(f"(3) event -> resumed, sent through either instance: {quantiles(list(resumed.values()))}")
    finally:
        await store.close()
        print(f"   cleanup: {await _drop(run)}")


async def main(options: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="mrtr-waits-bench-"))
    try:
        print(f"mrtr durable waits benchmark · Python {sys.version.split()[0]} · {os.cpu_count()} cores")
        for kind in options.stores.split(","):
            await bench_store(kind, options, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", nargs=3, metavar=("KIND", "TARGET", "NAMESPACE"), help=argparse.SUPPRESS)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--wake", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few tasks, short windows")
    options = parser.parse_args()
    if options.serve:
        serve(*options.serve)
    else:
        if options.quick:
            options.parked, options.wake, options.window, options.events, options.idle = 200, 100, 3.0, 10, 2.0
        asyncio.run(main(options))
