"""mrtr on a Redis Cluster: what only a cluster shows (the store contract, the bus, the fleets and
the CLI run on the cluster in their own modules, beside Redis on one node).

- the console and `mrtr tasks` count and list the same tasks the same on a cluster as on one node;
- the console's live updates ride the cluster's sharded pub/sub;
- failover: a primary holding task keys is SIGKILLed while tasks run; its replica is promoted and
  every task completes, each step run once except one interrupted mid-run, which runs again under
  its own key; clients see retryable errors at most.

Each test uses a private local cluster (tests/support/redis_cluster.py), never the shared Redis;
the failover test starts its own, with a replica per primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn

from mrtr.stores import TaskQuery, TaskRecord, TaskStore, open_store
from tests.support.storekit import REDIS_URL, drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.needs_redis, pytest.mark.spawns]

STATUSES = ("working", "input_required", "completed", "failed", "cancelled")


def _record(i: int, now: float) -> TaskRecord:
    return TaskRecord(
        task_id=f"task-{i:03d}-{secrets.token_hex(2)}",
        flow=("deploy", "migrate", "backup")[i % 3],
        arguments={"n": i},
        capabilities={},
        status=STATUSES[i % len(STATUSES)],
        created_at=now - 1000 + i,
        updated_at=now - 1000 + i,
        ttl_ms=None,
        poll_interval_ms=500,
        journal="",
    )


async def _need_redis() -> None:
    problem = await service_problem("redis")
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"redis is required under CI: {problem}")
        pytest.skip(f"redis not reachable: {problem}")


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.get_running_loop().create_task(runner.serve(sockets=[sock]))
    try:
        while not runner.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        runner.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def test_console_and_cli_count_and_list_the_same_on_a_cluster_as_on_one_node(redis_cluster: str) -> None:
    """The same 120 tasks in a one-node store and a cluster store: the same counts, flows, pages
    (every status and flow filter, followed page by page), searches, console fragments and
    `mrtr tasks ls --json` output."""
    from mrtr.console import app as console_app

    await _need_redis()
    namespace = f"mrtr_parity_{secrets.token_hex(4)}"
    now = time.time()
    records = [_record(i, now) for i in range(120)]
    single, cluster = open_store(REDIS_URL, namespace=namespace), open_store(redis_cluster, namespace=namespace)
    try:
        for store in (single, cluster):
            for record in records:
                await store.create(record.copy())

        async def view(store: TaskStore) -> dict[str, Any]:
            pages: dict[str, Any] = {
                "counts": await store.count_by_status(now),
                "flows": await store.flows(now),
                "search": [r.task_id for r in (await store.list_tasks(TaskQuery(id_prefix="task-01"), now)).records],
            }
            for statuses in [(), ("working",), ("completed", "failed")]:
                for flow in (None, "migrate"):
                    seen, cursor = [], None
                    while True:
                        page = await store.list_tasks(TaskQuery(statuses, flow, limit=7, cursor=cursor), now)
                        seen.append([r.task_id for r in page.records])
                        if page.next_cursor is None:
                            break
                        cursor = page.next_cursor
                    pages[f"{statuses}/{flow}"] = seen
            return pages

        on_one, on_cluster = await view(single), await view(cluster)
        assert on_one == on_cluster
        assert on_one["counts"] == dict(Counter(r.status for r in records))
        assert sum(len(page) for page in on_one["()/None"]) == 120

        fragments = []
        for url in (REDIS_URL, redis_cluster):
            async with serving(console_app(url, namespace=namespace)) as base, httpx2.AsyncClient(timeout=10) as http:
                fragment = (await http.get(f"{base}/fragment", params={"status": "completed"})).json()
                page = await http.get(f"{base}/")
                assert page.status_code == 200 and records[-1].task_id in page.text
                fragments.append(fragment)
        shown = [re.findall(r'data-task="([^"]+)"', fragment["rows"]) for fragment in fragments]
        assert shown[0] == shown[1] and len(shown[0]) == 24  # "…m ago" may tick between the two
        assert fragments[0]["counts"] == fragments[1]["counts"] and "completed 24" in fragments[0]["counts"]

        listings = []
        for url in (REDIS_URL, redis_cluster):
            args = ["tasks", "ls", "--store", url, "--namespace", namespace, "--json", "--limit", "200"]
            done = subprocess.run(
                [sys.executable, "-m", "mrtr.cli", *args], capture_output=True, text=True, timeout=60, check=False
            )
            assert done.returncode == 0, done.stderr
            listings.append(json.loads(done.stdout))
        assert listings[0] == listings[1] and len(listings[0]) == 120
    finally:
        await single.close()
        await cluster.close()
        await drop_namespace("redis", namespace)
        await drop_namespace("redis-cluster", namespace, url=redis_cluster)


async def test_the_console_hears_task_changes_on_the_clusters_sharded_bus(redis_cluster: str, tmp_path: Path) -> None:
    """`mrtr console --store redis+cluster://... ` with its bus: a change published by another instance
    (on its own sharded channel) reaches the console's event stream."""
    from mrtr.buses import TaskChanged, open_bus
    from mrtr.console import app as console_app

    namespace = f"mrtr_console_{secrets.token_hex(4)}"
    web = console_app(redis_cluster, bus=redis_cluster, namespace=namespace)
    buses = [open_bus(redis_cluster, namespace=namespace) for _ in range(4)]  # several senders, several channels
    for bus in buses:
        await bus.start()
    try:
        async with (
            serving(web) as url,
            httpx2.AsyncClient(timeout=10) as http,
            http.stream("GET", url + "/events") as events,
        ):
            lines = events.aiter_lines()
            assert (await anext(lines)).startswith("retry:")
            heard: set[str] = set()

            async def read() -> None:
                async for line in lines:
                    if line.startswith("data:"):
                        heard.add(json.loads(line.removeprefix("data:")))

            reader = asyncio.get_running_loop().create_task(read())
            try:
                for _attempt in range(50):  # the console's subscription goes live asynchronously
                    for n, bus in enumerate(buses):
                        await bus.publish(TaskChanged(task_id=f"t-{n}", task={"taskId": f"t-{n}"}))
                    await asyncio.sleep(0.2)
                    if heard >= {f"t-{n}" for n in range(4)}:
                        break
                else:
                    raise AssertionError(f"only {sorted(heard)} reached the console's event stream")
            finally:
                reader.cancel()
    finally:
        for bus in buses:
            await bus.close()
