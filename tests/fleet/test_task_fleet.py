"""Durable tasks across real server processes sharing a store, with a worker killed mid-step.

Each store runs the same scenario: instance A starts a task and is killed (SIGKILL) in
the middle of its slow step; instance B takes the task over once A's lease runs out and
replays it — the finished step is not re-run, the interrupted one runs again under the
same idempotency key — then the task asks for input, which is answered through B, and
completes. Redis and PostgreSQL are this machine's local services.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mcp_types as t
import pytest
from mcp import Client

from mrtr.client import CreatedTask, TasksClient, update_task
from tests.support.flowkit import task_state
from tests.support.markers import backends
from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = SUPPORT / "task_server.py"
READY = "task-server ready:"


def _service_reachable(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest | None = None) -> tuple[str, str]:
    """A store URL of `kind` and a fresh namespace; `"redis-cluster"` (needs `request`): the private cluster."""
    namespace = f"mrtr_fleet_{secrets.token_hex(4)}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}", namespace
    if kind == "redis-cluster":
        assert request is not None, "a cluster store needs the test's request (the redis_cluster fixture)"
        return str(request.getfixturevalue("redis_cluster")), namespace
    port = 6379 if kind == "redis" else 5432
    if not _service_reachable(port):
        message = f"{kind} is not reachable on 127.0.0.1:{port}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if kind == "redis":
        return "redis://127.0.0.1:6379/0", namespace
    return "postgresql://postgres@127.0.0.1:5432/postgres", namespace


@contextmanager
def instances(labels: list[str], env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, tuple[str, Any]]]:
    specs = [ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix=READY) for label in labels]
    with spawn_servers(specs, tmp_path) as servers:
        yield {label: (server.url, server.process) for label, server in servers.items()}


def audit(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _never(*args: Any) -> Any:
    raise AssertionError("answers go through tasks/update here")


def client(url: str) -> Client:
    return Client(url, extensions=[TasksClient(_never)], elicitation_callback=_never)


async def wait_until(predicate, timeout: float, what: str) -> Any:
    import anyio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    ("kind", "app"),
    backends(
        ("sqlite", "flows"), ("redis", "flows"), ("redis-cluster", "flows"), ("postgres", "flows"), ("sqlite", "server")
    ),
)
async def test_a_killed_worker_loses_nothing(
    kind: str, app: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`app="server"`: the SDK's own `server.streamable_http_app()` adopts orphaned tasks at boot too."""
    store, namespace = _store_url(kind, tmp_path, request)
    journal = tmp_path / "audit.jsonl"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": store,
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(journal),
        "MRTR_SERVER_APP": "1" if app == "server" else "0",
    }
    with instances(["A", "B"], env, tmp_path) as servers:
        url_a, process_a = servers["A"]
        url_b, _ = servers["B"]
        async with client(url_a) as on_a, client(url_b) as on_b:
            created = await on_a.session.call_tool("pipeline", {"job": "j1", "slow": 1.5}, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            task_id = created.task_id

            async def transform_started() -> bool:
                return any(e["step"] == "transform" and e["phase"] == "start" for e in audit(journal))

            await wait_until(transform_started, 10, "A to start the slow step")
            process_a.kill()  # SIGKILL, mid-step: no cleanup, no lease release
            process_a.wait()

            async def b_took_over() -> bool:
                return any(e["step"] == "transform" and e["instance"] == "B" for e in audit(journal))

            # No request has reached B yet: its worker, started with the app, adopts the task.
            await wait_until(b_took_over, 15, "B's worker to adopt the orphaned task")

            async def parked() -> dict[str, Any] | None:
                task = await task_state(on_b.session, task_id)  # B answers for the dead A
                return task if task["status"] == "input_required" else None

            task = await wait_until(parked, 20, "B to take over and reach the question")
            ((key, request),) = task["inputRequests"].items()
            assert request["params"]["message"] == "Publish DATA(J1)?"
            await update_task(on_b.session, task_id, {key: {"action": "accept", "content": {"publish": True}}})

            async def completed() -> dict[str, Any] | None:
                task = await task_state(on_b.session, task_id)
                return task if task["status"] == "completed" else None

            done = await wait_until(completed, 10, "the task to complete")
            assert done["result"]["content"][0]["text"] == "published DATA(J1)"
        pid_a = process_a.pid
    await _both_runs_are_visible(store, namespace, env["MRTR_STATE_KEY"], task_id, pid_a)

    entries = audit(journal)
    fetches = [e for e in entries if e["step"] == "fetch"]
    starts = [e for e in entries if e["step"] == "transform" and e["phase"] == "start"]
    ends = [e for e in entries if e["step"] == "transform" and e["phase"] == "end"]
    publishes = [e for e in entries if e["step"] == "publish"]
    assert [e["instance"] for e in fetches] == ["A"], "a finished step is never re-run"
    assert [e["instance"] for e in starts] == ["A", "B"], "the interrupted step runs again on B"
    assert starts[0]["key"] == starts[1]["key"], "under the same idempotency key"
    assert [e["instance"] for e in ends] == ["B"]
    assert [e["instance"] for e in publishes] == ["B"]


async def _both_runs_are_visible(store: str, namespace: str, key: str, task_id: str, pid_a: int) -> None:
    """The killed step's two runs, in `mrtr tasks show` and on the console's task page: where each
    ran, under which idempotency key, and which finished (#50: a re-run an operator can see)."""
    import asyncio

    import httpx2 as httpx
    from typer.testing import CliRunner

    from mrtr.cli._app import app
    from mrtr.console import app as console_app
    from mrtr.stores import RecordSeal

    args = ["tasks", "show", task_id, "--store", store, "--namespace", namespace]
    shown = await asyncio.to_thread(CliRunner().invoke, app, args, env={"COLUMNS": "400", "MRTR_STATE_KEY": key})
    assert shown.exit_code == 0, shown.stdout + shown.stderr
    runs = [line for line in shown.stdout.splitlines() if " transform " in f" {line} " and " of 2" in line]
    assert len(runs) == 2, shown.stdout
    first, second = runs
    assert "1 of 2" in first and f":{pid_a}:" in first and "did not finish" in first, first
    assert "2 of 2" in second and f":{pid_a}:" not in second and "finished" in second, second
    keys = {word for line in runs for word in line.split() if word.endswith(":transform")}
    assert len(keys) == 1, f"one idempotency key for both runs: {keys}"
    export = ["tasks", "export", task_id, "--store", store, "--namespace", namespace]
    exported = await asyncio.to_thread(CliRunner().invoke, app, export, env={"MRTR_STATE_KEY": key})
    assert exported.exit_code == 0, exported.stdout + exported.stderr
    history = json.loads(exported.stdout)["history"]
    starts = [e for e in history if e.get("key") == "transform" and e.get("phase") == "start"]
    ends = [e for e in history if e.get("key") == "transform" and e.get("phase") == "end"]
    assert len(starts) == 2 and f":{pid_a}:" in starts[0]["instance"], starts
    assert [e["instance"] for e in ends] == [starts[1]["instance"]], "the second run finished"
    assert {e["idempotency_key"] for e in starts + ends} == keys
    web = console_app(store, namespace=namespace, seal=RecordSeal.from_keys([bytes.fromhex(key)]))
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        page = (await http.get(f"/tasks/{task_id}")).text
    assert page.count(">1 of 2<") == 1 and page.count(">2 of 2<") == 1, "both runs of the step, numbered"
    assert f":{pid_a}:" in page and "did not finish (its worker stopped)" in page
    assert keys.pop() in page


async def test_any_instance_serves_get_update_and_cancel(tmp_path: Path) -> None:
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": f"sqlite:///{tmp_path / 'tasks.db'}",
        "MRTR_AUDIT": str(tmp_path / "audit.jsonl"),
    }
    with instances(["A", "B"], env, tmp_path) as servers:
        async with client(servers["A"][0]) as on_a, client(servers["B"][0]) as on_b:
            created = await on_a.session.call_tool("pipeline", {"job": "j2", "slow": 0}, allow_claimed=True)

            async def parked() -> dict[str, Any] | None:
                task = await task_state(on_b.session, created.task_id)
                return task if task["status"] == "input_required" else None

            task = await wait_until(parked, 10, "the question")
            (key,) = task["inputRequests"]
            await update_task(on_b.session, created.task_id, {key: {"action": "accept", "content": {"publish": False}}})

            async def completed() -> dict[str, Any] | None:
                task = await task_state(on_a.session, created.task_id)
                return task if task["status"] == "completed" else None

            done = await wait_until(completed, 10, "completion")
            assert done["result"]["content"][0]["text"] == "not published"
            assert isinstance(t.CallToolResult.model_validate(done["result"]), t.CallToolResult)
