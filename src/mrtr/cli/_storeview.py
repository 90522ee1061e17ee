"""Read-only listing of a task store, for `mrtr tasks`: one small adapter per backend.

The `TaskStore` contract has no "list" (servers never need one), so the CLI reads the
backing table or keys directly, in the layout each store documents: the `mrtr_tasks`
table (SQLite) or the namespace's table (PostgreSQL) with the record JSON in `data`,
and `<prefix>task:<id>` strings plus the `<prefix>expiry` sorted set (Redis). Writes
(cancel, purge) go through the store itself, never through these adapters.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from mrtr.cli._errors import Unreachable, UsageError
from mrtr.stores import TaskRecord, TaskStore, open_store

_REDIS_SCAN_BATCH = 500
_REDIS_MAX_KEYS = 200_000
_CONNECT_TIMEOUT = 5


class StoreView(Protocol):
    async def records(self, now: float, include_expired: bool) -> list[TaskRecord]: ...

    async def count_expired(self, now: float) -> int: ...

    async def close(self) -> None: ...


@dataclass
class OpenedStore:
    view: StoreView
    store: TaskStore
    label: str

    async def close(self) -> None:
        await self.view.close()
        await self.store.close()


def _live(record: TaskRecord, now: float, include_expired: bool) -> bool:
    expires = record.expires_at
    return include_expired or expires is None or expires > now


def _parse(version: int | None, data: str) -> TaskRecord | None:
    try:
        record = TaskRecord.from_json(data)
    except (ValueError, TypeError):
        return None  # a row this version cannot read: skip rather than fail the listing
    if version is not None:
        record.version = version
    return record


class SQLiteView:
    """Reads the file in read-only mode: listing never creates or locks a store for writing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=5)
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise UsageError(f"{self.path} is not an mrtr task store (no mrtr_tasks table)") from None
            raise UsageError(f"cannot read {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{self.path} is not an mrtr task store: {exc}") from None
        finally:
            conn.close()

    async def records(self, now: float, include_expired: bool) -> list[TaskRecord]:
        rows = await asyncio.to_thread(self._query, "SELECT version, data FROM mrtr_tasks", ())
        parsed = (_parse(version, data) for version, data in rows)
        return [r for r in parsed if r is not None and _live(r, now, include_expired)]

    async def count_expired(self, now: float) -> int:
        sql = "SELECT count(*) FROM mrtr_tasks WHERE expires_at IS NOT NULL AND expires_at <= ?"
        rows = await asyncio.to_thread(self._query, sql, (now,))
        return int(rows[0][0])

    async def close(self) -> None:
        return None


class PostgresView:
    def __init__(self, dsn: str, table: str) -> None:
        self.dsn = dsn
        self.table = table

    async def _query(self, text: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg
        from psycopg import sql

        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, connect_timeout=_CONNECT_TIMEOUT, autocommit=True)
        except psycopg.Error as exc:
            raise Unreachable(f"cannot connect to the store: {' '.join(str(exc).split())}") from None
        try:
            cur = await conn.execute(sql.SQL(text).format(t=sql.Identifier(self.table)), params)
            return await cur.fetchall()
        except psycopg.errors.UndefinedTable:
            raise UsageError(f"no task table {self.table!r} in this database (see --namespace)") from None
        finally:
            await conn.close()

    async def records(self, now: float, include_expired: bool) -> list[TaskRecord]:
        rows = await self._query("SELECT version, data FROM {t}", ())
        parsed = (_parse(version, data) for version, data in rows)
        return [r for r in parsed if r is not None and _live(r, now, include_expired)]

    async def count_expired(self, now: float) -> int:
        rows = await self._query("SELECT count(*) FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= %s", (now,))
        return int(rows[0][0])

    async def close(self) -> None:
        return None


class RedisView:
    def __init__(self, url: str, prefix: str) -> None:
        import redis.asyncio as aioredis

        self.prefix = prefix
        self._redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=_CONNECT_TIMEOUT, socket_timeout=_CONNECT_TIMEOUT
        )

    async def records(self, now: float, include_expired: bool) -> list[TaskRecord]:
        import redis

        pattern = _glob_escape(f"{self.prefix}task:") + "*"
        keys: list[str] = []
        try:
            async for key in self._redis.scan_iter(match=pattern, count=_REDIS_SCAN_BATCH):
                keys.append(key)
                if len(keys) >= _REDIS_MAX_KEYS:
                    break
            values: list[str | None] = []
            for start in range(0, len(keys), _REDIS_SCAN_BATCH):
                # decode_responses=True: str values, which redis-py's return type cannot express
                values += cast("list[str | None]", await self._redis.mget(keys[start : start + _REDIS_SCAN_BATCH]))
        except redis.RedisError as exc:
            raise Unreachable(f"cannot read the store: {exc}") from None
        parsed = (_parse(None, v) for v in values if v is not None)
        return [r for r in parsed if r is not None and _live(r, now, include_expired)]

    async def count_expired(self, now: float) -> int:
        import redis

        try:
            return int(await self._redis.zcount(f"{self.prefix}expiry", "-inf", repr(float(now))))
        except redis.RedisError as exc:
            raise Unreachable(f"cannot read the store: {exc}") from None

    async def close(self) -> None:
        await self._redis.aclose()


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def open_view(url: str, namespace: str | None) -> OpenedStore:
    """The store (for writes) and a read-only view of it; a bad URL is a one-line `UsageError`."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:"):
            raise UsageError("an in-memory SQLite store lives only inside its process; give the file path")
        if not Path(path).is_file():
            raise UsageError(f"no SQLite task store at {path} (sqlite:///relative or sqlite:////absolute/path)")
        view: StoreView = SQLiteView(path)
        label = f"sqlite {path}"
    elif url.startswith(("redis://", "rediss://")):
        prefix = f"{namespace}:" if namespace else "mrtr:"
        view = RedisView(url, prefix)
        label = f"redis prefix {prefix!r}"
    elif url.startswith(("postgresql://", "postgres://")):
        table = namespace or "mrtr_tasks"
        view = PostgresView(url, table)
        label = f"postgresql table {table}"
    else:
        raise UsageError(f"unknown task store URL {url!r}: expected sqlite:///PATH, redis://... or postgresql://...")
    try:
        store = open_store(url, namespace=namespace)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"cannot open the store: {exc}") from None
    return OpenedStore(view, store, label)


__all__ = [
    "OpenedStore",
    "PostgresView",
    "RedisView",
    "SQLiteView",
    "StoreView",
    "open_view",
]
