"""`SQLiteStore`: the embedded default, one file shared by every server process on a host.

sqlite3 blocks, so each store owns one connection driven by one worker thread: calls are
serialised without a lock, and the event loop never waits on the disk. WAL mode lets
readers run beside a writer in another process; the busy timeout makes a writer wait
for the file lock instead of failing at once. Every write is a single SQL statement, so
SQLite's own atomic commit is what keeps a crash from leaving half a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from mrtr.stores._abilities import BatchLoading, Clocked, RoundRewinding, WakeIndexed
from mrtr.stores._base import (
    STATUSES,
    RoundRow,
    TaskExists,
    TaskPage,
    TaskQuery,
    TaskRecord,
    TaskStore,
    page_cursor,
    read_cursor,
    rewind_plan,
    round_verdict,
    wait_statuses,
)
from mrtr.stores._faults import store_boundary

T = TypeVar("T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS mrtr_tasks (
        task_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        status TEXT NOT NULL,
        lease_until REAL NOT NULL,
        expires_at REAL,
        data TEXT NOT NULL
    )""",
    # Partial indexes: the claim scan only ever looks at `working` rows, the purge only at
    # rows with a TTL, so neither index pays for the (many) finished or immortal rows.
    "CREATE INDEX IF NOT EXISTS mrtr_tasks_claimable ON mrtr_tasks (lease_until) WHERE status = 'working'",
    "CREATE INDEX IF NOT EXISTS mrtr_tasks_expiry ON mrtr_tasks (expires_at) WHERE expires_at IS NOT NULL",
    # The replay guard's ledger (mrtr._guard): one row per claimed round, gone after `expires_at`.
    """CREATE TABLE IF NOT EXISTS mrtr_rounds (
        round_id TEXT PRIMARY KEY,
        digest TEXT NOT NULL,
        owner TEXT NOT NULL,
        lease_until REAL NOT NULL,
        outcome TEXT,
        expires_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS mrtr_rounds_expiry ON mrtr_rounds (expires_at)",
)

# "Back" (mrtr.stores._abilities.RoundRewinding): each round's link to the next, whether a step
# finished in it, whether it is on a branch left behind. Added to a table from before them.
_ROUND_COLUMNS = (("next_round", "TEXT"), ("stepped", "INTEGER"), ("superseded", "INTEGER"))

# Listing (the console, `mrtr tasks`): two columns computed from the record itself, so no
# write path changes and a table from before them gains them as it is (ALTER TABLE below).
_LISTING_COLUMNS = (
    ("created_at", "REAL GENERATED ALWAYS AS (json_extract(data, '$.created_at')) VIRTUAL"),
    ("flow", "TEXT GENERATED ALWAYS AS (json_extract(data, '$.flow')) VIRTUAL"),
)
_LISTING_INDEXES = (
    "CREATE INDEX IF NOT EXISTS mrtr_tasks_created ON mrtr_tasks (created_at DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS mrtr_tasks_status ON mrtr_tasks (status, created_at DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS mrtr_tasks_flow ON mrtr_tasks (flow, status, created_at DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS mrtr_tasks_counts ON mrtr_tasks (status, expires_at)",
)

# `TaskQuery.waiting` beyond the status (`wait_statuses` narrows to `working` rows first, through
# the status index): the record's `waiting` list, read from its JSON (see `waits_for`), after a
# plain text search (no wait of that kind can be there if its text is not) has decided most rows.
_WAIT_MATCH = "instr(data, '{}') > 0 AND EXISTS (SELECT 1 FROM json_each(data, '$.waiting') AS w WHERE {})"
_WAIT_SQL = {
    "timer": _WAIT_MATCH.format('"kind":"timer"', "json_extract(w.value, '$.kind') = 'timer'"),
    "event": _WAIT_MATCH.format(
        '"kind":"event"', "json_extract(w.value, '$.kind') = 'event' AND json_extract(w.value, '$.via') IS NULL"
    ),
    "callback": _WAIT_MATCH.format('"via":"callback"', "json_extract(w.value, '$.via') = 'callback'"),
    "nothing": '((instr(data, \'"kind":"timer"\') = 0 AND instr(data, \'"kind":"event"\') = 0)'
    " OR COALESCE(json_array_length(data, '$.waiting'), 0) = 0)",
}

# An expired row is as good as absent (`load` hides it and Redis drops it by itself), so
# `create` may take its id over; only a live row makes the id "taken".
_CREATE = """
INSERT INTO mrtr_tasks (task_id, version, status, lease_until, expires_at, data)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id) DO UPDATE SET
    version = excluded.version, status = excluded.status, lease_until = excluded.lease_until,
    expires_at = excluded.expires_at, data = excluded.data
