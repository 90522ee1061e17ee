"""The store `mrtr tasks` works on: opened from a URL, read and written only through its own API.

`TaskStore.list_tasks` (paged, indexed) lists, `TaskAdmin` changes; nothing here knows a
backend's tables or keys. What this module adds is the shell's care: a URL that names no store
is refused before anything is created (a typo must not leave a new SQLite file or an empty
store behind), and a store that cannot be reached is one line with exit code 3.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from mrtr._errors import StoreUnavailable
from mrtr.cli._errors import Unreachable, UsageError
from mrtr.stores import RecordSeal, SealedStore, TaskQuery, TaskRecord, TaskStore, open_store

T = TypeVar("T")
_PAGE = 500


@dataclass
class OpenedStore:
    store: TaskStore
    label: str

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run one store call; a store that cannot be reached is `Unreachable` (exit 3)."""
        try:
            return await operation()
        except StoreUnavailable as exc:
            verb = "read" if exc.store == "redis" else "connect to"
            cause = exc.__cause__ if exc.__cause__ is not None else exc.detail or exc
            raise Unreachable(f"cannot {verb} the store: {' '.join(str(cause).split())}") from None
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"cannot connect to the store: {' '.join(str(exc).split())}") from None
        except Exception as exc:
            kind = type(exc).__module__.split(".")[0]
            if kind == "redis":
                raise Unreachable(f"cannot read the store: {exc}") from None
            if kind in ("psycopg", "psycopg_pool"):
                raise Unreachable(f"cannot connect to the store: {' '.join(str(exc).split())}") from None
            raise

    async def records(self, now: float, include_expired: bool, query: TaskQuery) -> AsyncIterator[TaskRecord]:
        """Every task `query` matches, newest first, a page at a time (past their TTL too if asked)."""
        seen_at = 0.0 if include_expired else now  # `list_tasks` hides what is expired *at* the time given
        cursor = None
        while True:
            paged = replace(query, limit=_PAGE, cursor=cursor)
            page = await self.call(lambda paged=paged: self.store.list_tasks(paged, seen_at))  # type: ignore[misc]
            for record in page.records:
                yield record
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def close(self) -> None:
        await self.store.close()


KEY_ENV = "MRTR_STATE_KEY"


def key_ring(key_file: str | None, *, env: str = KEY_ENV) -> RecordSeal | None:
    """The fleet's key ring, to open records sealed at rest: `--key-file` if given, else `$MRTR_STATE_KEY`.

    Either holds hex keys, newest first, separated by commas (or, in a file, lines): the first
    seals (`reseal`), every one opens. None when neither is set: records then show their
    metadata, and "sealed" where their payload would be.
    """
    if key_file is not None:
        try:
            raw = Path(key_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read --key-file {key_file}: {exc.strerror or exc}") from None
        where = f"--key-file {key_file}"
    else:
        raw = os.environ.get(env, "")
        where = env
    parts = [part.strip() for part in raw.replace("\n", ",").split(",") if part.strip()]
    if not parts:
        if key_file is not None:
            raise UsageError(f"{where} holds no key")
        return None
    try:
        return RecordSeal.from_keys([bytes.fromhex(part) for part in parts])
    except ValueError as exc:
        raise UsageError(f"{where} must hold hex keys of at least 32 bytes, newest first: {exc}") from None


def open_view(url: str, namespace: str | None, seal: RecordSeal | None = None) -> OpenedStore:
    """The store a URL names; a bad URL, or a SQLite file that is no task store, is a `UsageError`.

    With `seal`, records sealed at rest are opened as they are read (`SealedStore`, lenient: a
    record no key opens reads with its metadata only, `record.sealed`).
    """
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:"):
            raise UsageError("an in-memory SQLite store lives only inside its process; give the file path")
        if not Path(path).is_file():
            raise UsageError(f"no SQLite task store at {path} (sqlite:///relative or sqlite:////absolute/path)")
        _check_sqlite(path)
        label = f"sqlite {path}"
    elif url.startswith(("redis://", "rediss://")):
        label = f"redis prefix {(namespace or 'mrtr') + ':'!r}"
    elif url.startswith(("redis+cluster://", "rediss+cluster://")):
        label = f"redis cluster prefix {(namespace or 'mrtr') + ':'!r}"
    elif url.startswith(("postgresql://", "postgres://")):
        label = f"postgresql table {namespace or 'mrtr_tasks'}"
    else:
        raise UsageError(
            f"unknown task store URL {url!r}: expected sqlite:///PATH, redis://..., redis+cluster://... or "
            "postgresql://..."
        )
    # The store's own "unavailable" line is for a server's operator; a shell prints one line itself.
    logging.getLogger("mrtr.store").setLevel(logging.CRITICAL)
    try:
        if url.startswith(("postgresql://", "postgres://")):
            from mrtr.stores._postgres import PostgresStore

            # A shell waits seconds, not a server's patience; the pool's retry log is not for it.
            logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
            store: TaskStore = PostgresStore(url, table=namespace or "mrtr_tasks", timeout=5.0, max_size=2)
        elif url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
            from mrtr.stores._redis import RedisStore

            # A shell waits seconds, not a server's patience, for a Redis that does not answer.
            store = RedisStore(url, prefix=f"{namespace or 'mrtr'}:", socket_connect_timeout=5, socket_timeout=5)
        else:
            store = open_store(url, namespace=namespace)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"cannot open the store: {exc}") from None
    return OpenedStore(store if seal is None else SealedStore(store, seal, strict=False), label)


def _check_sqlite(path: str) -> None:
    """A read-only look: the file must hold mrtr's table before the store may touch it."""
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'mrtr_tasks'").fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"{path} is not an mrtr task store: {exc}") from None
    if found is None:
        raise UsageError(f"{path} is not an mrtr task store (no mrtr_tasks table)")


__all__ = ["KEY_ENV", "OpenedStore", "key_ring", "open_view"]
