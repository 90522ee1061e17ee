"""`TaskAdmin` and `mrtr tasks rerun|cancel` on tasks run by a real runtime, through the store's API."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import mrtr
from mrtr.client import TasksClient
from mrtr.stores import RecordSeal, SealedStore, TaskQuery
from mrtr.stores._sqlite import SQLiteStore
from mrtr.tasks import TaskAdmin
from tests.support.flowkit import SHARED_KEY, new_server, task_state

pytestmark = pytest.mark.anyio


async def _never(*args: Any) -> Any:
    raise AssertionError("these flows ask nothing")


def flaky_server(path: Path, runs: Counter[str], marker: Path) -> Any:
    server = new_server("admin-under-test")
    flows = mrtr.Flows(server, store=SQLiteStore(str(path)), task_poll_interval=0.05, task_scan_interval=0.2)

    def prepare() -> str:
        runs["prepare"] += 1
        return "prepared"

    def deploy() -> str:
        runs["deploy"] += 1
        if marker.exists():
            raise RuntimeError("the target is down")
        return "deployed"

    @flows.tool(task="required")
    async def release(ctx: mrtr.FlowContext) -> str:
        first = await ctx.step("prepare", prepare)
        second = await ctx.step("deploy", deploy)
        return f"{first}, {second}"

    @flows.tool(task="required")
    async def idle(ctx: mrtr.FlowContext) -> str:
        await ctx.wait_for_event("never")
        return "woken"

    return server


def cli(path: Path, *args: str, key: bytes | None = SHARED_KEY) -> subprocess.CompletedProcess[str]:
    """`mrtr tasks ...` on the store, with the servers' key ring in `MRTR_STATE_KEY` (None: without it)."""
    command = [sys.executable, "-m", "mrtr.cli", "tasks", *args, "--store", f"sqlite:///{path}"]
    env = {k: v for k, v in os.environ.items() if k != "MRTR_STATE_KEY"}
    if key is not None:
        env["MRTR_STATE_KEY"] = key.hex()
    return subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)


async def wait_status(session: Any, task_id: str, status: str, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status and ("result" in task or status != "completed"):
                return task
            await asyncio.sleep(0.05)


@pytest.mark.spawns  # the real mrtr process
async def test_rerun_a_failed_task_keeps_its_finished_steps(tmp_path: Path) -> None:
    path, marker, runs = tmp_path / "tasks.db", tmp_path / "down", Counter[str]()
    marker.touch()
    async with Client(flaky_server(path, runs, marker), extensions=[TasksClient(_never)]) as client:
        created = await client.session.call_tool("release", {}, allow_claimed=True)
        task_id = created.task_id
        failed = await wait_status(client.session, task_id, "completed")
        assert failed["result"]["isError"] and runs == Counter(prepare=1, deploy=1)
        refused = await asyncio.to_thread(cli, path, "rerun", "nope")
        assert refused.returncode == 2 and "no task 'nope'" in refused.stderr
        marker.unlink()  # the outside world is fixed
        keyless = await asyncio.to_thread(lambda: cli(path, "rerun", task_id, key=None))
        assert keyless.returncode == 2 and "sealed at rest" in keyless.stderr, keyless.stdout + keyless.stderr
        rerun = await asyncio.to_thread(cli, path, "rerun", task_id)
        assert rerun.returncode == 0 and "attempt 2 queued" in rerun.stdout, rerun.stdout + rerun.stderr
        done = await wait_status(client.session, task_id, "completed")
        while done["result"].get("isError"):
            done = await wait_status(client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "prepared, deployed"
        again = await asyncio.to_thread(cli, path, "rerun", task_id)
        assert again.returncode == 2 and "only failed tasks re-run" in again.stderr
    assert runs == Counter(prepare=1, deploy=2), "the finished step is not run again; the failed one is"
    store = SealedStore(SQLiteStore(str(path)), RecordSeal.from_keys([SHARED_KEY]))
    record = await store.load(task_id, time.time())
    await store.close()
    assert record is not None and record.attempt == 2
    ended = [e for e in record.history if e.get("phase") != "start"]  # each step's start is an entry too
    ran = [(e["kind"], e.get("key"), e.get("attempt"), "error" in e) for e in ended]
    assert ran == [
        ("step", "prepare", 1, False),
        ("step", "deploy", 1, True),
        ("rerun", None, 2, False),
        ("step", "deploy", 2, False),
    ], record.history
    assert ended[1]["error"] == "RuntimeError: the target is down"
    assert all(e["seconds"] >= 0 for e in ended if e["kind"] == "step")


async def test_task_admin_lists_counts_and_cancels_through_the_store_api(tmp_path: Path) -> None:
    path, runs = tmp_path / "tasks.db", Counter[str]()
    async with Client(flaky_server(path, runs, tmp_path / "absent"), extensions=[TasksClient(_never)]) as client:
        done = await client.session.call_tool("release", {}, allow_claimed=True)
        parked = await client.session.call_tool("idle", {}, allow_claimed=True)
        await wait_status(client.session, done.task_id, "completed")
        admin = TaskAdmin(SQLiteStore(str(path)))
        page = await admin.list_tasks(TaskQuery(statuses=("working",)))
        assert [r.task_id for r in page.records] == [parked.task_id]
        assert (await admin.counts())["completed"] == 1 and await admin.flows() == ["idle", "release"]
        cancelled, running = await admin.cancel(parked.task_id)
        assert cancelled.status == "cancelled" and not running, "a parked task has no worker: it ends at once"
        assert (await task_state(client.session, parked.task_id))["status"] == "cancelled"
        await admin.store.close()
