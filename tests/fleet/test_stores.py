"""The `TaskStore` contract, one set of tests run against every backend.

SQLite runs in memory and on a temp file; Redis and PostgreSQL run against the local
services (127.0.0.1:6379, 127.0.0.1:5432) under a random prefix / table that is removed
afterwards. A missing service skips its tests, except under CI, where it fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from mrtr._wire import Wait
from mrtr.stores import WAITS, TaskExists, TaskPage, TaskQuery, TaskRecord, TaskStore, waits_for
from mrtr.stores._sqlite import SQLiteStore
from tests.support.markers import backends
from tests.support.storekit import drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.in_process]  # unless marked otherwise

REDIS_URL = os.environ.get("MRTR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get("MRTR_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = backends("sqlite-memory", "sqlite-file", "redis", "redis-cluster", "postgres")
SHARED_BACKENDS = backends("sqlite-file", "redis", "redis-cluster", "postgres")  # those several store objects can share

Factory = Callable[[], Awaitable[TaskStore]]
_reachable: dict[str, str | None] = {}  # backend -> None if reachable, else why not (probed once)


async def _probe(backend: str) -> str | None:
    return await service_problem(backend)


async def _require(backend: str) -> None:
    if backend not in _reachable:
        _reachable[backend] = await _probe(backend)
    why = _reachable[backend]
    if why is None:
        return
    where = REDIS_URL if backend == "redis" else POSTGRES_DSN
    message = f"{backend} at {where} unreachable ({why})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so the {backend} store must be tested", pytrace=False)
    pytest.skip(message)


@pytest.fixture(params=BACKENDS)
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """A factory of store objects that all share one fresh, private backend."""
    backend: str = request.param
    if backend in ("redis", "postgres"):
        await _require(backend)
    cluster_url = request.getfixturevalue("redis_cluster") if backend == "redis-cluster" else None
    token = uuid.uuid4().hex[:16]
    stores: list[TaskStore] = []

    async def make() -> TaskStore:
        store: TaskStore
        if backend == "sqlite-memory":
            assert not stores, "an in-memory SQLite database is private to one store object"
            store = SQLiteStore(":memory:")
        elif backend == "sqlite-file":
            store = SQLiteStore(str(tmp_path / "tasks.db"))
        elif backend == "redis":
            from mrtr.stores._redis import RedisStore

            store = RedisStore(REDIS_URL, prefix=f"mrtr-test-{token}:")
        elif backend == "redis-cluster":
            from mrtr.stores import open_store

            assert cluster_url is not None
            store = open_store(cluster_url, namespace=f"mrtr-test-{token}")
        else:
            from mrtr.stores._postgres import PostgresStore

            store = await PostgresStore(POSTGRES_DSN, table=f"mrtr_test_{token}", max_size=4).open()
        stores.append(store)
        return store

    make.backend = backend  # type: ignore[attr-defined]
    make.token = token  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for store in stores:
            await store.close()
        if backend == "redis":
            await drop_namespace("redis", f"mrtr-test-{token}")
        elif backend == "redis-cluster":
            await drop_namespace("redis-cluster", f"mrtr-test-{token}", url=cluster_url)
        elif backend == "postgres" and stores:
            await drop_namespace("postgres", f"mrtr_test_{token}")


@pytest.fixture
async def store(make_store: Factory) -> TaskStore:
    return await make_store()


def rec(task_id: str | None = None, **changes: Any) -> TaskRecord:
    fields: dict[str, Any] = {
        "task_id": task_id or uuid.uuid4().hex,
        "flow": "book_trip",
        "arguments": {"city": "Oslo"},
        "capabilities": {},
        "status": "working",
        "created_at": time.time(),
        "updated_at": time.time(),
        "ttl_ms": None,
        "poll_interval_ms": 500,
        "journal": "j0",
    }
    fields.update(changes)
    return TaskRecord(**fields)


async def test_round_trip_keeps_every_field(store: TaskStore) -> None:
    now = time.time()
    original = TaskRecord(
        task_id="task-ü/1:x",
        flow="book_trip",
        arguments={"city": "Zürich", "nested": {"b": [1, 2.5, None, True], "a": "x\u0000y"}, "z": 1, "a": 2},
        capabilities={"elicitation": {"form": {}}, "sampling": {}},
        status="input_required",
        created_at=now - 1.234567891,
        updated_at=now + 0.000001,
        ttl_ms=3_600_000,
        poll_interval_ms=750,
        journal="eyJhIjoxfQ==" * 50,
        status_message="waiting for the user",
        input_requests={"confirm": {"method": "elicitation/create", "params": {"message": "Sure?"}}},
        responses={"earlier": {"action": "accept", "content": {"ok": True}}},
        result={"content": [{"type": "text", "text": "done"}]},
        error={"code": -32000, "message": "nope"},
        cancel_requested=True,
        lease_owner="worker-7",
        lease_until=now + 12.345678901234,
        version=3,
        waiting=[{"kind": "event", "name": "ci", "until": now + 60}, {"kind": "timer", "name": None, "until": now}],
        inbox=[{"id": "e1", "name": "note", "data": {"ü": [1, None]}, "at": now}],
        event_ids=["e0", "e1"],
    )
    await store.create(original.copy())
    loaded = await store.load(original.task_id, now)
    assert loaded == original
    assert loaded is not None and list(loaded.arguments) == list(original.arguments)  # key order kept
    assert await store.load("no-such-task", now) is None


async def test_fields_from_a_newer_server_survive_a_rewrite_by_this_one(store: TaskStore) -> None:
    """Rolling upgrades: an older instance that rewrites a newer instance's record keeps what it cannot read."""
    newer = json.loads(rec(status="working").to_json()) | {"priority": "high", "trace": {"id": 7}}
    await store.create(TaskRecord.from_json(json.dumps(newer)))
    loaded = await store.load(newer["task_id"], time.time())
    assert loaded is not None and loaded.extras == {"priority": "high", "trace": {"id": 7}}
    assert await store.save(loaded.copy(status="completed"))
    again = await store.load(newer["task_id"], time.time())
    assert again is not None and again.status == "completed"
    assert json.loads(again.to_json())["priority"] == "high"