WHERE mrtr_tasks.expires_at IS NOT NULL AND mrtr_tasks.expires_at <= ?
"""

# Claim a round: insert it, or take over an expired row, or one whose lease lapsed with the
# same answers and no outcome. ?1 id, ?2 digest, ?3 owner, ?4 now, ?5 lease, ?6 expires_at.
_CLAIM_ROUND = """
INSERT INTO mrtr_rounds (round_id, digest, owner, lease_until, outcome, expires_at)
VALUES (?1, ?2, ?3, ?4 + ?5, NULL, ?6)
ON CONFLICT (round_id) DO UPDATE SET
    digest = excluded.digest, owner = excluded.owner, lease_until = excluded.lease_until,
    outcome = NULL, expires_at = excluded.expires_at
    , next_round = NULL, stepped = NULL, superseded = NULL
WHERE mrtr_rounds.expires_at <= ?4
   OR (mrtr_rounds.digest = ?2 AND mrtr_rounds.outcome IS NULL AND mrtr_rounds.lease_until < ?4
       AND mrtr_rounds.superseded IS NULL)
RETURNING 1
"""

_SAVE = """
UPDATE mrtr_tasks SET version = version + 1, status = ?, lease_until = ?, expires_at = ?, data = ?
WHERE task_id = ? AND version = ? AND (expires_at IS NULL OR expires_at > ?)
"""


_LOCKED_PAUSE = 0.005


def _transient(exc: BaseException) -> bool:
    # Still locked after the busy timeout (and the retries in `_call`): another process holds
    # the write lock for longer than it should. The caller may retry; nothing was written.
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


@store_boundary("sqlite", _transient)
class SQLiteStore(TaskStore, Clocked, WakeIndexed, BatchLoading, RoundRewinding):
    """A `TaskStore` in one SQLite file (or `":memory:"`, private to this object, for tests).

    Several processes may share the file: a write waits for another's lock (`busy_timeout_ms`,
    then retries), and one that still finds the file locked raises `mrtr.StoreUnavailable`
    (retryable), never "database is locked" to a client.
    """

    def __init__(self, path: str = "mrtr-tasks.db", *, busy_timeout_ms: int = 5000) -> None:
        self.path = path
        self._busy_timeout_ms = busy_timeout_ms
        # One thread owns the connection: sqlite3 objects are not meant to hop threads, and
        # a single worker queues calls in order, which is all the locking one connection needs.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mrtr-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise RuntimeError("SQLiteStore is closed")
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn, deadline)

    def _call(self, fn: Callable[[sqlite3.Connection], T], deadline: float) -> T:
        # Runs on the worker thread; opening here (not in __init__) keeps construction free
        # of I/O and the connection on the one thread that will ever use it. `deadline` counts
        # from the call, not from its turn on the thread: calls queued behind a write lock held
        # by another process fail together (retryable) instead of waiting a busy timeout each.
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("database is locked (the call waited its busy timeout in the queue)")
        while True:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                return fn(self._conn)
            except sqlite3.OperationalError as exc:
                # SQLite answers "locked" at once, without its busy handler, in a few cases
                # (two connections opening a new file in WAL mode together, WAL recovery). A
                # statement that got it did nothing: wait a moment and run it again.
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(_LOCKED_PAUSE)

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: autocommit. Each statement below is its own transaction, so
        # the Python module never holds a write lock open between statements.
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_ms / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            for statement in _SCHEMA:
                conn.execute(statement)
            have = {row[1] for row in conn.execute("PRAGMA table_xinfo(mrtr_tasks)")}
            for column, definition in _LISTING_COLUMNS:
                if column not in have:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process added it first
                        conn.execute(f"ALTER TABLE mrtr_tasks ADD COLUMN {column} {definition}")
            for statement in _LISTING_INDEXES:
                conn.execute(statement)
            have = {row[1] for row in conn.execute("PRAGMA table_xinfo(mrtr_rounds)")}
            for column, definition in _ROUND_COLUMNS:
                if column not in have:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process added it first
                        conn.execute(f"ALTER TABLE mrtr_rounds ADD COLUMN {column} {definition}")
        except BaseException:
            conn.close()
            raise
        return conn

    async def create(self, record: TaskRecord) -> None:
        row = (record.task_id, record.version, record.status, record.lease_until, record.expires_at)
        data = record.to_json()
        now = time.time()

        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(_CREATE, (*row, data, now)).rowcount

        if await self._run(op) != 1:
            raise TaskExists(record.task_id)

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        def op(conn: sqlite3.Connection) -> tuple[int, str] | None:
            found: tuple[int, str] | None = conn.execute(  # sqlite3 rows are untyped: the SELECT's columns
                "SELECT version, data FROM mrtr_tasks WHERE task_id = ? AND (expires_at IS NULL OR expires_at > ?)",
                (task_id, now),
            ).fetchone()
            return found

        row = await self._run(op)
        if row is None:
            return None
        record = TaskRecord.from_json(row[1])
        record.version = row[0]  # the column is what `save` compares against
        return record

    async def load_many(self, task_ids: list[str], now: float) -> list[TaskRecord | None]:
        """`load` of each id in one query."""
        if not task_ids:
            return []

        def op(conn: sqlite3.Connection) -> list[tuple[str, int, str]]:
            marks = ",".join("?" * len(task_ids))
            rows: list[tuple[str, int, str]] = conn.execute(  # the SELECT's columns
                f"SELECT task_id, version, data FROM mrtr_tasks WHERE task_id IN ({marks})"
                " AND (expires_at IS NULL OR expires_at > ?)",
                (*task_ids, now),
            ).fetchall()
            return rows

        by_id: dict[str, TaskRecord] = {}
        for task_id, version, data in await self._run(op):
            record = by_id[task_id] = TaskRecord.from_json(data)
            record.version = version
        return [by_id.get(task_id) for task_id in task_ids]

    async def save(self, record: TaskRecord) -> bool:
        expected = record.version
        # Serialise before touching the database: a record that cannot be encoded must fail
        # here, with the stored one untouched.
        data = record.copy(version=expected + 1).to_json()
        params = (record.status, record.lease_until, record.expires_at, data, record.task_id, expected, time.time())

        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(_SAVE, params).rowcount

        if await self._run(op) != 1:
            return False
        record.version = expected + 1
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT task_id FROM mrtr_tasks WHERE status = 'working' AND lease_until < ?"
                " AND (expires_at IS NULL OR expires_at > ?) ORDER BY lease_until LIMIT ?",
                (now, now, limit),
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(op)

    async def next_wake(self, now: float) -> float | None:
        """The earliest `lease_until` after `now` of a `working` task (an index seek)."""

        def op(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(
                "SELECT MIN(lease_until) FROM mrtr_tasks WHERE status = 'working' AND lease_until > ?", (now,)
            ).fetchone()
            return None if row is None or row[0] is None else float(row[0])

        return await self._run(op)

    async def purge_expired(self, now: float) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM mrtr_tasks WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
            ).rowcount

        return await self._run(op)

    # -- listing ----------------------------------------------------------------------------

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        statuses = wait_statuses(query)
        if statuses is None:
            return TaskPage([], None)
        where: list[str] = ["(expires_at IS NULL OR expires_at > ?)"]
        params: list[Any] = [now]
        if statuses:
            where.append(f"status IN ({', '.join('?' for _ in statuses)})")
            params.extend(statuses)
        if query.waiting in _WAIT_SQL:
            where.append(_WAIT_SQL[query.waiting])
        if query.created_before is not None:
            where.append("created_at < ?")
            params.append(query.created_before)
        if query.flow is not None:
            where.append("flow = ?")
            params.append(query.flow)
        if query.id_prefix:
            where.append("task_id >= ? AND task_id < ?")
            params.extend([query.id_prefix, query.id_prefix + "\U0010ffff"])
        after = read_cursor(query.cursor)
        if after is not None:
            where.append("(created_at < ? OR (created_at = ? AND task_id < ?))")
            params.extend([after[0], after[0], after[1]])
        sql = (
            f"SELECT version, data FROM mrtr_tasks WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, task_id DESC LIMIT ?"
        )
        params.append(query.limit + 1)

        def op(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            rows: list[tuple[int, str]] = conn.execute(sql, params).fetchall()
            return rows

        return _page(await self._run(op), query.limit)

    async def count_by_status(self, now: float) -> dict[str, int]:
        def op(conn: sqlite3.Connection) -> list[tuple[str, int]]:
            rows: list[tuple[str, int]] = conn.execute(
                "SELECT status, COUNT(*) FROM mrtr_tasks WHERE expires_at IS NULL OR expires_at > ? GROUP BY status",
                (now,),
            ).fetchall()
            return rows

        return dict.fromkeys(STATUSES, 0) | dict(await self._run(op))

    async def flows(self, now: float) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            return [row[0] for row in conn.execute("SELECT DISTINCT flow FROM mrtr_tasks ORDER BY flow") if row[0]]

        return await self._run(op)

    async def count_expired(self, now: float) -> int:
        def op(conn: sqlite3.Connection) -> int:
            sql = "SELECT COUNT(*) FROM mrtr_tasks WHERE expires_at IS NOT NULL AND expires_at <= ?"
            return int(conn.execute(sql, (now,)).fetchone()[0])

        return await self._run(op)

    # -- the replay guard's ledger (see mrtr.stores._abilities.RoundLedger); this host's clock ------------

    async def clock(self) -> float:
        """Epoch seconds on the store's clock: the one host that shares this file."""
        return time.time()

    async def claim_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        def op(conn: sqlite3.Connection) -> tuple[str, str | None]:
            now = time.time()
            if conn.execute(_CLAIM_ROUND, (round_id, digest, owner, now, lease, expires_at)).fetchone():
                return "claimed", None
            row = conn.execute(
                "SELECT digest, outcome, superseded FROM mrtr_rounds WHERE round_id = ?", (round_id,)
            ).fetchone()
            if row is not None and row[2]:
                return "superseded", None
            return round_verdict(None if row is None else (row[0], row[1]), digest)

        return await self._run(op)

    async def renew_round(self, round_id: str, owner: str, lease: float) -> bool:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE mrtr_rounds SET lease_until = ? WHERE round_id = ? AND owner = ? AND outcome IS NULL",
                (time.time() + lease, round_id, owner),
            ).rowcount

        return await self._run(op) == 1

    async def finish_round(self, round_id: str, owner: str, outcome: str) -> bool:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE mrtr_rounds SET outcome = ? WHERE round_id = ? AND owner = ? AND outcome IS NULL",
                (outcome, round_id, owner),
            ).rowcount

        return await self._run(op) == 1

    async def finish_round_linked(
        self, round_id: str, owner: str, outcome: str, next_round: str | None, stepped: bool
    ) -> bool:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE mrtr_rounds SET outcome = ?, next_round = ?, stepped = ?"
                " WHERE round_id = ? AND owner = ? AND outcome IS NULL",
                (outcome, next_round, 1 if stepped else 0, round_id, owner),
            ).rowcount

        return await self._run(op) == 1

    async def rewind_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        flow = round_id.partition(":")[0]

        def op(conn: sqlite3.Connection) -> str:
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                rows: dict[str, RoundRow] = {
                    row[0]: (row[1], row[2], row[3], bool(row[4]), None if row[5] is None else bool(row[5]), row[6])
                    for row in conn.execute(
                        "SELECT round_id, digest, lease_until, outcome, superseded, stepped, next_round"
                        " FROM mrtr_rounds WHERE round_id >= ? AND round_id < ? AND expires_at > ?",
                        (flow + ":", flow + ";", now),  # the flow's rounds: its id, then a colon
                    )
                }
                verdict, later = rewind_plan(rows, round_id, digest, now)
                if verdict == "claimed":
                    for other in later:
                        conn.execute(
                            "INSERT INTO mrtr_rounds (round_id, digest, owner, lease_until, expires_at, superseded)"
                            " VALUES (?, '', '', 0, ?, 1) ON CONFLICT (round_id) DO UPDATE SET superseded = 1",
                            (other, expires_at),
                        )
                    conn.execute(
                        "UPDATE mrtr_rounds SET digest = ?, owner = ?, lease_until = ?, outcome = NULL,"
                        " next_round = NULL, stepped = NULL, expires_at = ? WHERE round_id = ?",
                        (digest, owner, now + lease, expires_at, round_id),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return verdict

        return await self._run(op), None

    async def purge_rounds(self) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM mrtr_rounds WHERE expires_at <= ?", (time.time(),)).rowcount

        return await self._run(op)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def op() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, op)
        self._executor.shutdown(wait=False)


def _page(rows: list[tuple[int, str]], limit: int) -> TaskPage:
    records = []
    for version, data in rows[:limit]:
        record = TaskRecord.from_json(data)
        record.version = version
        records.append(record)
    return TaskPage(records, page_cursor(records[-1]) if len(rows) > limit else None)


__all__ = [
    "T",
    "SQLiteStore",
]
