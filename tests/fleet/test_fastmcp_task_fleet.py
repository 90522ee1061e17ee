"""A durable mrtr task on FastMCP across two processes sharing a store, its worker SIGKILLed mid-step.

The FastMCP 3.x-style tool (`tests/support/fastmcp_task_server.py`) becomes a task on
instance A, which is killed in its slow step; B's lease scanner (started with FastMCP's
lifespan) adopts it, keeps the finished step, reruns the interrupted one under the same
idempotency key; the question is answered through `tasks/update` on B; the task completes.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from mrtr.client import CreatedTask, update_task
from tests.fleet.test_task_fleet import _store_url, audit, client, wait_until
from tests.support.flowkit import task_state
from tests.support.markers import backends
from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = SUPPORT / "fastmcp_task_server.py"
READY = "fastmcp-task-server ready:"


@pytest.mark.parametrize("kind", backends("sqlite", "redis"))
async def test_a_killed_fastmcp_worker_loses_nothing(kind: str, tmp_path: Path) -> None:
    store, namespace = _store_url(kind, tmp_path)
    journal = tmp_path / "audit.jsonl"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": store,
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(journal),
    }
    specs = [ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix=READY) for label in "AB"]
    with spawn_servers(specs, tmp_path) as servers:
        process_a = servers["A"].process
        async with client(servers["A"].url) as on_a, client(servers["B"].url) as on_b:
            created = await on_a.session.call_tool("pipeline", {"job": "j1", "slow": 1.5}, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            task_id = created.task_id

            async def transform_started() -> bool:
                return any(e["step"] == "transform" and e["phase"] == "start" for e in audit(journal))

            await wait_until(transform_started, 10, "A to start the slow step")
            process_a.kill()  # SIGKILL, mid-step
            process_a.wait()

            async def b_took_over() -> bool:
                return any(e["step"] == "transform" and e["instance"] == "B" for e in audit(journal))

            await wait_until(b_took_over, 15, "B's worker (started with FastMCP's lifespan) to adopt the task")

            async def parked() -> dict[str, Any] | None:
                task = await task_state(on_b.session, task_id)
                return task if task["status"] == "input_required" else None

            task = await wait_until(parked, 20, "B to reach the question")
            ((key, request),) = task["inputRequests"].items()
            assert request["params"]["message"] == "Publish DATA(J1)?"
            await update_task(on_b.session, task_id, {key: {"action": "accept", "content": {"value": True}}})

            async def completed() -> dict[str, Any] | None:
                task = await task_state(on_b.session, task_id)
                return task if task["status"] == "completed" else None

            done = await wait_until(completed, 10, "the task to complete")
            assert done["result"]["content"][0]["text"] == "published DATA(J1)"

    entries = audit(journal)
    starts = [e for e in entries if e["step"] == "transform" and e["phase"] == "start"]
    assert [e["instance"] for e in entries if e["step"] == "fetch"] == ["A"], "a finished step is never re-run"
    assert [e["instance"] for e in starts] == ["A", "B"], "the interrupted step runs again on B"
    assert starts[0]["key"] == starts[1]["key"], "under the same idempotency key"
    assert [e["instance"] for e in entries if e["step"] == "publish"] == ["B"]
