"""Sealed at rest: a task record's payload is stored as ciphertext, its metadata in clear.

A flow's journal travels sealed between rounds (the SDK's `RequestStateSecurity`); as a durable
task it would otherwise lie in plain text in SQLite, Redis or PostgreSQL, where a dump, a backup
or a read-only replica hands over every user's answers. `SealedStore` wraps any `TaskStore` and
seals the record's payload fields (`PAYLOAD_FIELDS`: arguments, journal, input requests, answers
not yet used, result, error, history, inbox) into one token under the record's `sealed` key,
with the SDK's codec (`RequestStateSecurity(keys=...).codec`, AES-GCM: mrtr has no crypto of its
own). What stores index and operators sort by stays clear: id, flow, status, timestamps, TTL,
lease, version, owner digest, waits and the status message (which mrtr writes from waits and
operator actions only).

Why a wrapper and not each backend: the backends serialise a `TaskRecord` with `to_json`, and a
sealed record is just a record whose payload fields are empty and whose `extras` hold the token,
so all three (and any store of your own) get sealing once, with their scripts, generated columns
and indexes unchanged.

The token binds the task id (a sealed payload copied onto another task does not open) and a
kind tag (a `requestState` or callback token sealed under the same keys is not a record). Keys
rotate as on the wire: every key of the ring opens, the first seals; a record written before
sealing (plain) still reads, and its next write seals it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mcp.server.request_state import InvalidRequestState, RequestStateCodec, RequestStateSecurity

from mrtr.stores._abilities import (
    WrappedStore,
    can_pipeline_rounds,
    can_rewind_rounds,
    has_clock,
    has_next_wake,
    has_round_progress,
    is_round_ledger,
    is_shared,
    load_many,
)
from mrtr.stores._base import SEALED, TaskPage, TaskQuery, TaskRecord, TaskStore

if TYPE_CHECKING:
    from mrtr.buses._base import BrokerBus

_KIND = "mrtr/task-record/v1"
_UNKNOWN = "sealed_unknown"
"""Where payload fields a newer mrtr sealed, and this one does not know, wait in `extras` to be sealed again."""

PAYLOAD_FIELDS = ("arguments", "journal", "input_requests", "responses", "result", "error", "history", "inbox")
"""The fields sealed at rest: everything a user or a tool put in the task."""


def _empty() -> dict[str, Any]:
    return {
        "arguments": {},
        "journal": "",
        "input_requests": {},
        "responses": {},
        "result": None,
        "error": None,
        "history": [],
        "inbox": [],
    }


def _payload(record: TaskRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in PAYLOAD_FIELDS}


class RecordSealed(RuntimeError):
    """A sealed record that this key ring cannot open (or a sealed record written without its key).

    Raised where a half-read record must never be used: the task runtime (it would run the flow
    from an empty journal) and any write through a `SealedStore`.
    """

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id!r} is sealed at rest and {reason}")
        self.task_id = task_id
        self.reason = reason


class RecordSeal:
    """Seals and opens the payload of task records with a codec of the SDK.

    Args:
        codec: A `RequestStateCodec` (`RequestStateSecurity(keys=[...]).codec`), or a callable
            returning one, or None: the server installs its policy late, so the host core passes
            a callable read on first use. None from the callable means "nothing to seal with":
            records are then written plain (and sealed ones do not open).
        current: A codec of the ring's first key alone, when known (`from_keys`): `is_current`
            then tells records sealed under it from those `reseal` should rewrite.
    """

    def __init__(
        self,
        codec: RequestStateCodec | Callable[[], RequestStateCodec | None] | None,
        *,
        current: RequestStateCodec | None = None,
    ) -> None:
        if codec is None or hasattr(codec, "seal"):
            fixed: Any = codec
            self._source: Callable[[], RequestStateCodec | None] = lambda: fixed
        else:
            self._source = codec
        self._codec: RequestStateCodec | None = None
        self._current = current

    @classmethod
    def from_keys(cls, keys: list[bytes]) -> RecordSeal:
        """A ring of raw keys, newest first (`keys[0]` seals, every key opens), as `MRTR_STATE_KEY` holds them."""
        if not keys:
            raise ValueError("a key ring needs at least one key")
        ring = RequestStateSecurity(keys=keys).codec
        return cls(ring, current=RequestStateSecurity(keys=keys[:1]).codec)

    @property
    def codec(self) -> RequestStateCodec | None:
        if self._codec is None:
            self._codec = self._source()  # cached once found; asked again while there is none
        return self._codec

    @property
    def active(self) -> bool:
        """Whether there is a key ring to seal with."""
        return self.codec is not None

    def seal(self, record: TaskRecord) -> TaskRecord:
        """The record as stored: payload fields empty, their values in one token under `extras["sealed"]`.

        A record read without a key that opens it (`record.sealed`) is stored as it came.

        Raises:
            RecordSealed: `record` was read without its key, and its payload was changed.
        """
        if SEALED in record.extras:
            # Read without a key that opens it (a tool's cancel): its token goes back as it came,
            # and nothing of the payload may sit in clear beside it.
            if any(value != _empty()[name] for name, value in _payload(record).items()):
                raise RecordSealed(record.task_id, "was read without its key: its payload cannot be changed")
            return record
        codec = self.codec
        if codec is None:
            return record
        extras = dict(record.extras)
        payload = _payload(record) | extras.pop(_UNKNOWN, {})
        plain = json.dumps({"k": _KIND, "t": record.task_id, "f": payload}, separators=(",", ":"))
        extras[SEALED] = codec.seal(plain.encode())
        return replace(record, **_empty(), extras=extras)

    def open(self, record: TaskRecord) -> TaskRecord:
        """The record with its payload back; a plain record as it is.

        Raises:
            RecordSealed: No key ring, or none of its keys opens the token, or the token is not
                this task's (copied from another record) or not a task record at all.
        """
        token = record.extras.get(SEALED)
        if token is None:
            return record
        codec = self.codec
        if codec is None:
            raise RecordSealed(record.task_id, "no key ring is configured to open it")
        try:
            sealed = json.loads(codec.unseal(str(token)))
            if not isinstance(sealed, dict) or sealed.get("k") != _KIND or not isinstance(sealed.get("f"), dict):
                raise RecordSealed(record.task_id, "its token is not a task record")
        except (InvalidRequestState, ValueError, UnicodeDecodeError):
            raise RecordSealed(record.task_id, "no key of the ring opens it") from None
        if sealed.get("t") != record.task_id:
            raise RecordSealed(record.task_id, "its token belongs to another task")
        fields: dict[str, Any] = sealed["f"]
        extras = {k: v for k, v in record.extras.items() if k != SEALED}
        unknown = {k: v for k, v in fields.items() if k not in PAYLOAD_FIELDS}
        if unknown:
            extras[_UNKNOWN] = unknown
        return replace(record, **{k: v for k, v in fields.items() if k in PAYLOAD_FIELDS}, extras=extras)

    def is_current(self, record: TaskRecord) -> bool | None:
        """Whether a stored (unopened) record is sealed under the ring's first key (None: cannot tell)."""
        token = record.extras.get(SEALED)
        if token is None:
            return False
        if self._current is None:
            return None
        try:
            self._current.unseal(str(token))
        except InvalidRequestState:
            return False
        return True