async def test_create_rejects_a_taken_id(store: TaskStore) -> None:
    first = rec("t1", journal="first")
    await store.create(first)
    with pytest.raises(TaskExists):
        await store.create(rec("t1", journal="second"))
    assert await store.load("t1", time.time()) == first


async def test_two_sqlite_stores_opening_a_new_file_together_both_work(tmp_path: Path) -> None:
    """Two connections that open a new file together (WAL set-up) used to get "database is locked"
    at once, without SQLite's busy handler (about one time in eight here); now they wait."""
    for n in range(40):
        path = str(tmp_path / f"new-{n}.db")
        stores = [SQLiteStore(path), SQLiteStore(path)]
        try:
            creating = [stores[i % 2].create(rec("t0", journal=f"creator {i}")) for i in range(4)]
            outcomes = await asyncio.gather(*creating, return_exceptions=True)
        finally:
            for store in stores:
                await store.close()
        assert outcomes.count(None) == 1 and all(isinstance(o, TaskExists) for o in outcomes if o), outcomes


async def test_concurrent_creates_exactly_one_wins(make_store: Factory) -> None:
    stores = [await make_store()]
    if make_store.backend != "sqlite-memory":  # type: ignore[attr-defined]
        stores.append(await make_store())
    for i in range(10):
        attempts = [stores[n % len(stores)].create(rec(f"t{i}", journal=f"creator {n}")) for n in range(4)]
        outcomes = await asyncio.gather(*attempts, return_exceptions=True)
        assert outcomes.count(None) == 1, outcomes
        assert all(isinstance(o, TaskExists) for o in outcomes if o is not None), outcomes
        stored = await stores[0].load(f"t{i}", time.time())
        assert stored is not None and stored.journal == f"creator {outcomes.index(None)}"


async def test_create_may_reuse_an_expired_id(store: TaskStore) -> None:
    await store.create(rec("t1", created_at=time.time() - 10, ttl_ms=1000, journal="old"))
    fresh = rec("t1", ttl_ms=60_000, journal="new")
    await store.create(fresh)
    assert await store.load("t1", time.time()) == fresh
    assert await store.claimable(time.time(), 10) == ["t1"]


async def test_save_is_compare_and_set(store: TaskStore) -> None:
    await store.create(rec("t1"))
    now = time.time()
    mine = await store.load("t1", now)
    stale = await store.load("t1", now)
    assert mine is not None and stale is not None

    mine.journal, mine.status = "j1", "input_required"
    assert await store.save(mine)
    assert mine.version == 1
    assert await store.load("t1", now) == mine

    stale.journal = "lost update"
    assert not await store.save(stale)
    assert stale.version == 0
    assert await store.load("t1", now) == mine

    assert await store.save(mine) and mine.version == 2
    assert not await store.save(rec("unknown"))
    assert await store.load("unknown", now) is None


async def test_concurrent_savers_exactly_one_wins(make_store: Factory) -> None:
    # Two store objects where the backend allows it: the race then crosses connections.
    stores = [await make_store()]
    if make_store.backend != "sqlite-memory":  # type: ignore[attr-defined]
        stores.append(await make_store())
    await stores[0].create(rec("t1"))
    for round_ in range(25):
        copies = [await stores[i % len(stores)].load("t1", time.time()) for i in range(4)]
        assert all(c is not None and c.version == round_ for c in copies)
        for i, c in enumerate(copies):
            c.journal = f"round {round_} writer {i}"  # type: ignore[union-attr]
        won = await asyncio.gather(*(stores[i % len(stores)].save(c) for i, c in enumerate(copies)))  # type: ignore[arg-type]
        assert won.count(True) == 1, won
        winner = copies[won.index(True)]
        assert await stores[-1].load("t1", time.time()) == winner
        assert winner is not None and winner.version == round_ + 1


