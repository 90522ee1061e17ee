"""Task throughput of `RedisStore` on one Redis node and on a 3-primary Redis Cluster, same run.

Both targets are private and started here, on this machine, with the same settings (no
persistence): a `redis-server` on a free port, and a cluster of three primaries
(`redis-server --cluster-enabled yes`, `redis-cli --cluster create`). Never the shared Redis.

Each target runs the same two phases through the store's own API (the calls the task runtime
makes, without the MCP and HTTP layers on top, so the store's share is what is measured):

  (1) create: C coroutines create N `working` tasks (one `create` script each).
  (2) run to completion: C coroutines run the N tasks the way the instance that created a task
      runs it: `load`, a lease `save` (the claim), a checkpoint `save` (a step's result in the
      journal) and a completing `save` (out of the claimable index).
  (3) scan: one `claimable(now, 16)` at a time while all N tasks are due: what an instance's
      scanner pays per cycle to find orphaned or woken work (one script per shard on the
      cluster, concurrently; one script on one node).

It prints tasks/s per phase and the CPU seconds the Redis server processes and this (client)
process used in each, then, for the cluster, where the work went: per primary the shards it
serves, the task records it holds and the scripts it ran. A fleet serialized on one slot
would show one primary doing all of it.

    python benchmarks/redis_cluster.py            # N=3000, C=32, 3 interleaved rounds, medians
    python benchmarks/redis_cluster.py --quick    # N=300, one round
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.support.redis_cluster import LocalCluster, cli  # noqa: E402
from tests.support.redis_proc import RedisProcess  # noqa: E402

from mrtr.stores import TaskRecord  # noqa: E402
from mrtr.stores._redis import RedisStore  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record(task_id: str, now: float) -> TaskRecord:
    return TaskRecord(
        task_id=task_id,
        flow="bench",
        arguments={"n": task_id},
        capabilities={},
        status="working",
        created_at=now,
        updated_at=now,
        ttl_ms=3_600_000,
        poll_interval_ms=500,
        journal="",
    )


async def create_phase(store: RedisStore, ids: list[str], clients: int) -> float:
    queue = list(ids)

    async def creator() -> None:
        while queue:
            task_id = queue.pop()
            await store.create(record(task_id, time.time()))

    began = time.perf_counter()
    await asyncio.gather(*(creator() for _ in range(clients)))
    return time.perf_counter() - began


async def scan_phase(store: RedisStore, scans: int) -> list[float]:
    """Seconds per `claimable(now, 16)` call, one at a time, while every task is due."""
    took = []
    for _ in range(scans):
        began = time.perf_counter()
        found = await store.claimable(time.time(), 16)
        took.append(time.perf_counter() - began)
        assert len(found) == 16
    return took


async def complete_phase(store: RedisStore, ids: list[str], clients: int) -> tuple[float, int, int]:
    """(seconds, completed, lost compare-and-sets): each task run the way its creating instance runs
    it (no scan needed), by C coroutines."""
    queue = list(ids)
    done = 0
    conflicts = 0

    async def worker(me: str) -> None:
        nonlocal done, conflicts
        while queue:
            task_id = queue.pop()
            now = time.time()
            found = await store.load(task_id, now)
            assert found is not None
            found.lease_owner, found.lease_until = me, now + 30
            if not await store.save(found):
                conflicts += 1
                continue
            found.journal = "step-1-done"
            found.updated_at = time.time()
            if not await store.save(found):
                conflicts += 1
                continue
            found.status, found.result = "completed", {"content": [{"type": "text", "text": "ok"}]}
            found.lease_owner, found.lease_until = None, 0.0
            if await store.save(found):
                done += 1
            else:
                conflicts += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker(f"w{n}") for n in range(clients)))
    return time.perf_counter() - began, done, conflicts


async def measure(label: str, url: str, pids: list[int], n: int, clients: int) -> dict[str, Any]:
    store = RedisStore(url, prefix=f"bench{random.randrange(10**6)}:")
    ids = [f"task-{i:06d}-{random.randrange(16**6):06x}" for i in range(n)]
    cpu0 = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()))
    created = await create_phase(store, ids, clients)
    scans = await scan_phase(store, 50 if n < 1000 else 200)
    cpu1 = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()))
    completed, finished, conflicts = await complete_phase(store, ids, clients)
    cpu2 = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()))
    counts = await store.count_by_status(time.time())
    assert counts["completed"] == n and counts["working"] == 0, counts
    await store.close()
    return {
        "label": label,
        "create_rate": n / created,
        "complete_rate": finished / completed,
        "conflicts": conflicts,
        "scan_ms": statistics.median(scans) * 1000,
        "create_cpu": (sum(cpu1[0]) - sum(cpu0[0]), cpu1[1] - cpu0[1]),
        "complete_cpu": (sum(cpu2[0]) - sum(cpu1[0]), cpu2[1] - cpu1[1]),
        "store": store,
    }


def commandstats_calls(port: int) -> int:
    """Scripts (`EVALSHA`/`EVAL`) the node on `port` has run since it started."""
    total = 0
    for line in cli(port, "info", "commandstats").splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def distribution(cluster: LocalCluster, store: RedisStore) -> list[str]:
    rows = []
    hot = {port: 0 for port in cluster.primary_ports()}
    for key in store.hot_keys():
        hot[cluster.primary_of(key)] += 1
    total_scripts = sum(commandstats_calls(port) for port in hot)
    for port, shards in sorted(hot.items()):
        keys = int(cli(port, "dbsize").strip())
        scripts = commandstats_calls(port)
        rows.append(
            f"  primary :{port}  {shards:>2} of {len(store.hot_keys())} shards  {keys:>6} keys  "
            f"{scripts:>7} scripts run ({scripts / max(total_scripts, 1):.0%})"
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N=300: a smoke run")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per target (medians)")
    args = parser.parse_args()
    n = 300 if args.quick else args.tasks
    missing = LocalCluster.available()
    if missing:
        print(f"SKIPPED: {missing}")
        sys.exit(1 if os.environ.get("CI") else 0)
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min); N={n} tasks, C={args.clients} coroutines, 1 client process")
    rounds = 1 if args.quick else args.rounds
    runs: dict[str, list[dict[str, Any]]] = {"one node": [], "3-primary cluster": []}
    with tempfile.TemporaryDirectory(prefix="mrtr-bench-cluster-") as tmp:
        node_dir = Path(tmp) / "single"
        node_dir.mkdir()
        with RedisProcess(node_dir) as single, LocalCluster(Path(tmp) / "cluster", primaries=3) as cluster:
            assert single.process is not None
            targets = [
                ("one node", single.url, [single.process.pid]),
                ("3-primary cluster", cluster.url, [process.pid for process in cluster.processes.values()]),
            ]
            for round_ in range(rounds):  # interleaved, the order alternating: drift hits both alike
                for label, url, pids in targets if round_ % 2 == 0 else targets[::-1]:
                    runs[label].append(await measure(label, url, pids, n, args.clients))
            spread = distribution(cluster, runs["3-primary cluster"][-1]["store"])

    def med(label: str, key: str, part: int | None = None) -> float:
        values = [r[key] if part is None else r[key][part] for r in runs[label]]
        return statistics.median(values)

    base_create, base_complete = med("one node", "create_rate"), med("one node", "complete_rate")
    print()
    print(f"medians of {rounds} interleaved round(s) per target (range of (2) in brackets):")
    print(
        "| target | (1) create, tasks/s | (2) run to completion, tasks/s | ratio to one node (1) / (2) "
        "| (3) one scan (claimable), p50 | Redis CPU s (1) / (2) | client CPU s (1) / (2) | lost CAS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, found in runs.items():
        spread_2 = f"{min(r['complete_rate'] for r in found):.0f}-{max(r['complete_rate'] for r in found):.0f}"
        print(
            f"| {label} | {med(label, 'create_rate'):.0f} | {med(label, 'complete_rate'):.0f} ({spread_2}) | "
            f"{med(label, 'create_rate') / base_create:.2f} / {med(label, 'complete_rate') / base_complete:.2f} | "
            f"{med(label, 'scan_ms'):.2f} ms | "
            f"{med(label, 'create_cpu', 0):.2f} / {med(label, 'complete_cpu', 0):.2f} | "
            f"{med(label, 'create_cpu', 1):.2f} / {med(label, 'complete_cpu', 1):.2f} | "
            f"{sum(r['conflicts'] for r in found)} |"
        )
    print()
    print("where the cluster's work went (each task's keys on its shard's slot; 16 shards spread over the slot range):")
    for row in spread:
        print(row)
    print("targets measured: create and complete on one node and on the cluster")


if __name__ == "__main__":
    asyncio.run(main())
