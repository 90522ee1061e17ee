"""A store's abilities are asked for with type guards (`mrtr.stores._abilities`), never probed.

Each real store class has exactly the abilities it implements (SQLite is one host's store;
Redis and PostgreSQL are shared), a class of your own has those its class defines, and a
`SealedStore` has what the store it wraps has, forwarded unchanged. Nothing here needs a
running Redis or PostgreSQL: their stores connect on first use.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from mrtr.buses._postgres import PostgresBus
from mrtr.buses._redis import RedisBus
from mrtr.stores import RecordSeal, SealedStore, SQLiteStore, TaskRecord
from mrtr.stores._abilities import (
    has_clock,
    has_load_many,
    has_next_wake,
    is_round_ledger,
    is_shared,
    load_many,
    redacted,
)
from mrtr.stores._postgres import PostgresStore
from mrtr.stores._redis import RedisStore

pytestmark = pytest.mark.anyio

GUARDS = {
    "clock": has_clock,
    "next_wake": has_next_wake,
    "load_many": has_load_many,
    "round_ledger": is_round_ledger,
    "shared": is_shared,
}
ONE_HOST = {"clock", "next_wake", "load_many", "round_ledger"}
FLEET = ONE_HOST | {"shared"}


def abilities(store: object) -> set[str]:
    return {name for name, guard in GUARDS.items() if guard(store)}


def _record(task_id: str) -> TaskRecord:
    now = time.time()
    return TaskRecord(task_id, "chore", {}, {}, "working", now, now, 60_000, 500, "")


class _Minimal:
    """A store of your own with the task contract only: no clock, no wake index, no batches, no ledger."""

    def __init__(self) -> None:
        self.records: dict[str, TaskRecord] = {}
        self.loads = 0

    async def create(self, record: TaskRecord) -> None:
        self.records[record.task_id] = record

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        self.loads += 1
        return self.records.get(task_id)

    async def save(self, record: TaskRecord) -> bool:
        self.records[record.task_id] = record
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        return []

    async def purge_expired(self, now: float) -> int:
        return 0

    async def list_tasks(self, query: Any, now: float) -> Any:
        raise NotImplementedError

    async def count_by_status(self, now: float) -> dict[str, int]:
        return {}

    async def flows(self, now: float) -> list[str]:
        return []

    async def count_expired(self, now: float) -> int:
        return 0

    async def close(self) -> None:
        pass


class _Clocked(_Minimal):
    async def clock(self) -> float:
        return 42.0


def test_each_real_store_has_exactly_its_abilities() -> None:
    assert abilities(SQLiteStore(":memory:")) == ONE_HOST, "a SQLite file is one host's: not shared"
    assert abilities(RedisStore("redis://127.0.0.1:6379/0")) == FLEET
    assert abilities(PostgresStore("postgresql://postgres@127.0.0.1:5432/postgres")) == FLEET


def test_a_store_of_your_own_has_the_abilities_its_class_defines() -> None:
    assert abilities(_Minimal()) == set()
    assert abilities(_Clocked()) == {"clock"}
    assert abilities(object()) == set() and abilities(None) == set()
    carried = _Minimal()
    carried.clock = _Clocked().clock  # type: ignore[attr-defined]  # an attribute, not the class's method
    assert not has_clock(carried)


def test_a_sealed_store_has_what_the_store_it_wraps_has() -> None:
    seal = RecordSeal(None)
    assert abilities(SealedStore(SQLiteStore(":memory:"), seal)) == ONE_HOST
    assert abilities(SealedStore(RedisStore("redis://127.0.0.1:6379/0"), seal)) == FLEET
    assert abilities(SealedStore(PostgresStore("postgresql://postgres@127.0.0.1:5432/postgres"), seal)) == FLEET
    assert abilities(SealedStore(_Minimal(), seal)) == set()
    assert abilities(SealedStore(_Clocked(), seal)) == {"clock"}
    assert abilities(SealedStore(SealedStore(_Clocked(), seal), seal)) == {"clock"}, "through every wrapper"


async def test_a_sealed_store_forwards_each_ability_to_the_store_it_wraps() -> None:
    inner = SQLiteStore(":memory:")
    sealed = SealedStore(inner, RecordSeal(None))
    try:
        assert abs(await sealed.clock() - time.time()) < 1.0
        far = time.time() + 600
        assert await sealed.claim_round("f:1:s", "A", "w1", 10.0, far) == ("claimed", None)
        assert await sealed.renew_round("f:1:s", "w1", 10.0)
        assert await sealed.finish_round("f:1:s", "w1", "ok")
        assert await inner.claim_round("f:1:s", "A", "w2", 10.0, far) == ("done", "ok"), "recorded in the inner store"
        assert await sealed.purge_rounds() == 0
        await sealed.create(_record("t1").copy(status="working", lease_until=far))
        assert await sealed.next_wake(time.time()) == pytest.approx(far)
    finally:
        await sealed.close()
    clocked = SealedStore(_Clocked(), RecordSeal(None))
    assert await clocked.clock() == 42.0
    with pytest.raises(TypeError, match="a _Minimal, has no clock"):
        await SealedStore(_Minimal(), RecordSeal(None)).clock()


def test_a_sealed_shared_store_forwards_its_bus_and_where() -> None:
    redis = SealedStore(RedisStore("redis://:s3cret@127.0.0.1:6379/0", prefix="svc:"), RecordSeal(None))
    assert redis.where == "redis://:***@127.0.0.1:6379/0"
    bus = redis.fleet_bus()
    assert isinstance(bus, RedisBus) and bus.channel == "svc:bus"
    postgres = SealedStore(PostgresStore("postgresql://app:pw@db/app", table="svc"), RecordSeal(None))
    assert postgres.where == "postgresql://app:***@db/app"
    assert isinstance(postgres.fleet_bus(), PostgresBus)
    with pytest.raises(TypeError):
        SealedStore(SQLiteStore(":memory:"), RecordSeal(None)).fleet_bus()


def test_a_shared_store_says_where_it_is_without_its_password() -> None:
    assert RedisStore("redis://app:s3cret@cache:6379/0").where == "redis://app:***@cache:6379/0"
    assert PostgresStore("postgresql://db/app").where == "postgresql://db/app"
    assert redacted("redis://app:s3cret@cache:6379/0") == "redis://app:***@cache:6379/0"
    cluster = "redis+cluster://app:s3cret@cache-0:6379,cache-1:6379"
    assert redacted(cluster) == "redis+cluster://app:***@cache-0:6379,cache-1:6379"
    assert redacted("postgresql://db/app") == "postgresql://db/app"


async def test_load_many_batches_where_it_can_and_reads_one_by_one_where_not() -> None:
    minimal = _Minimal()
    for task_id in ("a", "b", "c"):
        await minimal.create(_record(task_id))
    found = await load_many(minimal, ["c", "x", "a"], time.time())  # type: ignore[arg-type]
    assert [None if r is None else r.task_id for r in found] == ["c", None, "a"]
    assert minimal.loads == 3, "one load per id on a store without load_many"
    sqlite = SQLiteStore(":memory:")
    try:
        await sqlite.create(_record("a"))
        found = await load_many(SealedStore(sqlite, RecordSeal(None)), ["x", "a"], time.time())
        assert [None if r is None else r.task_id for r in found] == [None, "a"]
    finally:
        await sqlite.close()
