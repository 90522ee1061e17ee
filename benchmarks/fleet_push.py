"""Task push across a fleet under load (issue 40): what a fleet bus costs per event, and how fast
a state change committed on one instance reaches a listener on another, at a steady rate.

  (1) publishing cost: two buses in this process on one broker (Redis pub/sub or PostgreSQL
      NOTIFY); a burst of N task events published on A until B has all of them. Shown: the
      publisher's CPU per event (this process, both buses, minus B's share is not separable:
      the figure is the whole process per event, sending and receiving), events per round trip
      and wall time, with batching (the default, `max_batch=256`) and with one event per round
      trip (`max_batch=1`, how the bus sent before issue 40).
  (2) cross-instance latency: three task-server processes (A, B, C) sharing the broker as store
      and bus, on their default bus options. Listeners on A (`mrtr/taskKeys` streams, opened
      ahead) follow `pipeline` tasks created and answered on B and C, at a steady rate of task
      state changes (4 per task). Latency is what A's bus measures for each event it receives:
      from `publish` on B or C (right after the commit) to delivery to A's listeners, by the
      host's one clock (`BrokerBus.drain_lags`, also the `mrtr.bus.lag` metric). Shown: p50, p99,
      the rate reached, and events dropped on B and C (expected 0) and gaps on A.

    python benchmarks/fleet_push.py [--quick] [--brokers redis,postgres] [--seconds 10] [--rates 10,100,500]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402
from tests.support import pushload  # noqa: E402
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, drop_namespace, service_problem  # noqa: E402

import mrtr  # noqa: E402
from mrtr.buses import TaskChanged  # noqa: E402

URLS = {"redis": REDIS_URL, "postgres": POSTGRES_DSN}


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def publish_cost(kind: str, n: int, max_batch: int) -> dict[str, float]:
    """(1): publish `n` task events on A as fast as possible, until B heard them all."""
    namespace = f"mrtr_bench_push_{secrets.token_hex(4)}"
    options: dict[str, Any] = {"max_batch": max_batch, "max_outbox": n, "max_outbox_age": 600, "max_publish_wait": 0}
    a = mrtr.open_bus(URLS[kind], namespace=namespace, **options)
    b = mrtr.open_bus(URLS[kind], namespace=namespace)
    heard = 0
    done = asyncio.Event()

    def count(event: Any) -> None:
        nonlocal heard
        heard += 1
        if heard >= n:
            done.set()

    b.subscribe(count)
    task = {"taskId": "t", "status": "working", "createdAt": "2026-01-01T00:00:00.000Z", "ttl": None}
    try:
        async with a, b:
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(n):
                await a.publish(TaskChanged(task_id=f"t{i}", task=task, version=i))
            async with asyncio.timeout(120):
                await done.wait()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            stats = a.stats()
    finally:
        if kind == "postgres":
            await drop_namespace("postgres", f"{namespace}_bus")
    return {
        "cpu_us": cpu / n * 1e6,
        "per_trip": stats["sent"] / max(stats["batches"], 1),
        "wall_s": wall,
        "rate": n / wall,
        "dropped": stats["dropped"],
    }


async def latency(kind: str, rates: list[int], seconds: float) -> list[dict[str, Any]]:
    """(2): one three-instance fleet, each rate in turn (a fresh batch of tasks and streams per rate)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp, pushload.push_fleet(Path(tmp), URLS[kind]) as (servers, namespace):
        try:
            a, b, c = (servers[label].url for label in "ABC")
            async with httpx2.AsyncClient(trust_env=False, timeout=30) as http:
                warm = pushload.Driver(a, [b, c], 20, rate=None)
                await warm.run(deadline=time.monotonic() + 30)
                for rate in rates:
                    await pushload.bus_lags(http, a)  # drained: this rate's lags only
                    before = {label: await pushload.bus_stats(http, servers[label].url) for label in "ABC"}
                    count = max(int(rate * seconds / pushload.CHANGES_PER_TASK), 4)
                    driver = pushload.Driver(a, [b, c], count, rate=rate / pushload.CHANGES_PER_TASK, concurrency=64)
                    outcome = await driver.run(deadline=time.monotonic() + seconds * 3 + 30)
                    after = {label: await pushload.bus_stats(http, servers[label].url) for label in "ABC"}
                    lat = sorted(await pushload.bus_lags(http, a))
                    changes = sum(after[x]["published"] - before[x]["published"] for x in "ABC")
                    rows.append(
                        {
                            "rate": rate,
                            "tasks": count,
                            "reached": changes / outcome.seconds,
                            "samples": len(lat),
                            "p50": pct(lat, 50) * 1e3,
                            "p99": pct(lat, 99) * 1e3,
                            "dropped": sum(after[x]["dropped"] - before[x]["dropped"] for x in "BC"),
                            "gaps": after["A"]["gaps"] - before["A"]["gaps"],
                            "errors": outcome.errors,
                        }
                    )
        finally:
            await drop_namespace(kind, namespace)
            if kind == "postgres":
                await drop_namespace("postgres", f"{namespace}_bus")
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (numbers not meaningful)")
    parser.add_argument("--brokers", default="redis,postgres")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of load per rate")
    parser.add_argument("--rates", default="10,100,500", help="task state changes per second")
    parser.add_argument("--burst", type=int, default=20_000, help="events in the publishing-cost burst")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    seconds, burst = args.seconds, args.burst
    if args.quick:
        rates, seconds, burst = [10, 100], 2.0, 2000
    for kind in args.brokers.split(","):
        problem = await service_problem(kind)
        if problem is not None:
            print(f"{kind}: not reachable ({problem}); skipped")
            continue
        print(f"== {kind}")
        print(f"  (1) publishing cost, a burst of {burst} task events, bus A -> listener on bus B (one process)")
        print(f"      {'':<26} {'CPU/event':>10} {'events/trip':>12} {'events/s':>10} {'dropped':>8}")
        for label, max_batch in (("batched (max_batch=256)", 256), ("one per trip (max_batch=1)", 1)):
            cost = await publish_cost(kind, burst, max_batch)
            print(
                f"      {label:<26} {cost['cpu_us']:>8.1f}µs {cost['per_trip']:>12.1f} {cost['rate']:>10.0f}"
                f" {cost['dropped']:>8}"
            )
        print(f"  (2) cross-instance latency: publish on B or C -> A's listeners ({seconds:g} s per rate)")
        head = (
            f"{'target/s':>8} {'reached/s':>10} {'samples':>8} {'p50 ms':>8} {'p99 ms':>8} {'dropped':>8} {'gaps':>5}"
        )
        print(f"      {head}")
        for row in await latency(kind, rates, seconds):
            print(
                f"      {row['rate']:>8} {row['reached']:>10.0f} {row['samples']:>8} {row['p50']:>8.1f}"
                f" {row['p99']:>8.1f} {row['dropped']:>8} {row['gaps']:>5}"
            )
            for error in row["errors"][:3]:
                print(f"      FAILED: {error}")


if __name__ == "__main__":
    asyncio.run(main())
