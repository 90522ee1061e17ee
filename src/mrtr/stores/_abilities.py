"""What a store can do beyond the `TaskStore` contract, each ability named, and how to ask for it.

Every store keeps tasks. Some do more, and the code that uses the more asks with a type
guard (`has_clock(store)`, `is_shared(store)`, ...), never by probing for an attribute:

- `Clocked`: `clock()`, epoch seconds on the store's own clock (a fleet's instances measure
  their offsets from it, so leases and timers agree across hosts);
- `WakeIndexed`: `next_wake(now)`, the earliest wake of a parked task (the scanner sleeps
  until then instead of polling);
- `BatchLoading`: `load_many(ids, now)`, many records in one round trip (`load_many` below
  reads any store, a few ids at a time where it cannot batch);
- `RoundLedger`: where the replay guard (`mrtr._guard`) records rounds;
- `RoundPipelining`: a rewinding ledger that records a round's outcome and claims its flow's
  next round in one round trip (`finish_and_claim`: Redis);
- `RoundRewinding`: a ledger that links each round to the next and lets a client re-answer an
  earlier round ("Back") when no step finished since (`rewind_round`); without it, every
  re-answer is a fork and refused;
- `RoundProgress`: a round ledger that also keeps a claimed round's progress (the journal of a
  call's first round, checkpointed step by step), so a resend that takes the round over after
  its instance died resumes it instead of running its finished steps again (`mrtr._host.identity`);
- `SharedStore`: a store every instance of a fleet reaches (Redis, PostgreSQL; a SQLite file
  is one host's): all of the above, a fleet bus on the same broker (`fleet_bus()`) and where
  it is, password redacted, for logs (`where`).

SQLite, Redis and PostgreSQL stores have all four single abilities, and Redis and PostgreSQL
are also shared: each names its abilities as its bases, so a type checker holds it to them. A
store of your own has those whose methods its class defines, with or without such bases.

An ability is a method of the store's class, not an attribute an object happens to carry. A
store that wraps another (`WrappedStore`: `SealedStore`) forwards every ability, and has one
exactly when the store it wraps has it.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from typing_extensions import TypeIs

from mrtr.stores._base import TaskRecord, TaskStore

if TYPE_CHECKING:
    from mrtr.buses._base import BrokerBus


class Clocked(Protocol):
    async def clock(self) -> float:
        """Epoch seconds on the store's clock (Redis `TIME`, PostgreSQL `clock_timestamp()`, the SQLite host's)."""
        ...


class WakeIndexed(Protocol):
    async def next_wake(self, now: float) -> float | None:
        """The earliest `lease_until` later than `now` among `working` tasks, or None.

        The scanner sleeps until then (at most its scan interval), so a parked task's timer
        fires on time without polling the task.
        """
        ...


class BatchLoading(Protocol):
    async def load_many(self, task_ids: list[str], now: float) -> list[TaskRecord | None]:
        """`load` of each id, in order, in one round trip (one `MGET`, one `= ANY(...)` query)."""
        ...


class RoundLedger(Protocol):
    """The store side of the replay guard (`mrtr._guard.ReplayGuard`).

    Leases are compared on the ledger's own clock (Redis `TIME`, PostgreSQL `now()`, the
    SQLite host's clock), never on the calling instance's.
    """

    async def claim_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        """Atomically claim a round, returning one of:

        - `("claimed", None)`: absent or expired (inserted), or in flight with the same
          digest under a lapsed lease (taken over by `owner`);
        - `("forked", None)`: claimed with another digest;
        - `("done", outcome)`: finished with the same digest;
        - `("busy", None)`: in flight with the same digest under a live lease;
        - `("retry", None)`: it vanished mid-call; claim again;
        - `("superseded", None)`: only from a `RoundRewinding` ledger: the round belongs to a
          branch a client left by re-answering an earlier round.
        """
        ...

    async def renew_round(self, round_id: str, owner: str, lease: float) -> bool: ...

    async def finish_round(self, round_id: str, owner: str, outcome: str) -> bool:
        """Record the outcome iff `owner` still holds the round and none is recorded."""
        ...

    async def purge_rounds(self) -> int: ...

    async def close(self) -> None: ...


class RoundRewinding(RoundLedger, Protocol):
    """A round ledger that knows which round each round led to, so that a client may go "Back".

    `finish_round_linked` records, with the outcome, the round the outcome hands out next
    (`next_round`, None for a final answer) and whether a step finished during the round
    (`stepped`). `rewind_round` then lets other answers take an earlier, finished round over
    when neither it nor any round after it on its branch finished a step, and marks every
    later round of the branch left behind superseded (a claim of one: `"superseded"`).
    """

    async def finish_round_linked(
        self, round_id: str, owner: str, outcome: str, next_round: str | None, stepped: bool
    ) -> bool:
        """`finish_round`, also recording the link to `next_round` and whether a step finished."""
        ...

    async def rewind_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        """Re-answer a finished round with `digest`, atomically, returning one of:

        - `("claimed", None)`: taken over by `owner` with the new digest; every later round of
          the branch it led to is superseded;
        - `("forked", None)`: a step finished in it or after it on its branch, or a run of it
          or of a later round died unfinished (a step may have run): the fork stays refused;
        - `("busy", None)`: it or a later round of its branch is still running: try again;
        - `("same", None)`: it already carries `digest`: claim it as usual;
        - `("superseded", None)`: it is itself on a branch left behind;
        - `("retry", None)`: it vanished (expired): claim it as usual.
        """
        ...


class RoundPipelining(RoundRewinding, Protocol):
    """A ledger that records one round's outcome and claims the flow's next round in one round trip."""

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
        """`finish_round_linked` of `finished` (whose owner is `owner`), then `claim_round` of
        `round_id`, a round of the same flow; returns the claim's verdict."""