async def test_claimable_lists_only_working_tasks_whose_lease_ran_out(store: TaskStore) -> None:
    now = time.time()
    await store.create(rec("never-leased"))
    await store.create(rec("lease-lapsed", lease_owner="w", lease_until=now - 1))
    await store.create(rec("lease-held", lease_owner="w", lease_until=now + 30))
    await store.create(rec("lease-ends-now", lease_owner="w", lease_until=now))
    await store.create(rec("waiting", status="input_required"))
    for status in ("completed", "failed", "cancelled"):
        await store.create(rec(status, status=status))
    await store.create(rec("expired", created_at=now - 10, ttl_ms=5000))
    await store.create(rec("expires-later", ttl_ms=60_000))

    expected = {"never-leased", "lease-lapsed", "expires-later"}
    assert set(await store.claimable(now, 100)) == expected
    assert len(await store.claimable(now, 2)) == 2
    assert set(await store.claimable(now, 2)) <= expected
    assert await store.claimable(now, 0) == []
    # `expires-later` drops out once the caller's clock passes its TTL.
    later = {"never-leased", "lease-lapsed", "lease-held", "lease-ends-now"}
    assert set(await store.claimable(now + 120, 100)) == later

    # Saves move records in and out of the claimable set.
    held = await store.load("lease-held", now)
    assert held is not None
    held.status = "completed"
    assert await store.save(held)
    waiting = await store.load("waiting", now)
    assert waiting is not None
    waiting.status = "working"
    assert await store.save(waiting)
    lapsed = await store.load("lease-lapsed", now)
    assert lapsed is not None
    lapsed.lease_until = now + 30
    assert await store.save(lapsed)
    assert set(await store.claimable(now, 100)) == {"never-leased", "waiting", "expires-later"}


async def test_next_wake_is_the_earliest_future_wake_time_of_working_tasks(store: TaskStore) -> None:
    """The due-time index of durable waits: a parked task's wake time is its `lease_until`."""
    now = time.time()
    assert await store.next_wake(now) is None
    await store.create(rec("lapsed", lease_until=now - 5))
    await store.create(rec("asking", status="input_required", lease_until=now + 1))
    await store.create(rec("done", status="completed", lease_until=now + 2))
    assert await store.next_wake(now) is None, "only working tasks with a future wake time count"
    await store.create(rec("sleeps-long", lease_until=now + 600, waiting=[{"kind": "timer", "until": now + 600}]))
    await store.create(rec("sleeps-short", lease_until=now + 3, waiting=[{"kind": "timer", "until": now + 3}]))
    assert await store.next_wake(now) == pytest.approx(now + 3)
    assert await store.next_wake(now + 3.5) == pytest.approx(now + 600)
    short = await store.load("sleeps-short", now)
    assert short is not None
    short.status = "completed"
    assert await store.save(short)
    assert await store.next_wake(now) == pytest.approx(now + 600)
    assert "sleeps-long" not in await store.claimable(now, 100)
    assert "sleeps-long" in await store.claimable(now + 601, 100)


async def test_list_tasks_filters_searches_and_pages_newest_first(store: TaskStore) -> None:
    """The admin interface the console and `mrtr tasks` read through (on every backend)."""
    now = time.time()
    made = []
    for i in range(23):
        status = ("working", "input_required", "completed", "failed", "cancelled")[i % 5]
        record = rec(f"t{i:02d}-{uuid.uuid4().hex[:6]}", status=status, flow="a" if i % 2 else "b", created_at=now - i)
        await store.create(record)
        made.append(record)
    await store.create(rec("gone", created_at=now, ttl_ms=1))  # expired: never listed
    newest_first = [r.task_id for r in made]

    first = await store.list_tasks(TaskQuery(limit=10), now + 0.5)
    assert [r.task_id for r in first.records] == newest_first[:10] and first.next_cursor
    second = await store.list_tasks(TaskQuery(limit=10, cursor=first.next_cursor), now + 0.5)
    third = await store.list_tasks(TaskQuery(limit=10, cursor=second.next_cursor), now + 0.5)
    assert [r.task_id for r in second.records + third.records] == newest_first[10:]
    assert third.next_cursor is None
    assert first.records[0] == made[0], "whole records, version included"

    failed_a = await store.list_tasks(TaskQuery(statuses=("failed",), flow="a"), now + 0.5)
    assert [r.task_id for r in failed_a.records] == [r.task_id for r in made if r.status == "failed" and r.flow == "a"]
    asking_or_done = await store.list_tasks(TaskQuery(statuses=("input_required", "completed"), limit=5), now + 0.5)
    expected = [r.task_id for r in made if r.status in ("input_required", "completed")]
    assert [r.task_id for r in asking_or_done.records] == expected[:5]
    rest = await store.list_tasks(
        TaskQuery(statuses=("input_required", "completed"), limit=50, cursor=asking_or_done.next_cursor), now + 0.5
    )
    assert [r.task_id for r in rest.records] == expected[5:]

    found = await store.list_tasks(TaskQuery(id_prefix="t07-"), now + 0.5)
    assert [r.task_id for r in found.records] == [newest_first[7]]
    assert (await store.list_tasks(TaskQuery(id_prefix="nope"), now + 0.5)).records == []

    # A status change moves a task between the status filters.
    moved = await store.load(newest_first[0], now)
    assert moved is not None and moved.status == "working"
    moved.status = "completed"
    assert await store.save(moved)
    working = await store.list_tasks(TaskQuery(statuses=("working",)), now + 0.5)
    assert newest_first[0] not in [r.task_id for r in working.records]
    done = await store.list_tasks(TaskQuery(statuses=("completed",)), now + 0.5)
    assert done.records[0].task_id == newest_first[0]

    counts = await store.count_by_status(now + 0.5)
    assert counts == {"working": 4, "input_required": 5, "completed": 6, "failed": 4, "cancelled": 4}
    assert {"a", "b"} <= set(await store.flows(now)) <= {"a", "b", "book_trip"}  # an expired task's flow may linger
    with pytest.raises(ValueError):
        await store.list_tasks(TaskQuery(cursor="not-a-cursor"), now)


