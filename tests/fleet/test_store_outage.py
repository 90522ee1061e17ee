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
import re
import secrets
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mrtr.client import FlowClient, RetryPolicy, TasksClient
from tests.support.flowkit import Driver, accept, manual_client, text_of
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


@pytest.mark.needs_redis
@pytest.mark.parametrize("outage", ["fail_closed", "degrade"])
async def test_an_inline_round_during_a_guard_outage_is_the_flows_choice(outage: str, tmp_path: Path) -> None:
    """`Flows(replay_guard_outage=...)`. Fail closed (the default): a round answered while the guard
    cannot check it is refused (retryable), not run unguarded; sent again after the store returns,
    it runs once, and a third send gets the kept outcome. Degrade: it runs at once, unguarded,
    logged once for the outage and once when the store answers again."""
    journal = tmp_path / "audit.jsonl"
    with _Store("redis", tmp_path) as store:
        env = {
            "MRTR_STATE_KEY": secrets.token_hex(32),
            "MRTR_STORE": store.proc.url,
            "MRTR_AUDIT": str(journal),
            "MRTR_GUARD_OUTAGE": outage,
        }
        spec = ServerSpec("A", env | {"MRTR_INSTANCE": "A"}, script=SERVER, ready_prefix=READY)
        with spawn_servers([spec], tmp_path) as servers, anyio.fail_after(60):
            async with manual_client(servers["A"].url) as client:
                drivers = [Driver(client, "ask", {"tag": tag}) for tag in ("g", "h")]
                for driver in drivers:
                    assert isinstance(await driver.send(), t.InputRequiredResult)
                answer = {"z": accept(value=5)}
                store.proc.kill()
                if outage == "fail_closed":
                    with pytest.raises(MCPError) as caught:
                        await drivers[0].send(answer)
                    data = caught.value.error.data
                    assert data == {
                        "reason": "replay_guard_unavailable",
                        "store": "redis",
                        "retryable": True,
                        "flow": "ask",
                    }
                    assert not [e for e in audit(journal) if e["step"] == "add"], "the round ran unguarded"
                else:
                    for driver in drivers:  # both answer rounds run during the outage
                        done = await driver.send(answer)
                        assert isinstance(done, t.CallToolResult) and text_of(done).endswith(":add:5"), done
                store.proc.start()
                if outage == "fail_closed":
                    for _ in range(2):  # the retry runs the round; a resend of it gets the kept outcome
                        done = await drivers[0].send(answer)
                        assert isinstance(done, t.CallToolResult) and text_of(done) == "g:add:5", done
                else:  # a guarded round again: the guard says it is back
                    after = Driver(client, "ask", {"tag": "after"})
                    await after.send()
                    done = await after.send(answer)
                    assert isinstance(done, t.CallToolResult) and text_of(done) == "after:add:5", done
            log = servers["A"].log()
    adds = [e["tag"] for e in audit(journal) if e["step"] == "add" and e["phase"] == "end"]
    assert sorted(adds) == (["g"] if outage == "fail_closed" else ["after", "g", "h"])
    assert log.count("Traceback") == 0, log[-4000:]
    text = " ".join(re.sub(r"\S+\.py:\d+", " ", log).split())  # the log's columns wrap messages
    unguarded = text.count("does not answer; rounds run unguarded until it does")
    back = text.count("its ledger answers again; 2 round(s) ran unguarded meanwhile")
    assert (unguarded, back) == ((0, 0) if outage == "fail_closed" else (1, 1)), log[-3000:]


