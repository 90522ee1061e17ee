"""`PostgresStore`: tasks for a fleet whose source of truth is PostgreSQL.

Each operation is one SQL statement in autocommit, so Postgres's own transaction is the
atomic step: a server or client dying mid-statement leaves the previous row. `data` is
TEXT, not JSONB, so the record comes back byte for byte as written (JSONB reorders
object keys and rejects NUL characters, which flow arguments may legally contain); the
columns beside it exist only to be indexed and compared.

The pool opens on first use, so a store can be built at import time without a running
event loop or database; `open()` does it eagerly, to fail fast at server start.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from mrtr.stores._abilities import RoundRewinding, SharedStore, redacted
from mrtr.stores._base import (
    STATUSES,
    RoundRow,
    TaskExists,
    TaskPage,
    TaskQuery,
    TaskRecord,
    page_cursor,
    read_cursor,
    rewind_plan,
    round_verdict,
    wait_statuses,
)
from mrtr.stores._faults import burst, store_boundary, throttle_logger

if TYPE_CHECKING:
    from mrtr.buses._base import BrokerBus

# Room for the "_claimable"/"_expiry" index suffixes inside Postgres's 63-byte names.
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")


_OUTAGE_WAIT = 0.5  # seconds a call waits for a pooled connection while the store is failing
_PROBE_EVERY = 0.5  # seconds between two probes for PostgreSQL's return during an outage


def _transient(exc: BaseException) -> bool:
    # OperationalError: refused or dropped connections, a server shutting down or starting
    # up, and the pool's own PoolTimeout; InterfaceError: a connection found closed.
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, OSError))


# `TaskQuery.waiting` beyond the status (`wait_statuses` narrows to `working` rows first, through
# the status index): the record's `waiting` list, parsed as `json` (not `jsonb`, which refuses the
# NUL characters arguments may hold). See `waits_for`. Parsing a record costs tens of µs, so a
# plain text search (no wait of that kind can be there if its text is not) decides most rows first.
_WAITS_OF = "json_array_elements(data::json -> 'waiting')"
_WAIT_SQL: dict[str, LiteralString] = {
    "timer": 'strpos(data, \'"kind":"timer"\') > 0'
    f" AND EXISTS (SELECT 1 FROM {_WAITS_OF} AS w WHERE w ->> 'kind' = 'timer')",
    "event": 'strpos(data, \'"kind":"event"\') > 0'
    f" AND EXISTS (SELECT 1 FROM {_WAITS_OF} AS w WHERE w ->> 'kind' = 'event' AND w ->> 'via' IS NULL)",
    "callback": 'strpos(data, \'"via":"callback"\') > 0'
    f" AND EXISTS (SELECT 1 FROM {_WAITS_OF} AS w WHERE w ->> 'via' = 'callback')",
    "nothing": '((strpos(data, \'"kind":"timer"\') = 0 AND strpos(data, \'"kind":"event"\') = 0)'
    " OR COALESCE(json_array_length(data::json -> 'waiting'), 0) = 0)",
}


@store_boundary("postgresql", _transient)
class PostgresStore(SharedStore, RoundRewinding):
    """A `TaskStore` in one PostgreSQL table, created if missing.

    `timeout` bounds the wait for a pooled connection (and the first connect): while
    PostgreSQL is down, a call raises `mrtr.StoreUnavailable` after it, well before a client's
    own timeout; the pool replaces broken connections by itself once PostgreSQL is back.
    """

    def __init__(
        self,
        dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        *,
        table: str = "mrtr_tasks",
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        **connect_kwargs: Any,
    ) -> None:
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(f"table must be a plain SQL identifier of at most 48 characters, not {table!r}")
        self.dsn = dsn
        self.table = table
        # The pool logs a line per connection attempt while PostgreSQL is down: one per template per 30 s.
        throttle_logger("psycopg.pool")
        self._pool_args: dict[str, Any] = {"min_size": min_size, "max_size": max_size, "timeout": timeout}
        self._connect_kwargs = {**connect_kwargs, "autocommit": True}
        self._pool: AsyncConnectionPool | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._reviving: asyncio.Task[None] | None = None

        fmt = {
            "t": sql.Identifier(table),
            "claim_idx": sql.Identifier(f"{table}_claimable"),
            "expiry_idx": sql.Identifier(f"{table}_expiry"),
            "r": sql.Identifier(f"{table}_rounds"),
            "rounds_idx": sql.Identifier(f"{table}_rounds_exp"),
            "created_idx": sql.Identifier(f"{table}_created"),
            "status_idx": sql.Identifier(f"{table}_status"),
            "flow_idx": sql.Identifier(f"{table}_flow"),
            "id_idx": sql.Identifier(f"{table}_ids"),
        }

        def q(text: LiteralString) -> sql.Composed:
            return sql.SQL(text).format(**fmt)

        self._schema = [
            q(
                "CREATE TABLE IF NOT EXISTS {t} (task_id TEXT PRIMARY KEY, version BIGINT NOT NULL,"
                " status TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION,"
                " data TEXT NOT NULL)"
            ),
            # Partial indexes: claim scans read only `working` rows, purges only rows with a TTL.
            q("CREATE INDEX IF NOT EXISTS {claim_idx} ON {t} (lease_until) WHERE status = 'working'"),
            q("CREATE INDEX IF NOT EXISTS {expiry_idx} ON {t} (expires_at) WHERE expires_at IS NOT NULL"),
            # The replay guard's ledger (mrtr._guard): one row per claimed round.
            q(
                "CREATE TABLE IF NOT EXISTS {r} (round_id TEXT PRIMARY KEY, digest TEXT NOT NULL,"
                " owner TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL, outcome TEXT,"
                " expires_at DOUBLE PRECISION NOT NULL)"
            ),
            q("CREATE INDEX IF NOT EXISTS {rounds_idx} ON {r} (expires_at)"),
            # "Back" (`RoundRewinding`): each round's link to the next, whether a step finished
            # in it, whether it is on a branch left behind.
            q("ALTER TABLE {r} ADD COLUMN IF NOT EXISTS next_round TEXT"),
            q("ALTER TABLE {r} ADD COLUMN IF NOT EXISTS stepped BOOLEAN"),
            q("ALTER TABLE {r} ADD COLUMN IF NOT EXISTS superseded BOOLEAN"),
            # A claimed round's progress (`RoundProgress`: a call's first round, checkpointed).
            q("ALTER TABLE {r} ADD COLUMN IF NOT EXISTS progress TEXT"),
            # Listing (the console, `mrtr tasks`): columns computed from the record itself, so
            # no write path changes, and a table from before them gains them as it is.
            # Written by `create` (neither changes afterwards). Rows from before these columns
            # get them from their text (a JSON parse would refuse the NULs arguments may hold).
            q("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS created_at DOUBLE PRECISION"),
            q("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS flow TEXT"),
            q(
                "UPDATE {t} SET created_at = substring(data from"
                ' \'"status":"[a-z_]+","created_at":([-0-9.eE+]+)\')::double precision,'
                ' flow = substring(data from \'^\\{{"task_id":"(?:[^"\\\\]|\\\\.)*","flow":"([^"\\\\]*)"\')'
                " WHERE created_at IS NULL"
            ),
            q("CREATE INDEX IF NOT EXISTS {created_idx} ON {t} (created_at DESC, task_id DESC)"),
            q("CREATE INDEX IF NOT EXISTS {status_idx} ON {t} (status, created_at DESC, task_id DESC)"),
            q("CREATE INDEX IF NOT EXISTS {flow_idx} ON {t} (flow, status, created_at DESC, task_id DESC)"),
            q("CREATE INDEX IF NOT EXISTS {id_idx} ON {t} (task_id text_pattern_ops)"),
        ]
        self._count_sql = q(
            "SELECT status, COUNT(*) FROM {t} WHERE expires_at IS NULL OR expires_at > %s GROUP BY status"
        )
        self._count_expired_sql = q("SELECT COUNT(*) FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= %s")
        self._flows_sql = q("SELECT DISTINCT flow FROM {t} WHERE flow IS NOT NULL ORDER BY flow")
        self._list_head = q("SELECT version, data FROM {t} WHERE ")
        # An expired row is as good as absent (`load` hides it, Redis drops it by itself), so
        # `create` may take its id over; only a live row makes the id "taken".
        self._create_sql = q(
            "INSERT INTO {t} AS old (task_id, version, status, lease_until, expires_at, data, created_at, flow)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET"
            " version = EXCLUDED.version, status = EXCLUDED.status, lease_until = EXCLUDED.lease_until,"
            " expires_at = EXCLUDED.expires_at, data = EXCLUDED.data, created_at = EXCLUDED.created_at,"
            " flow = EXCLUDED.flow"
            " WHERE old.expires_at IS NOT NULL AND old.expires_at <= %s"
        )
        self._save_sql = q(
            "UPDATE {t} SET version = version + 1, status = %s, lease_until = %s, expires_at = %s, data = %s"
            " WHERE task_id = %s AND version = %s AND (expires_at IS NULL OR expires_at > %s)"
        )
        self._load_sql = q(
            "SELECT version, data FROM {t} WHERE task_id = %s AND (expires_at IS NULL OR expires_at > %s)"
        )
        self._load_many_sql = q(
            "SELECT task_id, version, data FROM {t} WHERE task_id = ANY(%s) AND (expires_at IS NULL OR expires_at > %s)"
        )
        self._next_wake_sql = q("SELECT MIN(lease_until) FROM {t} WHERE status = 'working' AND lease_until > %s")
        self._claimable_sql = q(
            "SELECT task_id FROM {t} WHERE status = 'working' AND lease_until < %s"
            " AND (expires_at IS NULL OR expires_at > %s) ORDER BY lease_until LIMIT %s"
        )
        # Leases on the database's clock: `now()` is the statement's transaction time.
        self._claim_round_sql = q(
            "INSERT INTO {r} AS old (round_id, digest, owner, lease_until, outcome, expires_at)"
            " VALUES (%(id)s, %(d)s, %(o)s, extract(epoch FROM now()) + %(lease)s, NULL, %(exp)s)"
            " ON CONFLICT (round_id) DO UPDATE SET digest = EXCLUDED.digest, owner = EXCLUDED.owner,"
            " lease_until = EXCLUDED.lease_until, outcome = NULL, expires_at = EXCLUDED.expires_at,"
            " next_round = NULL, stepped = NULL, superseded = NULL,"
            # a takeover (same digest, lease lapsed) resumes the round's progress; an expired
            # row is a new call's, which must not resume another call's journal
            " progress = CASE WHEN old.expires_at <= extract(epoch FROM now()) THEN NULL ELSE old.progress END"
            " WHERE old.expires_at <= extract(epoch FROM now()) OR (old.digest = EXCLUDED.digest"
            " AND old.outcome IS NULL AND old.lease_until < extract(epoch FROM now()) AND old.superseded IS NULL)"
            " RETURNING 1"
        )
        self._read_round_sql = q("SELECT digest, outcome, superseded FROM {r} WHERE round_id = %s")
        self._finish_linked_sql = q(
            "UPDATE {r} SET outcome = %s, next_round = %s, stepped = %s"
            " WHERE round_id = %s AND owner = %s AND outcome IS NULL"
        )
        self._flow_rounds_sql = q(
            "SELECT round_id, digest, lease_until, outcome, superseded, stepped, next_round,"
            " extract(epoch FROM now())::float8 FROM {r}"
            " WHERE round_id >= %s AND round_id < %s AND expires_at > extract(epoch FROM now()) FOR UPDATE"
        )
        self._supersede_sql = q(
            "INSERT INTO {r} (round_id, digest, owner, lease_until, expires_at, superseded)"
            " VALUES (%s, '', '', 0, %s, true) ON CONFLICT (round_id) DO UPDATE SET superseded = true"
        )
        self._rewind_sql = q(
            "UPDATE {r} SET digest = %s, owner = %s, lease_until = extract(epoch FROM now()) + %s, outcome = NULL,"
            " next_round = NULL, stepped = NULL, expires_at = %s WHERE round_id = %s"
        )
        self._renew_round_sql = q(
            "UPDATE {r} SET lease_until = extract(epoch FROM now()) + %s"
            " WHERE round_id = %s AND owner = %s AND outcome IS NULL"
        )
        self._finish_round_sql = q("UPDATE {r} SET outcome = %s WHERE round_id = %s AND owner = %s AND outcome IS NULL")
        self._progress_round_sql = q(
            "UPDATE {r} SET progress = %s WHERE round_id = %s AND owner = %s AND outcome IS NULL"
        )
        self._read_progress_sql = q(
            "SELECT progress FROM {r} WHERE round_id = %s AND expires_at > extract(epoch FROM now())"
        )
        self._clock_sql = q("SELECT extract(epoch FROM clock_timestamp())::float8")
        self._purge_rounds_sql = q("DELETE FROM {r} WHERE expires_at <= extract(epoch FROM now())")
        self._purge_sql = q("DELETE FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= %s")

    async def open(self) -> PostgresStore:
        """Connect and create the table now rather than on first use."""
        await self._get_pool()
        return self

    async def _get_pool(self) -> AsyncConnectionPool:
        if self._pool is not None:
            return self._pool
        if self._closed:
            raise RuntimeError("PostgresStore is closed")
        async with self._open_lock:
            if self._pool is None:
                # A connect that hangs (a store behind a dead route) fails after 5 s unless told otherwise.
                kwargs = {"connect_timeout": 5} | self._connect_kwargs
                pool = AsyncConnectionPool(self.dsn, kwargs=kwargs, open=False, **self._pool_args)
                try:
                    await pool.open(wait=True, timeout=self._pool_args["timeout"])
                    await self._create_schema(pool)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
        return self._pool

    async def _create_schema(self, pool: AsyncConnectionPool) -> None:
        # Concurrent `CREATE TABLE IF NOT EXISTS` can still collide in the catalog when a
        # fleet starts at once; an advisory lock on the table name makes them take turns.
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"mrtr.stores:{self.table}"])
            for statement in self._schema:
                await conn.execute(statement)

    async def _execute(
        self, query: sql.Composed, params: tuple[Any, ...] | dict[str, Any]
    ) -> tuple[int, list[tuple[Any, ...]]]:
        pool = await self._get_pool()
        # While PostgreSQL is known to be down, a call waits a moment for a connection, not the
        # whole pool timeout: callers get their retryable error in well under a second.
        outage = burst("postgresql").since is not None
        if outage and self._reviving is None:
            self._reviving = asyncio.create_task(self._revive(pool))
        wait = _OUTAGE_WAIT if outage else self._pool_args["timeout"]
        async with pool.connection(timeout=wait) as conn:
            cur = await conn.execute(query, params)
            rows = await cur.fetchall() if cur.description is not None else []
            return cur.rowcount, rows

    async def _revive(self, pool: AsyncConnectionPool) -> None:
        """Swap in a fresh pool as soon as PostgreSQL answers again.

        psycopg's pool retries a lost connection after 1, 2, 4, 8... seconds, so a 10 s outage
        costs up to 6 s more before its next attempt. While an outage lasts, this probes with
        one plain connection every half second; when the probe connects, a new pool (opened
        without waiting) replaces the old one, which is closed once its borrowed connections
        come back. Only this store's own pool is touched, through the pool's public API.
        """
        kwargs = {"connect_timeout": 2} | self._connect_kwargs
        try:
            while not self._closed and self._pool is pool:
                await asyncio.sleep(_PROBE_EVERY)
                try:
                    probe = await psycopg.AsyncConnection.connect(self.dsn, **kwargs)
                except (psycopg.Error, OSError):
                    continue
                await probe.close()
                fresh = AsyncConnectionPool(
                    self.dsn, kwargs={"connect_timeout": 5} | self._connect_kwargs, open=False, **self._pool_args
                )
                await fresh.open(wait=False)
                async with self._open_lock:
                    if self._closed or self._pool is not pool:
                        await fresh.close()
                        return
                    self._pool = fresh
                await pool.close(timeout=self._pool_args["timeout"])
                return
        finally:
            self._reviving = None

    async def create(self, record: TaskRecord) -> None:
        params = (
            record.task_id,
            record.version,
            record.status,
            float(record.lease_until),
            record.expires_at,
            record.to_json(),
            float(record.created_at),
            record.flow,
            time.time(),
        )
        count, _ = await self._execute(self._create_sql, params)
        if count != 1:
            raise TaskExists(record.task_id)

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        _, rows = await self._execute(self._load_sql, (task_id, now))
        if not rows:
            return None
        version, data = rows[0]
        record = TaskRecord.from_json(data)
        record.version = version  # the column is what `save` compares against
        return record

    async def load_many(self, task_ids: list[str], now: float) -> list[TaskRecord | None]:
        """`load` of each id in one query."""
        if not task_ids:
            return []
        _, rows = await self._execute(self._load_many_sql, (task_ids, now))
        by_id: dict[str, TaskRecord] = {}
        for task_id, version, data in rows:
            record = by_id[task_id] = TaskRecord.from_json(data)
            record.version = version
        return [by_id.get(task_id) for task_id in task_ids]

    async def save(self, record: TaskRecord) -> bool:
        expected = record.version
        # Serialise first: a record that cannot be encoded fails here, the stored one untouched.
        data = record.copy(version=expected + 1).to_json()
        params = (
            record.status,
            float(record.lease_until),
            record.expires_at,
            data,
            record.task_id,
            expected,
            time.time(),
        )
        count, _ = await self._execute(self._save_sql, params)
        if count != 1:
            return False
        record.version = expected + 1
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        if limit <= 0:
            return []
        _, rows = await self._execute(self._claimable_sql, (now, now, limit))
        return [r[0] for r in rows]

    async def next_wake(self, now: float) -> float | None:
        """The earliest `lease_until` after `now` of a `working` task (an index seek)."""
        _, rows = await self._execute(self._next_wake_sql, (now,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def purge_expired(self, now: float) -> int:
        count, _ = await self._execute(self._purge_sql, (now,))
        return count

    # -- listing ----------------------------------------------------------------------------

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        statuses = wait_statuses(query)
        if statuses is None:
            return TaskPage([], None)
        where: list[sql.Composable] = [sql.SQL("(expires_at IS NULL OR expires_at > %s)")]
        params: list[Any] = [now]
        if len(statuses) == 1:
            # Equality, not `= ANY`: the planner then reads the (status|flow, status, created_at)
            # index in order and stops at the page's end, instead of sorting every match (and
            # evaluating a wait filter on each of them).
            where.append(sql.SQL("status = %s"))
            params.append(statuses[0])
        elif statuses:
            where.append(sql.SQL("status = ANY(%s)"))
            params.append(list(statuses))
        if query.waiting in _WAIT_SQL:
            where.append(sql.SQL(_WAIT_SQL[query.waiting]))
        if query.created_before is not None:
            where.append(sql.SQL("created_at < %s"))
            params.append(query.created_before)
        if query.flow is not None:
            where.append(sql.SQL("flow = %s"))
            params.append(query.flow)
        if query.id_prefix:
            where.append(sql.SQL("task_id LIKE %s"))
            params.append(query.id_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        after = read_cursor(query.cursor)
        if after is not None:
            where.append(sql.SQL("(created_at, task_id) < (%s, %s)"))
            params.extend(after)
        statement = sql.Composed(
            [
                self._list_head,
                sql.SQL(" AND ").join(where),
                sql.SQL(" ORDER BY created_at DESC, task_id DESC LIMIT %s"),
            ]
        )
        params.append(query.limit + 1)
        _, rows = await self._execute(statement, tuple(params))
        records = []
        for version, data in rows[: query.limit]:
            record = TaskRecord.from_json(data)
            record.version = version
            records.append(record)
        return TaskPage(records, page_cursor(records[-1]) if len(rows) > query.limit else None)

    async def count_by_status(self, now: float) -> dict[str, int]:
        _, rows = await self._execute(self._count_sql, (now,))
        return dict.fromkeys(STATUSES, 0) | {str(status): int(n) for status, n in rows}

    async def flows(self, now: float) -> list[str]:
        _, rows = await self._execute(self._flows_sql, ())
        return [str(row[0]) for row in rows]

    async def count_expired(self, now: float) -> int:
        _, rows = await self._execute(self._count_expired_sql, (now,))
        return int(rows[0][0])

    # -- the replay guard's ledger (see mrtr.stores._abilities.RoundLedger); the database's clock -------

    async def clock(self) -> float:
        """Epoch seconds on the PostgreSQL server's clock, shared by every instance."""
        _, rows = await self._execute(self._clock_sql, ())
        return float(rows[0][0])

    async def claim_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        params = {"id": round_id, "d": digest, "o": owner, "lease": float(lease), "exp": float(expires_at)}
        _, rows = await self._execute(self._claim_round_sql, params)
        if rows:
            return "claimed", None
        _, rows = await self._execute(self._read_round_sql, (round_id,))
        if rows and rows[0][2]:
            return "superseded", None
        return round_verdict((rows[0][0], rows[0][1]) if rows else None, digest)

    async def renew_round(self, round_id: str, owner: str, lease: float) -> bool:
        count, _ = await self._execute(self._renew_round_sql, (float(lease), round_id, owner))
        return count == 1

    async def finish_round(self, round_id: str, owner: str, outcome: str) -> bool:
        count, _ = await self._execute(self._finish_round_sql, (outcome, round_id, owner))
        return count == 1

    async def finish_round_linked(
        self, round_id: str, owner: str, outcome: str, next_round: str | None, stepped: bool
    ) -> bool:
        params = (outcome, next_round, bool(stepped), round_id, owner)
        count, _ = await self._execute(self._finish_linked_sql, params)
        return count == 1

    async def rewind_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        flow = round_id.partition(":")[0]
        pool = await self._get_pool()
        async with pool.connection(timeout=self._pool_args["timeout"]) as conn, conn.transaction():
            cur = await conn.execute(self._flow_rounds_sql, (flow + ":", flow + ";"))
            found = await cur.fetchall()
            now = float(found[0][7]) if found else 0.0
            rows: dict[str, RoundRow] = {
                row[0]: (row[1], float(row[2]), row[3], bool(row[4]), None if row[5] is None else bool(row[5]), row[6])
                for row in found
            }
            verdict, later = rewind_plan(rows, round_id, digest, now)
            if verdict == "claimed":
                for other in later:
                    await conn.execute(self._supersede_sql, (other, float(expires_at)))
                await conn.execute(self._rewind_sql, (digest, owner, float(lease), float(expires_at), round_id))
        return verdict, None

    async def save_round_progress(self, round_id: str, owner: str, progress: str) -> bool:
        count, _ = await self._execute(self._progress_round_sql, (progress, round_id, owner))
        return count == 1

    async def round_progress(self, round_id: str) -> str | None:
        _, rows = await self._execute(self._read_progress_sql, (round_id,))
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    async def purge_rounds(self) -> int:
        count, _ = await self._execute(self._purge_rounds_sql, ())
        return count

    @property
    def where(self) -> str:
        """This store's DSN, password redacted, for logs."""
        return redacted(self.dsn)

    def fleet_bus(self) -> BrokerBus | None:
        """The fleet bus on this store's database: `mrtr.open_bus(dsn)` with this store's namespace
        (`mrtr_bus` beside the default `mrtr_tasks`, else `<table>_bus`).

        None when the store was given connection options beyond its DSN, or its table name
        leaves no room for the suffix (the bus connects from the DSN alone).
        """
        connect = {k: v for k, v in self._connect_kwargs.items() if k != "autocommit"}
        table = "mrtr_bus" if self.table == "mrtr_tasks" else f"{self.table}_bus"
        if connect or len(table) > 48:
            return None
        from mrtr.buses._postgres import PostgresBus

        return PostgresBus(self.dsn, table=table)

    async def close(self) -> None:
        self._closed = True
        if self._reviving is not None:
            self._reviving.cancel()
        async with self._open_lock:
            if self._pool is not None:
                await self._pool.close()
                self._pool = None


__all__ = [
    "PostgresStore",
]
