"""The store contract: the task record, the `TaskStore` protocol, and the round-ledger verdict.

Backends (`sqlite`, `redis`, `postgres`) import this module; the package `__init__`
re-exports it and picks a backend from a URL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from mrtr._wire import TERMINAL, HistoryEntry, InboxEvent, InputRequests, TaskStatus, Wait


class TaskExists(Exception):
    """`create` was given a task id that is already stored."""


@dataclass
class TaskRecord:
    """Everything about one task; stored whole, as JSON, with a few indexed columns."""

    task_id: str
    flow: str
    """The registered flow (tool) name."""
    arguments: dict[str, Any]
    capabilities: dict[str, Any]
    """The client capabilities declared by the request that created the task (wire JSON)."""
    status: TaskStatus
    created_at: float
    updated_at: float
    ttl_ms: int | None
    poll_interval_ms: int
    journal: str
    """The flow's journal, encoded with `mrtr._engine.journal.encode`."""
    status_message: str | None = None
    input_requests: InputRequests = field(default_factory=dict)
    """Outstanding asks (wire `InputRequest`s by key) while `input_required`."""
    responses: dict[str, Any] = field(default_factory=dict)
    """Answers received through `tasks/update`, not yet consumed by a run of the flow."""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    lease_owner: str | None = None
    lease_until: float = 0.0
    """Epoch seconds before which no worker may claim the task: the live worker's lease (it
    renews it), or, while a run is parked in `working` on a timer or an event, its wake time
    (`WAIT_FOREVER` for an event with no timeout). Stores index it for `working` tasks, so it
    is also the due-time index: sleeping tasks cost no scan."""
    version: int = 0
    """Bumped by every successful `save`; `save` succeeds only from the stored version."""
    owner: str | None = None
    """Digest of the principal that created the task (`mrtr.tasks._runtime.owner_tag`); None if unauthenticated."""
    attempt: int = 1
    """Counts the task's runs from the top by an operator (`TaskAdmin.rerun`): 1 until it is re-run."""
    history: list[HistoryEntry] = field(default_factory=list)
    """What ran, newest last, bounded (`HISTORY_KEPT`): each step that really ran, with its duration
    and, if it raised, the error's text (`{"at", "kind": "step", "key", "seconds", "attempt",
    "error"?}`), and operator actions (`{"at", "kind": "rerun" | "cancel", ...}`). For people
    (the console): replay reads the journal, never this."""
    waiting: list[Wait] = field(default_factory=list)
    """What the parked run waits for besides the client: `{"kind": "timer", "until": t}` and
    `{"kind": "event", "name": n, "until": t | None}` (empty while it runs or asks only)."""
    inbox: list[InboxEvent] = field(default_factory=list)
    """Events delivered and not yet consumed by the flow: `{"id", "name", "data", "at"}`."""
    event_ids: list[str] = field(default_factory=list)
    """Ids of the events accepted lately, newest last (`send_event(event_id=)` deduplication)."""
    extras: dict[str, Any] = field(default_factory=dict, repr=False)
    """Fields written by a newer mrtr that this one does not know: carried through every rewrite."""

    @property
    def sealed(self) -> bool:
        """The payload (arguments, journal, answers, result, ...) is still sealed: the record was
        read without a key that opens it (`mrtr.stores.SealedStore`), so those fields are empty
        here, not empty in the task. Tools show "sealed" for them, and never write it back."""
        return SEALED in self.extras

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_ms is None else self.created_at + self.ttl_ms / 1000

    @property
    def claimable(self) -> bool:
        """Needs a worker: running work (status `working`), whether or not a lease is held."""
        return self.status == "working"

    def to_json(self) -> str:
        # Shallow on purpose: `asdict` deep-copies every nested value first, and runs on
        # every write (it cost ~5% of a loaded server's time in benchmarks/tasks.py).
        data = {name: getattr(self, name) for name in _FIELDS}
        return json.dumps(data | self.extras if self.extras else data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskRecord:
        # Fields a newer server added are kept aside and written back unchanged, so a
        # rolling upgrade can read both ways and an older instance's write loses nothing.
        data = json.loads(text)
        extras = {k: v for k, v in data.items() if k not in _KNOWN}
        return cls(**{k: v for k, v in data.items() if k in _KNOWN}, extras=extras)

    def copy(self, **changes: Any) -> TaskRecord:
        return replace(self, **changes)


SEALED = "sealed"
"""The stored record's field holding its sealed payload (`mrtr.stores._sealed`); absent in a plain record."""

HISTORY_KEPT = 200
"""How many `TaskRecord.history` entries a task keeps (the oldest go first)."""

WAIT_FOREVER = 253402300799.0
"""`lease_until` of a task parked on an event with no timeout (9999-12-31T23:59:59Z)."""

_FIELDS = tuple(name for name in TaskRecord.__dataclass_fields__ if name != "extras")
_KNOWN = frozenset(_FIELDS)


@dataclass(frozen=True)
class TaskQuery:
    """Which tasks `TaskStore.list_tasks` returns: newest first, a page at a time."""

    statuses: tuple[str, ...] = ()
    """Only these statuses (empty: every status)."""
    flow: str | None = None
    """Only tasks of this flow (tool)."""
    id_prefix: str | None = None
    """Only tasks whose id starts with this (a search box; ordered by id, not age)."""
    limit: int = 50
    cursor: str | None = None
    """Where the page starts: the `next_cursor` of the page before (opaque)."""
    waiting: str | None = None
    """Only tasks that wait for this (one of `WAITS`, see `waits_for`)."""
    created_before: float | None = None
    """Only tasks created before this epoch second (an operator's "older than")."""


@dataclass(frozen=True)
class TaskPage:
    """One page of `list_tasks`: records newest first (`created_at`, then `task_id`, descending)."""

    records: list[TaskRecord]
    next_cursor: str | None
    """Pass as `TaskQuery.cursor` for the next page; None on the last one."""


def page_cursor(record: TaskRecord) -> str:
    """The keyset cursor after `record`: its creation time and id (stable while tasks come and go)."""
    return f"{record.created_at!r}/{record.task_id}"


def read_cursor(cursor: str | None) -> tuple[float, str] | None:
    """`page_cursor`'s (created_at, task_id), or None; a malformed cursor is a `ValueError`."""
    if not cursor:
        return None
    created, sep, task_id = cursor.partition("/")
    try:
        return float(created), task_id if sep else ""
    except ValueError:
        raise ValueError(f"not a task page cursor: {cursor!r}") from None


STATUSES: tuple[TaskStatus, ...] = ("working", "input_required", "completed", "failed", "cancelled")

WAITS = ("input", "timer", "event", "callback", "nothing")
"""What a task can wait for (`TaskQuery.waiting`): the client's input (`input_required`), a
timer, an event, an event a callback URL delivers, or nothing (`working`, running or queued for a
worker). Finished tasks wait for nothing of these."""


def waits_for(record: TaskRecord) -> set[str]:
    """Which of `WAITS` the task waits for (the reference every store's `TaskQuery.waiting` matches)."""
    if record.status == "input_required":
        return {"input"}
    if record.status != "working":
        return set()
    kinds = {"callback" if wait.get("via") == "callback" else str(wait.get("kind")) for wait in record.waiting}
    return kinds or {"nothing"}


def wait_statuses(query: TaskQuery) -> tuple[str, ...] | None:
    """The statuses a query can match once its wait filter is applied; None: it matches nothing.

    A wait narrows the status (`input` is `input_required`, the rest `working`), so stores
    read the status index, and filter the (few) unfinished rows on their waits.

    Raises:
        ValueError: `query.waiting` is not one of `WAITS`.
    """
    if query.waiting is None:
        return query.statuses
    if query.waiting not in WAITS:
        raise ValueError(f"waiting takes one of {', '.join(WAITS)}, not {query.waiting!r}")
    status = "input_required" if query.waiting == "input" else "working"
    if query.statuses and status not in query.statuses:
        return None
    return (status,)


class TaskStore(Protocol):
    """The contract every store meets (see tests/fleet/test_stores.py, run against all three).

    What a store may do besides (its clock, a wake index, batch loads, the replay guard's
    ledger, being shared by a fleet) is named in `mrtr.stores._abilities`.
    """

    async def create(self, record: TaskRecord) -> None:
        """Store a new record at `record.version` (normally 0).

        Raises:
            TaskExists: The id is taken by a record not yet past its TTL (an expired one
                counts as absent, as in `load`, and is replaced).
        """
        ...

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        """The record, or None when unknown or past its TTL (`expires_at <= now`)."""
        ...

    async def save(self, record: TaskRecord) -> bool:
        """Atomically replace the stored record iff its stored version is `record.version`.

        On success the stored version (and `record.version`) becomes `record.version + 1`.
        Returns False, changing nothing, on a version conflict or an unknown/expired id.
        """
        ...

    async def claimable(self, now: float, limit: int) -> list[str]:
        """Ids of unexpired `working` tasks whose lease has run out (`lease_until < now`)."""
        ...

    async def purge_expired(self, now: float) -> int:
        """Delete records past their TTL; returns how many."""
        ...

    # -- listing and administration (the console, `mrtr tasks`): indexed, fast at 100,000 tasks --

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        """A page of unexpired tasks matching `query`, newest first.

        Raises:
            ValueError: `query.cursor` is not a cursor this store gave out.
        """
        ...

    async def count_by_status(self, now: float) -> dict[str, int]:
        """How many unexpired tasks are in each status (every status present, 0 if none)."""
        ...

    async def flows(self, now: float) -> list[str]:
        """The flow (tool) names of the stored tasks, sorted (for a filter's choices)."""
        ...

    async def count_expired(self, now: float) -> int:
        """How many tasks are past their TTL and not purged yet (what `purge_expired` would delete)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def round_verdict(row: tuple[str, str | None] | None, digest: str) -> tuple[str, str | None]:
    """What a lost `claim_round` means, from the stored round's (digest, outcome).

    `row` is None only when the round vanished between the claim and this read (it
    expired): the caller simply claims again.
    """
    if row is None:
        return "retry", None
    stored_digest, outcome = row
    if stored_digest != digest:
        return "forked", None
    if outcome is not None:
        return "done", outcome
    return "busy", None


RoundRow = tuple[str, float, str | None, bool, bool | None, str | None]
"""A round as a SQL ledger keeps it: digest, lease until, outcome, superseded, stepped (None: not
recorded, a round an older mrtr finished: treated as stepped), next round."""


def rewind_plan(rows: Mapping[str, RoundRow], round_id: str, digest: str, now: float) -> tuple[str, list[str]]:
    """What `rewind_round` does (`mrtr.stores._abilities.RoundRewinding`), from the flow's rounds.

    Returns the verdict and, when it is `"claimed"`, the later rounds of the branch left behind,
    in order (the last may be one handed out but never claimed: absent from `rows`), which the
    caller marks superseded in the same transaction as it takes `round_id` over.
    """
    row = rows.get(round_id)
    if row is None:
        return "retry", []
    stored, lease_until, outcome, superseded, stepped, link = row
    if superseded:
        return "superseded", []
    if stored == digest:
        return "same", []
    if outcome is None:
        return ("busy" if lease_until >= now else "forked"), []
    if stepped is not False:  # a step finished in it, or it is not known whether one did
        return "forked", []
    later: list[str] = []
    while link is not None and link not in later and link != round_id:
        after = rows.get(link)
        if after is not None and after[3]:
            break  # superseded already, and so is everything after it
        later.append(link)
        if after is None:
            break  # handed out, never claimed
        _, lease_until, outcome, _, stepped, link = after
        if outcome is None:
            return ("busy" if lease_until >= now else "forked"), []
        if stepped is not False:
            return "forked", []
    return "claimed", later


__all__ = [
    "HISTORY_KEPT",
    "RoundRow",
    "rewind_plan",
    "SEALED",
    "STATUSES",
    "WAIT_FOREVER",
    "TaskPage",
    "TaskQuery",
    "page_cursor",
    "read_cursor",
    "TaskExists",
    "TaskRecord",
    "TaskStore",
    "WAITS",
    "round_verdict",
    "wait_statuses",
    "waits_for",
]
