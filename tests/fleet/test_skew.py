"""Task leases are judged on the store's clock, so a worker with a skewed wall clock cannot steal.

A host whose clock runs two minutes fast is a fault we cannot cause for real here, so its
worker's `local_clock` is replaced (the only fake in this test); the stores are the real
SQLite file, Redis and PostgreSQL. Worker A runs a task under a short lease it keeps
renewing. Worker B, two minutes fast but synchronised with the store's clock, never claims
it. Worker C, equally fast but left on its own wall clock (what every worker did before),
claims it at once: the failure this guards against.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import mrtr
from mrtr._engine.journal import Journal
from mrtr.stores import open_store
from mrtr.tasks._seam import TaskCall
from tests.fleet.test_task_fleet import _store_url
from tests.support.flowkit import new_server
from tests.support.markers import backends
from tests.support.storekit import drop_namespace

# alone: short leases, renewed on time (make test runs it with nothing beside it)
pytestmark = [pytest.mark.anyio, pytest.mark.in_process, pytest.mark.alone]

SKEW = 120.0


def worker(url: str, namespace: str, release: asyncio.Event, runs: list[str], label: str) -> mrtr.Flows:
    flows = mrtr.Flows(new_server(f"skew-{label}"), store=open_store(url, namespace=namespace), task_lease=0.6)

    async def hold() -> str:
        runs.append(label)
        await release.wait()
        return "held"

    @flows.tool(task="required")
    async def slow(ctx: mrtr.FlowContext) -> str:
        return await ctx.step("hold", hold)

    return flows


async def _drop(kind: str, url: str, namespace: str) -> None:
    await drop_namespace(kind, namespace, url=url)


@pytest.mark.parametrize("kind", backends("sqlite", "redis", "redis-cluster", "postgres"))
async def test_a_fast_clock_does_not_steal_a_live_lease(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, namespace = _store_url(kind, tmp_path, request)
    release = asyncio.Event()
    runs: list[str] = []
    a, b, c = (worker(url, namespace, release, runs, label) for label in "ABC")
    skewed = lambda: time.time() + SKEW  # noqa: E731
    b.runtime.context.local_clock = skewed
    c.runtime.context.local_clock = skewed
    try:
        spec = a.runtime.flows["slow"][0]
        created = await a.runtime.start(TaskCall(spec, {}, None, Journal.start()))
        await b.runtime.context.sync_clock()
        assert abs(b.runtime.context.now() - time.time()) < 1.0, "B's store-clock time is the true time"
        deadline = time.monotonic() + 2.0  # three lease lengths: A renews, B must never claim
        while time.monotonic() < deadline:
            assert await b.runtime.worker.scan_once() == 0
            await asyncio.sleep(0.1)
        assert runs == ["A"]
        # The control: on its own fast clock, C sees A's live lease as long expired and steals it.
        # (A's heartbeat may win one compare-and-set race against C's claim: C tries again.)
        claimed = 0
        for _ in range(20):
            claimed = await c.runtime.worker.scan_once()
            if claimed:
                break
            await asyncio.sleep(0.05)
        assert claimed == 1
        await asyncio.sleep(0.1)
        assert runs == ["A", "C"]
        assert created.status == "working"
    finally:
        release.set()
        for flows in (a, b, c):
            await flows.runtime.close()
            await flows.runtime.store.close()
        await _drop(kind, url, namespace)
