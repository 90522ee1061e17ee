"""What sealing task records at rest costs (#36), per task state change, on each store.

A task state change is one read and one compare-and-set write of the whole record
(`TaskStore.load` then `save`, what every checkpoint, answer, event and settle does). For each
store (a SQLite file, the local Redis, the local PostgreSQL) this script writes tasks whose
record looks like a working flow's (arguments, a journal of a few answers and step results,
an outstanding ask, history), then times state changes through the plain store and through
`SealedStore` (the SDK's AES-GCM codec under a 32-byte key), interleaved change by change in
rotating order so drift hits both alike. It prints median and p90 per change, the sealed
minus plain difference of medians, and the CPU cost of sealing and opening alone (no I/O),
plus the stored size of a record each way.

    python benchmarks/sealing.py [--quick] [--stores sqlite,redis,postgres] [--changes N]

Every run uses its own SQLite temp dir, Redis key prefix and PostgreSQL table, removed at the
end; an unreachable store is reported and skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import p90

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr.stores import RecordSeal, SealedStore, TaskRecord, TaskStore

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def record(task_id: str) -> TaskRecord:
    journal = Journal.start()
    for i in range(4):
        journal.answers[f"ask{i}"] = (f"Question {i} about the booking?", {"action": "accept", "content": {"v": i}})
        journal.steps[f"step{i}"] = (f"args{i}", {"id": f"plan-{i}", "rows": list(range(20))})
    now = time.time()
    return TaskRecord(
        task_id=task_id,
        flow="book_trip",
        arguments={"city": "Oslo", "nights": 3, "notes": "x" * 200},
        capabilities={"elicitation": {"form": {}}},
        status="working",
        created_at=now,
        updated_at=now,
        ttl_ms=3_600_000,
        poll_interval_ms=500,
        journal=journal_codec.encode(journal),
        input_requests={"ask4": {"method": "elicitation/create", "params": {"message": "Which room?"}}},
        history=[{"at": now, "kind": "step", "key": f"step{i}", "seconds": 0.001, "attempt": 1} for i in range(4)],
    )


async def open_store(kind: str, tag: str, tmp: Path) -> TaskStore | None:
    try:
        if kind == "sqlite":
            from mrtr.stores._sqlite import SQLiteStore

            return SQLiteStore(str(tmp / "tasks.db"))
        if kind == "redis":
            from mrtr.stores._redis import RedisStore

            store: TaskStore = RedisStore(REDIS_URL, prefix=f"mrtr-bench-seal-{tag}:")
            await store.count_by_status(time.time())
            return store
        from mrtr.stores._postgres import PostgresStore

        return await PostgresStore(POSTGRES_DSN, table=f"mrtr_bench_seal_{tag}").open()
    except Exception as exc:
        print(f"{kind}: unreachable, skipped ({type(exc).__name__}: {exc})")
        return None


async def drop(kind: str, tag: str) -> None:
    if kind == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=f"mrtr-bench-seal-{tag}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    elif kind == "postgres":
        import psycopg

        async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as conn:
            await conn.execute(f'DROP TABLE IF EXISTS "mrtr_bench_seal_{tag}", "mrtr_bench_seal_{tag}_rounds"')


async def change(store: TaskStore, task_id: str, n: int) -> float:
    started = time.perf_counter()
    current = await store.load(task_id, time.time())
    assert current is not None
    changed = current.copy(updated_at=time.time(), status_message=f"change {n}")
    assert await store.save(changed), "no other writer here"
    return time.perf_counter() - started


async def bench_store(kind: str, changes: int, seal: RecordSeal) -> None:
    tag = uuid.uuid4().hex[:10]
    with tempfile.TemporaryDirectory() as tmp:
        raw = await open_store(kind, tag, Path(tmp))
        if raw is None:
            return
        try:
            sealed = SealedStore(raw, seal)
            plain_id, sealed_id = f"plain-{tag}", f"sealed-{tag}"
            await raw.create(record(plain_id))
            await sealed.create(record(sealed_id))
            variants: list[tuple[str, TaskStore, str]] = [("plain", raw, plain_id), ("sealed", sealed, sealed_id)]
            times: dict[str, list[float]] = {"plain": [], "sealed": []}
            for n in range(changes // 10):  # warm-up
                for _, store, task_id in variants:
                    await change(store, task_id, n)
            for n in range(changes):
                for name, store, task_id in variants if n % 2 == 0 else variants[::-1]:
                    times[name].append(await change(store, task_id, n))
            plain_med, sealed_med = statistics.median(times["plain"]), statistics.median(times["sealed"])
            print(
                f"{kind:9} plain {plain_med * 1e6:8.1f} us (p90 {p90(times['plain']) * 1e6:8.1f})  "
                f"sealed {sealed_med * 1e6:8.1f} us (p90 {p90(times['sealed']) * 1e6:8.1f})  "
                f"sealing adds {(sealed_med - plain_med) * 1e6:+7.1f} us per state change "
                f"({sealed_med / plain_med:.2f}x), {changes} changes each"
            )
        finally:
            await raw.close()
            await drop(kind, tag)


def bench_cpu(seal: RecordSeal, rounds: int) -> None:
    rec = record("cpu")
    stored = seal.seal(rec)
    for _ in range(rounds // 10):
        seal.open(seal.seal(rec))
    seal_times, open_times, json_times = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        stored = seal.seal(rec)
        t1 = time.perf_counter()
        seal.open(stored)
        t2 = time.perf_counter()
        rec.to_json()
        t3 = time.perf_counter()
        seal_times.append(t1 - t0)
        open_times.append(t2 - t1)
        json_times.append(t3 - t2)
    print(
        f"cpu only: seal {statistics.median(seal_times) * 1e6:.1f} us, "
        f"open {statistics.median(open_times) * 1e6:.1f} us "
        f"(the record's own to_json: {statistics.median(json_times) * 1e6:.1f} us); stored record "
        f"{len(rec.to_json())} bytes plain, {len(stored.to_json())} bytes sealed"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few changes: checks the script runs")
    parser.add_argument("--stores", default="sqlite,redis,postgres")
    parser.add_argument("--changes", type=int, default=2000)
    args = parser.parse_args()
    changes = 50 if args.quick else args.changes
    seal = RecordSeal.from_keys([os.urandom(32)])
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    bench_cpu(seal, 200 if args.quick else 5000)
    for kind in args.stores.split(","):
        await bench_store(kind.strip(), changes, seal)


if __name__ == "__main__":
    asyncio.run(main())