async def test_list_tasks_filters_by_what_a_task_waits_for_and_its_age(store: TaskStore) -> None:
    """`TaskQuery.waiting` and `created_before`, on every backend, agree with `waits_for`."""
    now = time.time()
    timer: Wait = {"kind": "timer", "name": None, "until": now + 60}
    event: Wait = {"kind": "event", "name": "approved", "until": None}
    callback: Wait = {"kind": "event", "name": "ci", "until": None, "via": "callback"}
    shapes: list[tuple[str, dict[str, Any]]] = [
        ("asks", {"status": "input_required"}),
        ("sleeps", {"waiting": [timer]}),
        ("listens", {"waiting": [event]}),
        ("calls-back", {"waiting": [callback]}),
        ("both", {"waiting": [timer, event]}),
        ("runs", {}),
        ("done", {"status": "completed"}),
        # Arguments that look like a wait are not one.
        ("decoy", {"arguments": {"waiting": [{"kind": "timer", "via": "callback"}], "kind": "event"}}),
    ]
    made: list[TaskRecord] = []
    for age, (name, changes) in enumerate(shapes * 2):
        old = age >= len(shapes)
        record = rec(f"{name}-{'old' if old else 'new'}", created_at=now - (86400 * 2 if old else 0) - age, **changes)
        await store.create(record)
        made.append(record)

    def ids(page: TaskPage) -> list[str]:
        return [r.task_id for r in page.records]

    for wait in WAITS:
        page = await store.list_tasks(TaskQuery(waiting=wait), now + 0.5)
        assert ids(page) == [r.task_id for r in made if wait in waits_for(r)], wait
    assert ids(await store.list_tasks(TaskQuery(waiting="timer"), now)) == [
        "sleeps-new",
        "both-new",
        "sleeps-old",
        "both-old",
    ]
    assert ids(await store.list_tasks(TaskQuery(waiting="event"), now)) == [
        "listens-new",
        "both-new",
        "listens-old",
        "both-old",
    ]
    assert ids(await store.list_tasks(TaskQuery(waiting="callback"), now)) == ["calls-back-new", "calls-back-old"]
    assert ids(await store.list_tasks(TaskQuery(waiting="nothing"), now)) == [
        "runs-new",
        "decoy-new",
        "runs-old",
        "decoy-old",
    ]
    old = await store.list_tasks(TaskQuery(created_before=now - 86400), now)
    assert ids(old) == [r.task_id for r in made if r.task_id.endswith("-old")]
    asking_old = await store.list_tasks(TaskQuery(waiting="input", created_before=now - 86400), now)
    assert ids(asking_old) == ["asks-old"]
    assert (await store.list_tasks(TaskQuery(waiting="input", statuses=("working",)), now)).records == []
    paged = await store.list_tasks(TaskQuery(waiting="nothing", created_before=now - 6, limit=1), now)
    rest = await store.list_tasks(
        TaskQuery(waiting="nothing", created_before=now - 6, limit=10, cursor=paged.next_cursor), now
    )
    assert ids(paged) + ids(rest) == ["decoy-new", "runs-old", "decoy-old"]
    searched = await store.list_tasks(TaskQuery(id_prefix="sleeps", waiting="timer", created_before=now - 86400), now)
    assert ids(searched) == ["sleeps-old"]
    with pytest.raises(ValueError):
        await store.list_tasks(TaskQuery(waiting="tuesday"), now)


async def test_ttl_hides_expired_records_and_blocks_saves(store: TaskStore) -> None:
    r = rec("t1", ttl_ms=60_000)
    await store.create(r)
    assert r.expires_at is not None
    assert await store.load("t1", r.expires_at - 0.001) == r
    assert await store.load("t1", r.expires_at) is None  # expires_at <= now is expired

    # `save` has no `now`: it goes by the wall clock, so let a short TTL really run out.
    short = rec("t2", ttl_ms=100)
    await store.create(short)
    assert short.expires_at is not None
    await asyncio.sleep(max(0.0, short.expires_at - time.time()) + 0.02)
    assert await store.load("t2", time.time()) is None
    assert not await store.save(short)

    stale = rec("t3", created_at=time.time() - 10, ttl_ms=5000)
    await store.create(stale)
    assert await store.load("t3", time.time()) is None
    assert not await store.save(stale)


async def test_load_many_reads_each_id_in_order_as_load_does(store: TaskStore) -> None:
    from mrtr.stores._abilities import load_many

    live = [rec(f"many{i}") for i in range(5)]
    for record in live:
        await store.create(record)
    gone = rec("many-gone", ttl_ms=60_000)
    await store.create(gone)
    assert gone.expires_at is not None
    now = gone.expires_at + 1  # past its TTL, like `load`'s `now`
    ids = ["many3", "absent", "many0", "many-gone", "many3", "many4"]
    found = await load_many(store, ids, now)
    assert found == [await store.load(task_id, now) for task_id in ids]
    assert [r.task_id if r else None for r in found] == ["many3", None, "many0", None, "many3", "many4"]
    assert await load_many(store, [], now) == []


