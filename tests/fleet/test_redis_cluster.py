"""mrtr on a Redis Cluster: what only a cluster shows (the store contract, the bus, the fleets and
the CLI run on the cluster in their own modules, beside Redis on one node).

- the console and `mrtr tasks` count and list the same tasks the same on a cluster as on one node;
- the console's live updates ride the cluster's sharded pub/sub;
- failover: a primary holding task keys is SIGKILLed while tasks run; its replica is promoted and
  every task completes, each step under one idempotency key per task; clients see retryable
  errors at most;
- the bus across a failover: a gap is reported, then every event arrives exactly once again.

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
from tests.support.redis_cluster import LocalCluster, cli
from tests.support.storekit import REDIS_URL, drop_namespace, service_problem

# alone: failovers timed by a 1 s node timeout (make test runs it with nothing beside it)
pytestmark = [pytest.mark.anyio, pytest.mark.needs_redis, pytest.mark.spawns, pytest.mark.alone]

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


async def test_a_primary_killed_while_tasks_run_loses_no_task(tmp_path: Path) -> None:
    """3 primaries with a replica each (node timeout 1 s), two mrtr instances, eight tasks in their
    slow step. The primary holding the first task's keys is SIGKILLed; its replica is promoted.
    Every task completes with its own result; each step ran under one idempotency key per task
    (a step may run again after a failover, as after a worker's death, never under another key);
    the clients saw nothing worse than retryable errors, and only while the slot had no primary."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from mrtr.client import CreatedTask, TasksClient, update_task
    from mrtr.stores._redis import RedisStore
    from tests.support.flowkit import task_state
    from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

    async def never(*args: Any) -> Any:
        raise AssertionError("answers go through tasks/update here")

    if LocalCluster.available() is not None:
        if os.environ.get("CI"):
            pytest.fail(str(LocalCluster.available()))
        pytest.skip(str(LocalCluster.available()))
    journal = tmp_path / "audit.jsonl"
    namespace = f"mrtr_failover_{secrets.token_hex(4)}"
    with LocalCluster(tmp_path / "cluster", primaries=3, replicas=1, node_timeout_ms=1000) as cluster:
        env = {
            "MRTR_STATE_KEY": secrets.token_hex(32),
            "MRTR_STORE": cluster.url,
            "MRTR_STORE_NAMESPACE": namespace,
            "MRTR_AUDIT": str(journal),
        }
        specs = [
            ServerSpec(
                label,
                env | {"MRTR_INSTANCE": label},
                script=SUPPORT / "task_server.py",
                ready_prefix="task-server ready:",
            )
            for label in ("A", "B")
        ]
        errors: list[str] = []
        with spawn_servers(specs, tmp_path) as servers:
            peers = [
                Client(servers[label].url, extensions=[TasksClient(never)], elicitation_callback=never)
                for label in ("A", "B")
            ]
            async with peers[0] as on_a, peers[1] as on_b:
                tasks: dict[str, str] = {}
                for n in range(8):
                    created = await (on_a, on_b)[n % 2].session.call_tool(
                        "pipeline", {"job": f"j{n}", "slow": 2.0}, allow_claimed=True
                    )
                    assert isinstance(created, CreatedTask)
                    tasks[created.task_id] = f"j{n}"

                def started() -> int:
                    lines = journal.read_text().splitlines() if journal.exists() else []
                    return sum(1 for line in lines if '"transform"' in line and '"start"' in line)

                deadline = time.monotonic() + 20
                while started() < 8 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                first = next(iter(tasks))
                locator = RedisStore(cluster.url, prefix=f"{namespace}:")
                victim = cluster.primary_of(locator.shard_of(first).records + first)
                await locator.close()
                cluster.wait_replicated(victim)  # what the victim acknowledged is on its replica
                killed_at = time.monotonic()
                cluster.kill(victim)  # SIGKILL, mid-step for every task
                assert victim not in cluster.primary_ports()

                async def state(task_id: str) -> dict[str, Any] | None:
                    for peer in (on_a, on_b):
                        try:
                            return await task_state(peer.session, task_id)
                        except MCPError as exc:  # the slot has no primary yet: retry
                            errors.append(f"{exc.error.code} {exc.error.message}")
                    return None

                results: dict[str, str] = {}
                answered: dict[str, float] = {}  # task id -> when its answer was sent
                deadline = time.monotonic() + 60
                while len(results) < len(tasks) and time.monotonic() < deadline:
                    for task_id in tasks:
                        if task_id in results:
                            continue
                        task = await state(task_id)
                        if task is None:
                            continue
                        assert task["status"] in ("working", "input_required", "completed"), task
                        # Answered again if it still asks 3 s later: Redis replicates asynchronously, so
                        # an answer the old primary acknowledged may be gone from the promoted replica.
                        asked_again = time.monotonic() - answered.get(task_id, float("-inf")) > 3
                        if task["status"] == "input_required" and asked_again:
                            ((key, _),) = task["inputRequests"].items()
                            try:
                                await update_task(
                                    on_b.session, task_id, {key: {"action": "accept", "content": {"publish": True}}}
                                )
                                answered[task_id] = time.monotonic()
                            except MCPError as exc:
                                errors.append(f"{exc.error.code} {exc.error.message}")
                        elif task["status"] == "completed":
                            results[task_id] = task["result"]["content"][0]["text"]
                    await asyncio.sleep(0.1)
                recovered = time.monotonic() - killed_at
                missing = [task_id for task_id in tasks if task_id not in results]
                if missing:  # what the store holds for them, and what the servers said: the failure's story
                    store = RedisStore(cluster.url, prefix=f"{namespace}:")
                    raw = store._redis  # the keys themselves: a missing record and an expired one differ
                    try:
                        held: dict[str, Any] = {t: await store.load(t, time.time()) for t in missing}
                        for t in missing:
                            shard = store.shard_of(t)
                            held[f"{t} raw"] = {
                                "exists": await raw.exists(shard.records + t),
                                "expires": await raw.zscore(shard.expiry, t),
                                "now": time.time(),
                            }
                    except Exception as exc:  # a diagnostic only
                        held = {"store": repr(exc)}
                    finally:
                        await store.close()
                    story = {
                        "records": held,
                        "replication": {port: cli(port, "info", "replication") for port in cluster.live_ports()},
                        "cluster": cluster.nodes_text(),
                        "logs": {label: servers[label].log()[-4000:] for label in servers},
                        "errors": Counter(errors),
                    }
                    raise AssertionError(f"{len(missing)} of {len(tasks)} tasks did not complete in 60 s: {story}")
        assert results == {task_id: f"published DATA({job.upper()})" for task_id, job in tasks.items()}, errors
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    for step in ("fetch", "transform", "publish"):
        keys = Counter(e["key"] for e in entries if e["step"] == step and e["phase"] in ("done", "start"))
        assert len(keys) == len(tasks), f"{step}: one idempotency key per task, re-runs under it ({keys})"
    ends = Counter(e["key"] for e in entries if e["step"] == "transform" and e["phase"] == "end")
    assert len(ends) == len(tasks)
    print(f"\nfailover: every task completed {recovered:.1f}s after the SIGKILL; client errors: {Counter(errors)}")


async def test_the_bus_survives_a_failover_with_a_gap_then_delivers_exactly_once_again(tmp_path: Path) -> None:
    """The primary serving a sender's sharded channel is SIGKILLed: the listener is told events may
    be lost (a `BusGap`), resubscribes on the promoted replica by itself, and hears every event sent
    after the failover exactly once, in order."""
    from mcp.shared.subscriptions import ResourceUpdated

    from mrtr.buses import BusGap, open_bus

    if LocalCluster.available() is not None:
        if os.environ.get("CI"):
            pytest.fail(str(LocalCluster.available()))
        pytest.skip(str(LocalCluster.available()))
    with LocalCluster(tmp_path / "cluster", primaries=3, replicas=1, node_timeout_ms=1000) as cluster:
        sender, listener = open_bus(cluster.url, max_backoff=0.5), open_bus(cluster.url, max_backoff=0.5)
        await sender.start()
        await listener.start()
        heard: list[Any] = []
        listener.subscribe(heard.append)
        try:
            await sender.publish(ResourceUpdated(uri="res://before"))
            deadline = time.monotonic() + 10
            while ResourceUpdated(uri="res://before") not in heard and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert heard == [ResourceUpdated(uri="res://before")]
            cluster.kill(cluster.primary_of(sender.channel))  # type: ignore[attr-defined]
            cluster.wait_ok()
            deadline = time.monotonic() + 20
            while not any(isinstance(e, BusGap) for e in heard) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert any(isinstance(e, BusGap) for e in heard), "the listener was not told it may have missed events"
            after = [ResourceUpdated(uri=f"res://after-{n}") for n in range(50)]
            for event in after:
                await sender.publish(event)
            deadline = time.monotonic() + 20
            while sum(1 for e in heard if e in after) < len(after) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # a duplicate would arrive by now
            assert [e for e in heard if isinstance(e, ResourceUpdated) and e.uri.startswith("res://after")] == after
        finally:
            await sender.close()
            await listener.close()