class RoundProgress(Protocol):
    """A round ledger that keeps a claimed round's progress beside it (`mrtr._host.identity`).

    Progress lives as long as its round (the same expiry); only the round's current owner may
    write it, and never once an outcome is recorded.
    """

    async def save_round_progress(self, round_id: str, owner: str, progress: str) -> bool:
        """Store `progress` iff `owner` holds the round and no outcome is recorded."""
        ...

    async def round_progress(self, round_id: str) -> str | None:
        """The progress last stored for the round (None: none, or the round is gone)."""
        ...


class SharedStore(TaskStore, Clocked, WakeIndexed, BatchLoading, RoundLedger, Protocol):
    """A store every instance of a fleet reaches: what a fleet's defaults are built on.

    Where one is configured, rounds are single-use fleet-wide by default (the replay guard
    records them in it) and listen streams ride a bus on its broker.
    """

    @property
    def where(self) -> str:
        """The store's URL or DSN, password redacted (`redacted`), for logs."""
        ...

    def fleet_bus(self) -> BrokerBus | None:
        """A fleet bus on the store's own broker and namespace; None when the store was built
        with connection options the bus cannot copy."""
        ...


class WrappedStore:
    """A store over another (`inner`): it forwards each ability, and has it only when `inner` does."""

    inner: TaskStore


def has_clock(store: object) -> TypeIs[Clocked]:
    """Whether `store` tells the time on its own clock (`Clocked`)."""
    return _offers(store, "clock")


def has_next_wake(store: object) -> TypeIs[WakeIndexed]:
    """Whether `store` tells when its next parked task falls due (`WakeIndexed`)."""
    return _offers(store, "next_wake")


def has_load_many(store: object) -> TypeIs[BatchLoading]:
    """Whether `store` loads many records in one round trip (`BatchLoading`)."""
    return _offers(store, "load_many")


def can_rewind_rounds(store: object) -> TypeIs[RoundRewinding]:
    """Whether the replay guard can let a client re-answer an earlier round in `store` (`RoundRewinding`)."""
    return all(_offers(store, name) for name in _REWIND)


def can_pipeline_rounds(store: object) -> TypeIs[RoundPipelining]:
    """Whether `store` records a round's outcome with its flow's next claim (`RoundPipelining`)."""
    return can_rewind_rounds(store) and _offers(store, "finish_and_claim")


def is_round_ledger(store: object) -> TypeIs[RoundLedger]:
    """Whether the replay guard can record rounds in `store` (`RoundLedger`)."""
    return all(_offers(store, name) for name in _LEDGER)


def has_round_progress(store: object) -> TypeIs[RoundProgress]:
    """Whether `store` keeps a claimed round's progress (`RoundProgress`: Redis, PostgreSQL)."""
    return _offers(store, "save_round_progress") and _offers(store, "round_progress")


def is_shared(store: object) -> TypeIs[SharedStore]:
    """Whether every instance of a fleet can share `store` (`SharedStore`: Redis, PostgreSQL)."""
    return all(_offers(store, name) for name in _SHARED)


_TASKS = ("create", "load", "save", "claimable", "purge_expired", "list_tasks", "count_by_status", "flows")
_LEDGER = ("claim_round", "renew_round", "finish_round", "purge_rounds", "close")
_REWIND = (*_LEDGER, "finish_round_linked", "rewind_round")
_SHARED = (*_TASKS, *_LEDGER, "count_expired", "clock", "next_wake", "load_many", "fleet_bus", "where")


def _offers(store: object, name: str) -> bool:
    """Whether `store`'s class defines `name`, and, for a wrapper, whether the store it wraps does."""
    while getattr(type(store), name, None) is not None:
        if not isinstance(store, WrappedStore):
            return True
        store = store.inner
    return False


_LOAD_AT_ONCE = 4
"""Loads in flight at once for a store without `load_many` (a pool must keep room for leases)."""


async def load_many(store: TaskStore, task_ids: Sequence[str], now: float) -> list[TaskRecord | None]:
    """`store.load` of each id, in order, in as few round trips as the store allows.

    A `BatchLoading` store reads them all at once; any other store a few ids at a time. Read
    one by one, 64 tasks on a store that takes 200 ms a call would take 13 s (a listen
    stream's snapshot of the tasks it was asked for).
    """
    if has_load_many(store):
        return await store.load_many(list(task_ids), now)
    gate = asyncio.Semaphore(_LOAD_AT_ONCE)

    async def one(task_id: str) -> TaskRecord | None:
        async with gate:
            return await store.load(task_id, now)

    return list(await asyncio.gather(*(one(task_id) for task_id in task_ids)))


def redacted(url: str) -> str:
    """`url` without its password, for logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


__all__ = [
    "BatchLoading",
    "Clocked",
    "RoundLedger",
    "RoundPipelining",
    "RoundRewinding",
    "RoundProgress",
    "SharedStore",
    "WakeIndexed",
    "WrappedStore",
    "has_clock",
    "has_load_many",
    "has_next_wake",
    "can_pipeline_rounds",
    "can_rewind_rounds",
    "has_round_progress",
    "is_round_ledger",
    "is_shared",
    "load_many",
    "redacted",
]