async def test_purge_expired_deletes_and_counts(store: TaskStore) -> None:
    now = time.time()
    for i in range(3):
        await store.create(rec(f"short-{i}", created_at=now, ttl_ms=1000))
    await store.create(rec("already-gone", created_at=now - 10, ttl_ms=1000))
    await store.create(rec("long", created_at=now, ttl_ms=600_000, status="input_required"))
    await store.create(rec("forever"))

    assert await store.purge_expired(now) == 1
    assert await store.purge_expired(now + 5) == 3
    assert await store.purge_expired(now + 5) == 0
    for i in range(3):
        assert await store.load(f"short-{i}", now) is None  # deleted, not merely hidden
    assert await store.load("long", now) is not None
    assert await store.claimable(now, 10) == ["forever"]
    assert await store.purge_expired(now + 1e6) == 1
    assert await store.load("forever", now + 1e6) is not None


async def test_no_ttl_never_expires(store: TaskStore) -> None:
    r = rec("t1", created_at=0.0, ttl_ms=None)
    await store.create(r)
    far = time.time() + 1e9
    assert await store.load("t1", far) == r
    assert await store.claimable(far, 10) == ["t1"]
    assert await store.purge_expired(far) == 0
    assert await store.save(r)


@pytest.mark.parametrize("make_store", SHARED_BACKENDS, indirect=True)
async def test_two_store_objects_share_one_backend(make_store: Factory) -> None:
    a = await make_store()
    b = await make_store()
    now = time.time()
    await a.create(rec("t1"))
    with pytest.raises(TaskExists):
        await b.create(rec("t1"))
    seen_by_b = await b.load("t1", now)
    seen_by_a = await a.load("t1", now)
    assert seen_by_b is not None and seen_by_a is not None
    seen_by_b.status = "input_required"
    assert await b.save(seen_by_b)
    assert await a.load("t1", now) == seen_by_b
    assert not await a.save(seen_by_a)  # stale across connections
    assert await a.claimable(now, 10) == []
    await b.create(rec("t2", created_at=now - 10, ttl_ms=1))
    assert await a.purge_expired(now) == 1


async def test_failed_or_cancelled_saves_leave_a_whole_record(store: TaskStore) -> None:
    await store.create(rec("t1"))
    current = await store.load("t1", time.time())
    assert current is not None

    broken = current.copy(arguments={"unencodable": object()})
    with pytest.raises(TypeError):
        await store.save(broken)
    assert await store.load("t1", time.time()) == current

    # Cancel saves at every point a few event-loop steps in: each must land whole or not at all.
    for steps in range(12):
        before = await store.load("t1", time.time())
        assert before is not None
        attempt = before.copy(journal=f"attempt {steps}", status_message="x" * steps)
        task = asyncio.ensure_future(store.save(attempt))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)  # a write already handed to the database may still finish
        after = await store.load("t1", time.time())
        assert after is not None
        if after.version == before.version:
            assert after == before
        else:
            assert after == attempt.copy(version=before.version + 1)
    latest = await store.load("t1", time.time())
    assert latest is not None and await store.save(latest)  # the store still works


