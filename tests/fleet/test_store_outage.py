"""The task store goes away and comes back: one real server, a private Redis or PostgreSQL.

Durable tasks are running when the store is SIGKILLed; it stays down a few seconds and
restarts (Redis with its append-only file on, as the docs recommend). While it is down:

- a call that needs the store gets a JSON-RPC error naming the store and saying "retry"
  (`data.retryable`), quickly: never an "Internal server error", an `isError` tool result
  or a hang;
- an inline flow that needs no store still completes, and so does `/healthz`;
- `FlowClient` resends store errors by itself: a task it starts during the outage completes.

After the store returns, with no process restarted (the pools reconnect by themselves):
every task completes with its result, none is lost or run twice as a second task, each
step's side effect ran under one idempotency key (a step whose checkpoint was lost runs
again under the same key), and the server logged no traceback and a bounded number of lines.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mrtr.client import FlowClient, RetryPolicy, TasksClient
from tests.support.markers import backends
from tests.support.pg_proc import PostgresProcess
from tests.support.redis_proc import RedisProcess
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = SUPPORT / "outage_server.py"
READY = "outage-server ready:"
OUTAGE = 4.0  # seconds the store stays down
PATIENT = RetryPolicy(attempts=8, initial_delay=0.1, max_delay=1.0, store_patience=30.0)


class _Store:
    """A private store process of either kind: `url`, `kill()`, `start()`."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        if kind == "redis":
            if RedisProcess.binary() is None:
                _unavailable("redis-server is not installed")
            self.proc: Any = RedisProcess(workdir, appendfsync="always")
        else:
            reason = PostgresProcess.available()
            if reason is not None:
                _unavailable(reason)
            self.proc = PostgresProcess()

    @property
    def name(self) -> str:
        return "redis" if self.kind == "redis" else "postgresql"

    def __enter__(self) -> _Store:
        self.proc.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.__exit__(*exc)


def _unavailable(reason: str) -> None:
    import os

    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def audit(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _never(*args: Any) -> Any:
    raise AssertionError("no question is asked here")


async def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(("kind", "host"), backends(("redis", "sdk"), ("postgres", "fastmcp")))
async def test_a_store_outage_is_retryable_and_loses_nothing(kind: str, host: str, tmp_path: Path) -> None:
    journal = tmp_path / "audit.jsonl"
    with _Store(kind, tmp_path) as store:
        env = {
            "MRTR_STATE_KEY": secrets.token_hex(32),
            "MRTR_STORE": store.proc.url,
            "MRTR_AUDIT": str(journal),
            "MRTR_HOST": host,
            "MRTR_LEASE": "2.0",
        }
        spec = ServerSpec("A", env | {"MRTR_INSTANCE": "A"}, script=SERVER, ready_prefix=READY)
        with spawn_servers([spec], tmp_path) as servers:
            await _outage(store, servers["A"], journal)
            log = servers["A"].log()

    # Every task ran each step under one idempotency key (one task per call: none duplicated),
    # and every step that started also finished, at most twice (a lost checkpoint re-runs it).
    by_tag: dict[str, dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for entry in audit(journal):
        by_tag[entry["tag"]][entry["step"]].append(entry)
    jobs = [tag for tag in by_tag if tag.startswith("job")]
    assert len(jobs) == 7, sorted(by_tag)
    reruns = []
    for tag in jobs:
        for step in ("one", "two"):
            entries = by_tag[tag][step]
            assert len({e["key"] for e in entries}) == 1, f"{tag}/{step} ran under several keys: {entries}"
            ends = [e for e in entries if e["phase"] == "end"]
            assert 1 <= len(ends) <= 2, f"{tag}/{step}: {entries}"
            if len(ends) == 2:
                reruns.append(f"{tag}/{step}")
    assert len(reruns) <= 5, f"steps re-ran: {reruns}"
    # No failure storm: no traceback, and a handful of store lines, whatever the number of calls.
    assert log.count("Traceback") == 0, log[-4000:]
    store_lines = [line for line in log.splitlines() if "mrtr.store" in line or "task store" in line]
    assert len(store_lines) <= 6, store_lines
    assert "Task exception was never retrieved" not in log
    assert "database is locked" not in log


async def _outage(store: _Store, server: ServerProcess, journal: Path) -> None:
    results: dict[str, str] = {}
    async with FlowClient(server.url, retry=PATIENT, timeout=30, tasks=True) as flows:

        async def run_job(tag: str, slow: float) -> None:
            result = await flows.call_tool("job", {"tag": tag, "slow": slow})
            assert not result.is_error, result
            results[tag] = result.content[0].text  # type: ignore[union-attr]

        with anyio.fail_after(90):
            async with anyio.create_task_group() as group:
                for i in range(6):
                    group.start_soon(run_job, f"job{i}", 1.5)
                await wait_until(
                    lambda: sum(e["step"] == "two" and e["phase"] == "start" for e in audit(journal)) >= 6,
                    20,
                    "every task to start its slow step",
                )
                store.proc.kill()
                down_at = time.monotonic()
                await _while_down(store, server)
                group.start_soon(run_job, "job-late", 0.1)  # FlowClient resends until the store is back
                await anyio.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))
                store.proc.start()
    assert results == {tag: f"{tag}:done" for tag in [*(f"job{i}" for i in range(6)), "job-late"]}


async def _while_down(store: _Store, server: ServerProcess) -> None:
    async with Client(server.url, extensions=[TasksClient(_never)], elicitation_callback=_never) as raw:
        # A call that needs the store: a retryable JSON-RPC error, fast, naming the store.
        started = time.monotonic()
        try:
            answer = await raw.session.call_tool("job", {"tag": "refused", "slow": 0.0}, allow_claimed=True)
        except MCPError as exc:
            error = exc.error
        else:
            raise AssertionError(f"not a JSON-RPC error: {answer!r}\n{server.log()[-3000:]}")
        took = time.monotonic() - started
        assert error.code == -32603, error
        assert store.name in error.message and "retry" in error.message, error
        assert error.data == {"reason": "store_unavailable", "store": store.name, "retryable": True}, error
        assert took < 10, f"the refusal took {took:.1f}s"
        # Inline flows and health need no store: they answer at once.
        for i in range(5):
            started = time.monotonic()
            result = await raw.call_tool("hello", {"tag": f"inline{i}"})
            assert result.content[0].text == "hello greet", result  # type: ignore[union-attr]
            assert time.monotonic() - started < 1.0
        async with httpx2.AsyncClient() as http:
            started = time.monotonic()
            health = await http.get(server.url.removesuffix("/mcp") + "/healthz")
            assert health.status_code == 200 and time.monotonic() - started < 1.0