class SealedStore(WrappedStore):
    """Any `TaskStore`, with the payload of every record sealed on write and opened on read.

    Args:
        store: The store that holds the records (SQLite, Redis, PostgreSQL, yours).
        seal: The key ring (`RecordSeal`).
        strict: What a record the ring cannot open becomes when read: `RecordSealed` raised (the
            task runtime: a flow must never run from an empty journal), or, for tools
            (`strict=False`), the record with its payload still sealed (`record.sealed` True).

    Every ability of a store (`mrtr.stores._abilities`: its clock, its wake index, batch loads,
    the replay guard's ledger, a fleet's bus and `where`) is the wrapped store's, forwarded
    unchanged: the guards (`has_clock(sealed)`, ...) answer for the wrapped store, and a
    forwarded call it cannot serve is a `TypeError`.
    """

    def __init__(self, store: TaskStore, seal: RecordSeal, *, strict: bool = True) -> None:
        self.inner = store
        self.seal = seal
        self.strict = strict

    def _open(self, record: TaskRecord) -> TaskRecord:
        if self.strict:
            return self.seal.open(record)
        try:
            return self.seal.open(record)
        except RecordSealed:
            return record

    async def create(self, record: TaskRecord) -> None:
        stored = self.seal.seal(record)
        await self.inner.create(stored)
        record.version = stored.version

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        record = await self.inner.load(task_id, now)
        return None if record is None else self._open(record)

    async def load_many(self, task_ids: list[str], now: float) -> list[TaskRecord | None]:
        found = await load_many(self.inner, task_ids, now)
        return [None if record is None else self._open(record) for record in found]

    async def save(self, record: TaskRecord) -> bool:
        stored = self.seal.seal(record)
        if not await self.inner.save(stored):
            return False
        record.version = stored.version
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        return await self.inner.claimable(now, limit)

    async def purge_expired(self, now: float) -> int:
        return await self.inner.purge_expired(now)

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        page = await self.inner.list_tasks(query, now)
        opened = []
        for record in page.records:
            try:
                opened.append(self.seal.open(record))
            except RecordSealed:
                opened.append(record)  # a listing shows what it can; `load` decides about using it
        return TaskPage(opened, page.next_cursor)

    async def count_by_status(self, now: float) -> dict[str, int]:
        return await self.inner.count_by_status(now)

    async def flows(self, now: float) -> list[str]:
        return await self.inner.flows(now)

    async def count_expired(self, now: float) -> int:
        return await self.inner.count_expired(now)

    async def close(self) -> None:
        await self.inner.close()

    # -- the wrapped store's abilities, forwarded ---------------------------------------------

    async def next_wake(self, now: float) -> float | None:
        inner = self.inner
        if not has_next_wake(inner):
            raise _lacks(inner, "wake index (next_wake)")
        return await inner.next_wake(now)

    async def clock(self) -> float:
        inner = self.inner
        if not has_clock(inner):
            raise _lacks(inner, "clock")
        return await inner.clock()

    async def claim_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        inner = self.inner
        if not is_round_ledger(inner):
            raise _lacks(inner, "round ledger")
        return await inner.claim_round(round_id, digest, owner, lease, expires_at)

    async def renew_round(self, round_id: str, owner: str, lease: float) -> bool:
        inner = self.inner
        if not is_round_ledger(inner):
            raise _lacks(inner, "round ledger")
        return await inner.renew_round(round_id, owner, lease)

    async def finish_round(self, round_id: str, owner: str, outcome: str) -> bool:
        inner = self.inner
        if not is_round_ledger(inner):
            raise _lacks(inner, "round ledger")
        return await inner.finish_round(round_id, owner, outcome)

    async def finish_round_linked(
        self, round_id: str, owner: str, outcome: str, next_round: str | None, stepped: bool
    ) -> bool:
        inner = self.inner
        if not can_rewind_rounds(inner):
            raise _lacks(inner, "rewinding round ledger")
        return await inner.finish_round_linked(round_id, owner, outcome, next_round, stepped)

    async def finish_and_claim(
        self,
        finished: str,
        outcome: str,
        next_round: str | None,
        stepped: bool,
        round_id: str,
        digest: str,
        owner: str,
        lease: float,
        expires_at: float,
    ) -> tuple[str, str | None]:
        inner = self.inner
        if not can_pipeline_rounds(inner):
            raise _lacks(inner, "pipelining round ledger")
        return await inner.finish_and_claim(
            finished, outcome, next_round, stepped, round_id, digest, owner, lease, expires_at
        )

    async def rewind_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        inner = self.inner
        if not can_rewind_rounds(inner):
            raise _lacks(inner, "rewinding round ledger")
        return await inner.rewind_round(round_id, digest, owner, lease, expires_at)

    async def save_round_progress(self, round_id: str, owner: str, progress: str) -> bool:
        inner = self.inner
        if not has_round_progress(inner):
            raise _lacks(inner, "round progress")
        return await inner.save_round_progress(round_id, owner, progress)

    async def round_progress(self, round_id: str) -> str | None:
        inner = self.inner
        if not has_round_progress(inner):
            raise _lacks(inner, "round progress")
        return await inner.round_progress(round_id)

    async def purge_rounds(self) -> int:
        inner = self.inner
        if not is_round_ledger(inner):
            raise _lacks(inner, "round ledger")
        return await inner.purge_rounds()

    def fleet_bus(self) -> BrokerBus | None:
        inner = self.inner
        if not is_shared(inner):
            raise _lacks(inner, "fleet bus")
        return inner.fleet_bus()

    @property
    def where(self) -> str:
        inner = self.inner
        if not is_shared(inner):
            raise _lacks(inner, "shared location (where)")
        return inner.where