async def test_a_locked_sqlite_file_is_a_retryable_error_never_database_is_locked(tmp_path: Path) -> None:
    """Two server processes write one SQLite file while a third process holds its write lock
    past the busy timeout: a client sees the retryable store error (not "database is locked"),
    and `FlowClient`'s tasks, started before and during the lock, all complete once."""
    import sqlite3

    journal, db = tmp_path / "audit.jsonl", tmp_path / "tasks.db"
    env = {"MRTR_STATE_KEY": secrets.token_hex(32), "MRTR_STORE": f"sqlite:///{db}", "MRTR_AUDIT": str(journal)}
    specs = [ServerSpec(x, env | {"MRTR_INSTANCE": x}, script=SERVER, ready_prefix=READY) for x in "AB"]
    results: dict[str, str] = {}
    with spawn_servers(specs, tmp_path) as servers, anyio.fail_after(90):
        urls = [s.url for s in servers.values()]
        async with (
            FlowClient(urls[0], retry=PATIENT, timeout=30, tasks=True) as on_a,
            FlowClient(urls[1], retry=PATIENT, timeout=30, tasks=True) as on_b,
        ):

            async def run_job(flows: FlowClient, tag: str) -> None:
                result = await flows.call_tool("job", {"tag": tag, "slow": 0.0})
                results[tag] = result.content[0].text  # type: ignore[union-attr]

            async with anyio.create_task_group() as group:
                for i in range(8):
                    group.start_soon(run_job, on_a if i % 2 else on_b, f"job{i}")
                await anyio.sleep(0.3)
                holder = sqlite3.connect(db, isolation_level=None)
                holder.execute("BEGIN IMMEDIATE")  # another process's long write transaction
                try:
                    for i in range(8, 12):
                        group.start_soon(run_job, on_a if i % 2 else on_b, f"job{i}")
                    async with Client(urls[0], extensions=[TasksClient(_never)], elicitation_callback=_never) as raw:
                        with pytest.raises(MCPError) as caught:
                            await raw.session.call_tool("job", {"tag": "refused", "slow": 0.0}, allow_claimed=True)
                    assert caught.value.error.data == {
                        "reason": "store_unavailable",
                        "store": "sqlite",
                        "retryable": True,
                    }
                    assert "locked" not in caught.value.error.message
                finally:
                    holder.execute("COMMIT")
                    holder.close()
        logs = "".join(s.log() for s in servers.values())
    assert results == {f"job{i}": f"job{i}:done" for i in range(12)}, logs[-6000:]
    # One task per call (each tag's steps ran under one idempotency key), every one completed.
    # A step whose checkpoint could not be written while the lock was held ran again, under
    # the same key. (The refused call's record may still land once the lock goes: a resend with
    # an idempotency key, as FlowClient's, would find it; the raw client sent none.)
    keys: dict[str, set[str]] = defaultdict(set)
    for entry in audit(journal):
        keys[entry["tag"]].add(entry["key"].rsplit(":", 1)[0])
    assert sorted(tag for tag in keys if tag != "refused") == sorted(f"job{i}" for i in range(12))
    assert all(len(found) == 1 for found in keys.values()), keys
    assert logs.count("Traceback") == 0, logs[-4000:]


@pytest.mark.needs_postgres
async def test_a_postgres_pool_answers_within_a_second_of_the_store_returning(tmp_path: Path) -> None:
    """psycopg's pool retries a lost connection after 1, 2, 4, 8 s: left alone, a store back
    after an 8 s outage would wait for the pool's next attempt. The store probes and swaps in
    a fresh pool instead, so the first call after the return succeeds at once."""
    from mrtr import StoreUnavailable
    from mrtr.stores import PostgresStore

    with _Store("postgres", tmp_path) as pg:
        store = PostgresStore(pg.proc.url)
        try:
            await store.open()
            assert await store.load("absent", time.time()) is None
            pg.proc.kill()
            failures = 0
            stop = time.monotonic() + 8.0  # the pool's own next attempt would come at about 15 s
            while time.monotonic() < stop:
                try:
                    await store.load("absent", time.time())
                except StoreUnavailable:
                    failures += 1
                await anyio.sleep(0.1)
            assert failures > 0, "the store kept answering while PostgreSQL was killed"
            pg.proc.start()
            back = time.monotonic()
            while True:
                try:
                    assert await store.load("absent", time.time()) is None
                    break
                except StoreUnavailable:
                    assert time.monotonic() - back < 10, "the pool did not reconnect within 10 s"
                    await anyio.sleep(0.05)
            assert time.monotonic() - back < 1.5, f"first success {time.monotonic() - back:.1f} s after the return"
        finally:
            await store.close()