_SQLITE_CRASH = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE mrtr_tasks SET data = '{\\"half\\": 1}', version = version + 1")
os._exit(9)  # die inside the transaction
"""


# Only where another process can hold a write transaction open; Redis runs each Lua script
# whole (and every script here checks before it writes), so it has no mid-write state to kill.
@pytest.mark.spawns  # another process holds the write transaction
@pytest.mark.parametrize("make_store", backends("sqlite-file", "postgres"), indirect=True)
async def test_crash_mid_transaction_leaves_the_old_record(make_store: Factory, tmp_path: Path) -> None:
    backend = make_store.backend  # type: ignore[attr-defined]
    store = await make_store()
    original = rec("t1")
    await store.create(original)
    if backend == "sqlite-file":
        proc = subprocess.run([sys.executable, "-c", _SQLITE_CRASH, str(tmp_path / "tasks.db")], check=False)
        assert proc.returncode == 9
    else:
        import psycopg

        table = f"mrtr_test_{make_store.token}"  # type: ignore[attr-defined]
        victim = await psycopg.AsyncConnection.connect(POSTGRES_DSN)
        await victim.execute(f"UPDATE {table} SET data = 'half a record', version = version + 1")
        async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as killer:
            await killer.execute("SELECT pg_terminate_backend(%s)", [victim.info.backend_pid])
        with pytest.raises(psycopg.OperationalError):
            await victim.execute("COMMIT")
        await victim.close()
    assert await store.load("t1", time.time()) == original
    assert await store.save(original) and original.version == 1


@pytest.mark.parametrize("make_store", backends("redis", "redis-cluster"), indirect=True)
async def test_redis_expires_keys_and_drops_them_from_the_claimable_index(make_store: Factory) -> None:
    store: Any = await make_store()
    redis = store._redis

    def key(task_id: str) -> str:
        return str(store.shard_of(task_id).records + task_id)

    live = rec("live", ttl_ms=60_000)
    await store.create(live)
    assert live.expires_at is not None
    assert await redis.pexpiretime(key("live")) == math.ceil(live.expires_at * 1000)
    await store.create(rec("forever"))
    assert await redis.pexpiretime(key("forever")) == -1

    gone = rec("gone", created_at=time.time() - 10, ttl_ms=1000)
    await store.create(gone)  # its expiry is already past: Redis drops the key at once
    assert not await redis.exists(key("gone"))
    # A caller whose clock lags still must not get an id whose record Redis has dropped.
    assert set(await store.claimable(gone.created_at, 10)) == {"live", "forever"}
    assert await redis.zscore(store.shard_of("gone").claimable, "gone") is None
    assert await store.purge_expired(time.time()) == 1  # still counted, and the index emptied
    expiring = [task_id for shard in store._shards for task_id in await redis.zrange(shard.expiry, 0, -1)]
    assert expiring == ["live"]


@pytest.mark.spawns
@pytest.mark.parametrize("make_store", backends("redis-cluster"), indirect=True)
async def test_a_cluster_store_spreads_tasks_over_shards_each_write_on_one_slot(make_store: Factory) -> None:
    """Every key of a task shares its shard's hash slot; the shards' slots spread over every primary."""
    from redis.crc import key_slot

    store: Any = await make_store()
    ids = [f"t{i}" for i in range(200)]
    for task_id in ids:
        await store.create(rec(task_id, created_at=1000.0 + int(task_id[1:])))
    used = {store.shard_of(task_id).claimable for task_id in ids}
    assert len(used) == len(store._shards) == 16  # 200 ids fill every shard
    for shard in store._shards:
        slots = {
            key_slot(k.encode()) for k in (shard.records + "x", shard.claimable, shard.expiry, shard.index + "all")
        }
        assert len(slots) == 1
    owners = {store._redis.get_node_from_key(key).name for key in store.hot_keys()}
    assert len(owners) == 3  # each primary holds some of the hot index keys, none holds all
    counts = await store.count_by_status(time.time())
    assert counts["working"] == 200
    page = await store.list_tasks(TaskQuery(limit=7), time.time())
    assert [r.task_id for r in page.records] == [f"t{i}" for i in range(199, 192, -1)]
    assert len(await store.claimable(time.time(), 50)) == 50


async def test_open_store_picks_the_backend_from_the_url() -> None:
    from mrtr.stores import open_store
    from mrtr.stores._postgres import PostgresStore
    from mrtr.stores._redis import RedisStore
    from mrtr.stores._sqlite import SQLiteStore

    memory = open_store("sqlite:///:memory:")
    assert isinstance(memory, SQLiteStore)
    await memory.close()
    redis_store = open_store("redis://127.0.0.1:6379/0", namespace="svc")
    assert isinstance(redis_store, RedisStore) and not redis_store.cluster
    await redis_store.close()
    cluster_store = open_store("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", namespace="svc")  # connects lazily
    assert isinstance(cluster_store, RedisStore) and cluster_store.cluster
    await cluster_store.close()
    with pytest.raises(ValueError, match="host:port"):
        open_store("redis+cluster://127.0.0.1", namespace="svc")
    assert isinstance(open_store("postgresql://postgres@127.0.0.1:5432/postgres", namespace="svc_tasks"), PostgresStore)
    with pytest.raises(ValueError, match="unknown task store URL"):
        open_store("mysql://nope")


# -- the replay guard's ledger (mrtr.stores._abilities.RoundLedger), on every store ---------------


async def test_round_ledger_claim_fork_finish(store: Any) -> None:
    far = time.time() + 600
    assert await store.claim_round("f:1:s", "A", "w1", 10.0, far) == ("claimed", None)
    assert await store.claim_round("f:1:s", "A", "w2", 10.0, far) == ("busy", None)
    assert await store.claim_round("f:1:s", "B", "w2", 10.0, far) == ("forked", None)
    assert not await store.finish_round("f:1:s", "w2", '{"k":"v"}')  # not the owner
    assert await store.renew_round("f:1:s", "w1", 10.0)
    assert await store.finish_round("f:1:s", "w1", '{"k":"v","v":1}')
    assert not await store.finish_round("f:1:s", "w1", '{"k":"v","v":2}')  # recorded once
    assert await store.claim_round("f:1:s", "A", "w2", 10.0, far) == ("done", '{"k":"v","v":1}')
    assert await store.claim_round("f:1:s", "B", "w2", 10.0, far) == ("forked", None)
    assert not await store.renew_round("f:1:s", "w1", 10.0)  # finished rounds have no lease
    assert await store.claim_round("f:2:s", "B", "w2", 10.0, far) == ("claimed", None)  # another round


async def test_round_ledger_lapsed_lease_is_taken_over_only_by_the_same_answers(store: Any) -> None:
    far = time.time() + 600
    assert (await store.claim_round("r", "A", "dead", 0.2, far))[0] == "claimed"
    await asyncio.sleep(0.5)
    assert await store.claim_round("r", "B", "w2", 10.0, far) == ("forked", None)
    assert await store.claim_round("r", "A", "w2", 10.0, far) == ("claimed", None)
    assert not await store.finish_round("r", "dead", "late")  # the dead owner lost it
    assert await store.finish_round("r", "w2", "ok")
    assert await store.claim_round("r", "A", "w3", 10.0, far) == ("done", "ok")


@pytest.mark.parametrize("make_store", backends("redis", "postgres"), indirect=True)
async def test_round_progress_is_written_by_the_owner_only_and_survives_a_takeover(make_store: Factory) -> None:
    """A first round's checkpoint (`mrtr._host.identity`): the owner writes it, a takeover reads it."""
    a, b = await make_store(), await make_store()
    far = time.time() + 600
    assert await a.round_progress("p") is None  # type: ignore[attr-defined]
    assert (await a.claim_round("p", "A", "dead", 0.2, far))[0] == "claimed"
    assert not await b.save_round_progress("p", "other", "x")  # type: ignore[attr-defined]
    assert await a.save_round_progress("p", "dead", "step 1")  # type: ignore[attr-defined]
    assert await b.round_progress("p") == "step 1"  # type: ignore[attr-defined]
    await asyncio.sleep(0.5)
    assert await b.claim_round("p", "A", "w2", 10.0, far) == ("claimed", None)  # the lease lapsed
    assert await b.round_progress("p") == "step 1"  # type: ignore[attr-defined]
    assert not await a.save_round_progress("p", "dead", "late")  # type: ignore[attr-defined]
    assert await b.save_round_progress("p", "w2", "step 2")  # type: ignore[attr-defined]
    assert await b.finish_round("p", "w2", "ok")
    assert not await b.save_round_progress("p", "w2", "after")  # type: ignore[attr-defined]
    assert await a.round_progress("p") == "step 2"  # type: ignore[attr-defined]