def _lacks(store: TaskStore, ability: str) -> TypeError:
    return TypeError(f"the store SealedStore wraps, a {type(store).__name__}, has no {ability}")


@dataclass
class Resealed:
    """What `reseal` did: records rewritten, already sealed under the first key, or unopenable."""

    rewritten: int = 0
    current: int = 0
    unreadable: int = 0
    busy: int = 0
    """Records that kept changing under the rewrite: a live instance wrote them (sealed, if it has the ring)."""


async def reseal(
    store: TaskStore,
    seal: RecordSeal,
    now: float,
    *,
    batch: int = 200,
    on_batch: Callable[[Resealed], None] | None = None,
) -> Resealed:
    """Rewrite every live record of `store` sealed under `seal`'s first key: plain ones, and those
    sealed under an older key of the ring, so the older key can leave the ring.

    A page of `batch` records at a time (the store's own paged listing), each one a
    compare-and-set on its version: a record a live instance changes meanwhile is read again
    and rewritten from what it now holds, so nothing the fleet writes is lost.
    """
    if not seal.active:
        raise ValueError("reseal needs a key ring to seal with")
    raw = store.inner if isinstance(store, SealedStore) else store
    sealed = SealedStore(raw, seal)
    done = Resealed()
    cursor: str | None = None
    while True:
        page = await raw.list_tasks(TaskQuery(limit=batch, cursor=cursor), now)
        for record in page.records:
            await _reseal_one(raw, sealed, record, now, done)
        if on_batch is not None:
            on_batch(done)
        if page.next_cursor is None:
            return done
        cursor = page.next_cursor


async def _reseal_one(
    raw: TaskStore, sealed: SealedStore, record: TaskRecord | None, now: float, done: Resealed
) -> None:
    for _ in range(5):
        if record is None:
            return  # expired or purged meanwhile
        if sealed.seal.is_current(record):
            done.current += 1
            return
        try:
            opened = sealed.seal.open(record)
        except RecordSealed:
            done.unreadable += 1
            return
        if await sealed.save(opened):
            done.rewritten += 1
            return
        record = await raw.load(record.task_id, now)
    done.busy += 1


__all__ = ["PAYLOAD_FIELDS", "RecordSeal", "RecordSealed", "Resealed", "SealedStore", "reseal"]
