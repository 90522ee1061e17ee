"""Where durable tasks live: one small contract, three real implementations.

A store keeps one `TaskRecord` per task and changes it only through `save`, an atomic
compare-and-set on `version`. Every state transition (claim a lease, record progress,
accept answers, cancel) is read -> change -> `save`, retried on conflict, so two
instances never both win a transition and a crash never leaves half a record: each
write replaces the whole record in one atomic operation of the backing database.

`SQLiteStore` (a file, or `":memory:"` for tests) is the embedded default;
`RedisStore` and `PostgresStore` serve fleets (their drivers are optional extras). What a
store can do besides keeping tasks (its own clock, the replay guard's ledger, being shared
by a fleet) is named in `mrtr.stores._abilities` and asked for with its type guards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mrtr._wire import TERMINAL, TaskStatus
from mrtr.stores._base import WAITS, TaskExists, TaskPage, TaskQuery, TaskRecord, TaskStore, round_verdict, waits_for
from mrtr.stores._sealed import RecordSeal, RecordSealed, Resealed, SealedStore, reseal

if TYPE_CHECKING:  # imported lazily below; named here for type checkers and the API reference
    from mrtr.stores._postgres import PostgresStore
    from mrtr.stores._redis import RedisStore
    from mrtr.stores._sqlite import SQLiteStore


def open_store(url: str, *, namespace: str | None = None) -> TaskStore:
    """A store from a URL, for configuration by environment (e.g. `MRTR_STORE`).

    `sqlite:///PATH` (or `sqlite:///:memory:`), `redis://...` / `rediss://...`, a Redis Cluster
    `redis+cluster://host:port[,host:port...]` / `rediss+cluster://...` (one seed node is
    enough), and `postgresql://...` / `postgres://...`. `namespace` becomes the Redis key prefix or the
    PostgreSQL table, so several services can share one database.
    """
    if url.startswith("sqlite:///"):
        from mrtr.stores._sqlite import SQLiteStore

        return SQLiteStore(url.removeprefix("sqlite:///"))
    if url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
        from mrtr.stores._redis import RedisStore

        return RedisStore(url, prefix=f"{namespace}:" if namespace else "mrtr:")
    if url.startswith(("postgresql://", "postgres://")):
        from mrtr.stores._postgres import PostgresStore

        return PostgresStore(url, table=namespace or "mrtr_tasks")
    raise ValueError(
        f"unknown task store URL {url!r}: expected sqlite:///PATH, redis://..., redis+cluster://... or postgresql://..."
    )


def __getattr__(name: str) -> Any:
    # Backends import their drivers lazily so `import mrtr` never needs redis or psycopg.
    if name == "SQLiteStore":
        from mrtr.stores._sqlite import SQLiteStore

        return SQLiteStore
    if name == "RedisStore":
        from mrtr.stores._redis import RedisStore

        return RedisStore
    if name == "PostgresStore":
        from mrtr.stores._postgres import PostgresStore

        return PostgresStore
    raise AttributeError(name)


__all__ = [
    "TERMINAL",
    "PostgresStore",
    "RecordSeal",
    "RecordSealed",
    "Resealed",
    "SealedStore",
    "reseal",
    "RedisStore",
    "SQLiteStore",
    "TaskExists",
    "TaskPage",
    "TaskQuery",
    "TaskRecord",
    "TaskStatus",
    "TaskStore",
    "WAITS",
    "open_store",
    "round_verdict",
    "waits_for",
]
