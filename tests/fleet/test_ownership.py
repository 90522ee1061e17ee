"""Tasks belong to their creator, and task creation is idempotent under a client key.

Ownership runs across two real uvicorn instances sharing a SQLite store, each with bearer
auth (a static token verifier: alice and bob are two principals). Idempotent creation runs
in process and across the two instances.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mrtr.client import CreatedTask, TasksClient, cancel_task, get_task, update_task
from tests.integration.test_tasks import task_server, tasks_client
from tests.support.flowkit import task_state
from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.in_process]  # unless marked otherwise

SERVER = SUPPORT / "task_server.py"
TOKENS = {"alice": "tok-alice-" + secrets.token_hex(8), "bob": "tok-bob-" + secrets.token_hex(8)}
KEY = "mrtr/idempotencyKey"


async def _never(*args: Any) -> Any:
    raise AssertionError("answers go through tasks/update here")


@asynccontextmanager
async def as_user(url: str, user: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {TOKENS[user]}"} if user else {}
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0, headers=headers) as http:
        client = Client(
            streamable_http_client(url, http_client=http), extensions=[TasksClient(_never)], elicitation_callback=_never
        )
        async with client:
            yield client


@pytest.fixture
def fleet(tmp_path: Path) -> Any:
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": f"sqlite:///{tmp_path / 'tasks.db'}",
        "MRTR_AUDIT": str(tmp_path / "audit.jsonl"),
        "MRTR_TOKENS": ",".join(f"{name}={token}" for name, token in TOKENS.items()),
        "MRTR_SEED": "1",
    }
    specs = [
        ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix="task-server ready:")
        for label in ("A", "B")
    ]
    with spawn_servers(specs, tmp_path) as servers:
        yield servers["A"].url, servers["B"].url


async def seed_result(session: Any, task_id: str) -> Any:
    from mrtr.client._tasks import _ANY, _TaskRequest
    from mrtr.tasks import TaskRequestParams

    request = _TaskRequest(method="tasks/result", params=TaskRequestParams(task_id=task_id))
    return await session.send_request(request, _ANY)


async def _refusal(call: Any) -> t.ErrorData:
    with pytest.raises(MCPError) as caught:
        await call
    return caught.value.error


def _same_as_unknown(error: t.ErrorData, unknown: t.ErrorData, task_id: str, other_id: str) -> bool:
    """Equal to the unknown-id error, once each message's own id is blanked out."""
    blank = lambda e, tid: (e.code, e.message.replace(tid, "<id>"), e.data)  # noqa: E731
    return blank(error, task_id) == blank(unknown, other_id)


@pytest.mark.spawns
async def test_another_principal_cannot_see_answer_or_cancel_a_task(fleet: tuple[str, str]) -> None:
    url_a, url_b = fleet
    async with as_user(url_a, "alice") as alice_a, as_user(url_b, "alice") as alice_b, as_user(url_b, "bob") as bob:
        created = await alice_a.session.call_tool("pipeline", {"job": "j", "slow": 0}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        task_id = created.task_id
        import anyio

        with anyio.fail_after(10):
            while (task := await task_state(alice_b.session, task_id))["status"] != "input_required":
                await anyio.sleep(0.05)
        (key,) = task["inputRequests"]
        missing = "x" * len(task_id)
        unknown = await _refusal(get_task(bob.session, missing))
        assert unknown.code == t.INVALID_PARAMS
        # bob on instance B: get, update, cancel all look exactly like an unknown id
        for call in (
            get_task(bob.session, task_id),
            update_task(bob.session, task_id, {key: {"action": "accept", "content": {"publish": True}}}),
            cancel_task(bob.session, task_id),
            seed_result(bob.session, task_id),  # the seed dialect's tasks/result
        ):
            assert _same_as_unknown(await _refusal(call), unknown, task_id, missing)
        # ... and changed nothing: alice still sees her question, answers it, gets her result
        still = await task_state(alice_b.session, task_id)
        assert still["status"] == "input_required" and list(still["inputRequests"]) == [key]
        await update_task(alice_b.session, task_id, {key: {"action": "accept", "content": {"publish": False}}})
        with anyio.fail_after(10):
            while (done := await task_state(alice_a.session, task_id))["status"] != "completed":
                await anyio.sleep(0.05)
        assert done["result"]["content"][0]["text"] == "not published"
        assert _same_as_unknown(await _refusal(get_task(bob.session, task_id)), unknown, task_id, missing)


@pytest.mark.spawns
async def test_idempotency_key_is_per_principal_and_fleet_wide(fleet: tuple[str, str]) -> None:
    url_a, url_b = fleet
    key = str(uuid.uuid4())
    args = {"job": "k", "slow": 0}
    async with as_user(url_a, "alice") as alice_a, as_user(url_b, "alice") as alice_b, as_user(url_b, "bob") as bob:
        first = await alice_a.session.call_tool("pipeline", args, meta={KEY: key}, allow_claimed=True)
        again = await alice_b.session.call_tool("pipeline", args, meta={KEY: key}, allow_claimed=True)
        assert isinstance(first, CreatedTask) and isinstance(again, CreatedTask)
        assert again.task_id == first.task_id, "a resend with the same key (on another instance) finds the task"
        bobs = await bob.session.call_tool("pipeline", args, meta={KEY: key}, allow_claimed=True)
        assert isinstance(bobs, CreatedTask) and bobs.task_id != first.task_id, "keys are per principal"
        reused = await _refusal(
            alice_b.session.call_tool("pipeline", {"job": "other", "slow": 0}, meta={KEY: key}, allow_claimed=True)
        )
        assert reused.code == t.INVALID_PARAMS and reused.data == {"reason": "idempotency_key_reused"}


async def test_idempotent_creation_in_process_runs_one_task() -> None:
    from collections import Counter

    runs: Counter[str] = Counter()
    server = task_server(runs)
    async with tasks_client(server) as client:
        key = str(uuid.uuid4())
        ids = set()
        for _ in range(3):
            created = await client.session.call_tool(
                "slow_compute", {"seconds": 0.01}, meta={KEY: key}, allow_claimed=True
            )
            assert isinstance(created, CreatedTask)
            ids.add(created.task_id)
        assert len(ids) == 1
        plain = await client.session.call_tool("slow_compute", {"seconds": 0.01}, allow_claimed=True)
        assert isinstance(plain, CreatedTask) and plain.task_id not in ids
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool("slow_compute", {"seconds": 0.02}, meta={KEY: key}, allow_claimed=True)
        assert caught.value.error.code == t.INVALID_PARAMS and caught.value.error.data == {
            "reason": "idempotency_key_reused"
        }
        with pytest.raises(MCPError) as bad:
            await client.session.call_tool("slow_compute", {"seconds": 0.01}, meta={KEY: ""}, allow_claimed=True)
        assert bad.value.error.code == t.INVALID_PARAMS