@pytest.mark.parametrize("make_store", backends("redis", "postgres"), indirect=True)
async def test_an_expired_rounds_progress_is_not_resumed_by_a_new_call_of_the_same_id(make_store: Factory) -> None:
    """The same identity after its window (a principal's same request a minute later) is a new
    call: it must start with no progress, not resume the old call's journal."""
    store = await make_store()
    assert (await store.claim_round("q", "A", "first", 10.0, time.time() + 0.3))[0] == "claimed"
    assert await store.save_round_progress("q", "first", "old call, step 1")  # type: ignore[attr-defined]
    await asyncio.sleep(0.6)  # the row expired (Redis drops the key; PostgreSQL keeps it until a purge)
    assert await store.claim_round("q", "A", "second", 10.0, time.time() + 60) == ("claimed", None)
    assert await store.round_progress("q") is None  # type: ignore[attr-defined]


async def test_round_ledger_entries_expire(store: Any) -> None:
    assert (await store.claim_round("e", "A", "w1", 10.0, time.time() + 0.3))[0] == "claimed"
    await asyncio.sleep(0.6)
    assert await store.claim_round("e", "B", "w2", 10.0, time.time() + 60) == ("claimed", None)
    await store.claim_round("gone", "A", "w1", 10.0, time.time() + 0.2)
    await asyncio.sleep(0.4)
    await store.purge_rounds()
    assert await store.claim_round("gone", "B", "w1", 10.0, time.time() + 60) == ("claimed", None)


async def test_round_ledger_concurrent_claims_exactly_one_wins(make_store: Factory) -> None:
    stores: list[Any] = [await make_store()]
    if make_store.backend != "sqlite-memory":  # type: ignore[attr-defined]
        stores.append(await make_store())
    far = time.time() + 600
    for i in range(5):
        claims = [stores[n % len(stores)].claim_round(f"c{i}", "A", f"w{n}", 10.0, far) for n in range(6)]
        verdicts = [v for v, _ in await asyncio.gather(*claims)]
        assert verdicts.count("claimed") == 1 and verdicts.count("busy") == 5, verdicts
        forks = [stores[n % len(stores)].claim_round(f"d{i}", f"answers-{n}", "w", 10.0, far) for n in range(6)]
        verdicts = [v for v, _ in await asyncio.gather(*forks)]
        assert verdicts.count("claimed") == 1 and verdicts.count("forked") == 5, verdicts


