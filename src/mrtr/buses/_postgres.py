"""`PostgresBus`: listen events across a fleet over PostgreSQL `LISTEN`/`NOTIFY`.

`NOTIFY` payloads must stay under 8,000 bytes, so a larger event is inserted into the table
`<table>` (created if missing) and the notification names its row; receivers read it from
there. Rows older than `ref_ttl` seconds are deleted as new ones are written. Every payload
carries this bus's origin and a sequence number, so two equal events are never folded into
one by PostgreSQL (which merges identical notifications within a transaction). A batch of
events is one statement, `SELECT pg_notify(channel, w) FROM unnest(batch)`: one round trip.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import sql

from mrtr.buses._base import BrokerBus

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")
_PURGE_EVERY = 64  # by-reference writes between purges of old rows


class PostgresBus(BrokerBus):
    """A `SubscriptionBus` for every instance that shares this database and `table` (also the channel)."""

    def __init__(
        self, dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres", *, table: str = "mrtr_bus", **options: Any
    ) -> None:
        if not _NAME.fullmatch(table):
            raise ValueError(f"table must be a plain SQL identifier of at most 48 characters, not {table!r}")
        options.setdefault("max_inline", 7900)
        super().__init__(**options)
        self.dsn = dsn
        self.table = table
        self.channel = table
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._refs_written = 0
        t = sql.Identifier(table)
        self._schema = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL,"
            " created_at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp()))"
        ).format(t)
        self._insert = sql.SQL("INSERT INTO {} (payload) VALUES (%s) RETURNING id").format(t)
        self._select = sql.SQL("SELECT payload FROM {} WHERE id = %s").format(t)
        self._purge = sql.SQL("DELETE FROM {} WHERE created_at < extract(epoch FROM clock_timestamp()) - %s").format(t)
        self._listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=5)
        return self._conn

    async def _send(self, wire: str) -> None:
        await self._send_batch([wire])

    async def _send_batch(self, wires: list[str]) -> None:
        """One statement for the whole batch: a `pg_notify` per row of an array, in its order.

        One statement is one transaction: the notifications are delivered together, in order,
        at its commit (each stays one notification, under `NOTIFY`'s 8,000-byte cap).
        """
        async with self._lock:
            conn = await self._connection()
            if len(wires) == 1:
                await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, wires[0]))
            else:
                await conn.execute("SELECT pg_notify(%s, w) FROM unnest(%s::text[]) AS w", (self.channel, wires))

    async def _put_ref(self, text: str) -> str:
        async with self._lock:
            conn = await self._connection()
            try:
                row = await (await conn.execute(self._insert, (text,))).fetchone()
            except psycopg.errors.UndefinedTable:  # the first large event (or the table was dropped)
                await conn.execute(self._schema)
                row = await (await conn.execute(self._insert, (text,))).fetchone()
            self._refs_written += 1
            if self._refs_written % _PURGE_EVERY == 0:
                await conn.execute(self._purge, (self.ref_ttl,))
        assert row is not None
        return str(row[0])

    async def _get_ref(self, ref: str) -> str | None:
        async with self._lock:
            conn = await self._connection()
            try:
                row = await (await conn.execute(self._select, (int(ref),))).fetchone()
            except psycopg.errors.UndefinedTable:
                return None
        return None if row is None else str(row[0])

    async def _messages(self) -> AsyncIterator[str | None]:
        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=5)
        try:
            await conn.execute(self._listen)
            yield None
            async for notify in conn.notifies():
                yield notify.payload
        finally:
            await conn.close()

    async def _reset_publisher(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _close_backend(self) -> None:
        await self._reset_publisher()

    async def drop(self) -> None:
        """Delete the by-reference table (tests and teardown; live buses recreate it when needed)."""
        async with self._lock:
            conn = await self._connection()
            await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.table)))


__all__ = ["PostgresBus"]