async def test_round_ledger_back_rewinds_a_round_no_step_followed_and_supersedes_the_branch_left(store: Any) -> None:
    """`rewind_round` ("Back", mrtr.stores._abilities.RoundRewinding): safe re-answers only, one branch."""
    far = time.time() + 600
    assert await store.claim_round("f:1:a", "A1", "w", 10.0, far) == ("claimed", None)
    assert await store.finish_round_linked("f:1:a", "w", "o1", "f:2:b", False)
    assert await store.claim_round("f:2:b", "A2", "w", 10.0, far) == ("claimed", None)
    assert await store.rewind_round("f:1:a", "B1", "w2", 10.0, far) == ("busy", None), "round 2 still runs"
    assert await store.finish_round_linked("f:2:b", "w", "o2", "f:3:c", False)  # hands out round 3
    assert await store.rewind_round("f:1:a", "A1", "w2", 10.0, far) == ("same", None)
    assert await store.rewind_round("f:1:a", "B1", "w2", 10.0, far) == ("claimed", None)
    # the branch left behind: round 2 (finished) and round 3 (handed out, never claimed)
    assert await store.claim_round("f:2:b", "A2", "w3", 10.0, far) == ("superseded", None)
    assert await store.claim_round("f:3:c", "A3", "w3", 10.0, far) == ("superseded", None)
    assert await store.rewind_round("f:2:b", "B2", "w3", 10.0, far) == ("superseded", None)
    # the new answers: in flight under their owner, then done; a step finished in this run
    assert await store.claim_round("f:1:a", "B1", "w3", 10.0, far) == ("busy", None)
    assert not await store.finish_round_linked("f:1:a", "w", "stale", None, False), "the old owner lost it"
    assert await store.finish_round_linked("f:1:a", "w2", "o1b", "f:2:d", True)
    assert await store.claim_round("f:1:a", "B1", "w3", 10.0, far) == ("done", "o1b")
    assert await store.rewind_round("f:1:a", "C1", "w3", 10.0, far) == ("forked", None), "a step finished in it"
    assert await store.claim_round("f:1:a", "C1", "w3", 10.0, far) == ("forked", None)
    # a step in a later round of the branch forbids going Back before it, not after it
    assert await store.claim_round("f:2:d", "A2", "w", 10.0, far) == ("claimed", None)
    assert await store.finish_round_linked("f:2:d", "w", "o2", "f:3:e", False)
    assert await store.claim_round("f:3:e", "A3", "w", 10.0, far) == ("claimed", None)
    assert await store.finish_round_linked("f:3:e", "w", "o3", "f:4:g", True)
    assert await store.rewind_round("f:2:d", "B2", "w", 10.0, far) == ("forked", None)
    assert await store.claim_round("f:4:g", "A4", "w", 10.0, far) == ("claimed", None)
    assert await store.finish_round_linked("f:4:g", "w", "o4", None, False)  # a final answer
    assert await store.rewind_round("f:4:g", "B4", "w", 10.0, far) == ("claimed", None)
    assert await store.rewind_round("other:1:z", "B", "w", 10.0, far) == ("retry", None), "never claimed"


async def test_round_ledger_back_past_a_round_that_died_unfinished_is_a_fork(store: Any) -> None:
    far = time.time() + 600
    assert await store.claim_round("h:1:a", "A1", "w", 10.0, far) == ("claimed", None)
    assert await store.finish_round_linked("h:1:a", "w", "o1", "h:2:b", False)
    assert await store.claim_round("h:2:b", "A2", "dead", 0.2, far) == ("claimed", None)
    await asyncio.sleep(0.4)  # the lease lapses: whatever that run did (a step?) is unknown
    assert await store.rewind_round("h:1:a", "B1", "w", 10.0, far) == ("forked", None)


async def test_store_clock_is_close_to_this_hosts(store: Any) -> None:
    # Same host here, so the store's clock (Redis TIME, PostgreSQL clock_timestamp()) agrees closely.
    assert abs(await store.clock() - time.time()) < 1.0


@pytest.mark.parametrize("make_store", backends("sqlite-file", "redis", "postgres"), indirect=True)
async def test_tasks_stored_before_the_listing_indexes_are_listed(make_store: Factory, tmp_path: Path) -> None:
    """A store written by an mrtr without listing (old columns, no Redis indexes) lists all its tasks."""
    backend = make_store.backend  # type: ignore[attr-defined]
    token = make_store.token  # type: ignore[attr-defined]
    old = rec("legacy-1", arguments={"note": "x\u0000y", "created_at": 1}, created_at=time.time() - 5)
    if backend == "sqlite-file":
        import sqlite3

        conn = sqlite3.connect(tmp_path / "tasks.db")
        conn.execute(
            "CREATE TABLE mrtr_tasks (task_id TEXT PRIMARY KEY, version INTEGER NOT NULL, status TEXT NOT NULL,"
            " lease_until REAL NOT NULL, expires_at REAL, data TEXT NOT NULL)"
        )
        conn.execute("INSERT INTO mrtr_tasks VALUES (?, 0, ?, 0, NULL, ?)", (old.task_id, old.status, old.to_json()))
        conn.commit()
        conn.close()
    elif backend == "postgres":
        import psycopg

        async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as conn:
            await conn.execute(
                f"CREATE TABLE mrtr_test_{token} (task_id TEXT PRIMARY KEY, version BIGINT NOT NULL,"
                " status TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION,"
                " data TEXT NOT NULL)"
            )
            await conn.execute(
                f"INSERT INTO mrtr_test_{token} VALUES (%s, 0, %s, 0, NULL, %s)",
                (old.task_id, old.status, old.to_json()),
            )
    else:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL)
        await client.set(f"mrtr-test-{token}:task:{old.task_id}", old.to_json())
        await client.aclose()
    store = await make_store()
    await store.create(rec("new-1"))
    page = await store.list_tasks(TaskQuery(), time.time())
    assert [r.task_id for r in page.records] == ["new-1", "legacy-1"]
    assert page.records[1].arguments == {"note": "x\u0000y", "created_at": 1}
    only_old = await store.list_tasks(TaskQuery(flow="book_trip", statuses=("working",), id_prefix="leg"), time.time())
    assert [r.task_id for r in only_old.records] == ["legacy-1"]
