"""Delivering events to a task: one compare-and-set on its record, from any process.

An event is appended to the task's `inbox` and its id to `event_ids` (so a resend with the
same `event_id` is recognised, before or after the flow consumed it). If the task is parked
on a wait for that event name, the same write makes it claimable at once (`lease_until` 0):
whichever instance's scanner looks next resumes it, and `TaskRuntime.send_event` claims it
on the spot. A run that is going on meanwhile sees the event when it settles (its final
write re-reads the inbox; see `TaskRuntime._write`), so no delivery falls between a run's
look at the inbox and its parking.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from mrtr._backoff import equal_jitter
from mrtr._engine.waits import check_event_name, taken_events
from mrtr._errors import EventNotDelivered
from mrtr._wire import InboxEvent
from mrtr.stores._base import TaskRecord, TaskStore

MAX_EVENT_BYTES = 64 * 1024
"""The largest event payload (as JSON) a task accepts."""
MAX_INBOX = 1000
"""Undelivered events one task may hold; past that, sends are refused until it consumes some."""
EVENT_IDS_KEPT = 10_000
"""How many recent event ids a task remembers for deduplication."""
_CAS_RETRIES = 64
"""Compare-and-set attempts of one send: a burst of N senders to one task needs about N rounds
between them (one wins each), so 60 at once under load lost 20 tries now and then."""
_CAS_BACKOFF = 0.002
"""Seconds before the first retry of a lost compare-and-set (doubling, jittered)."""
_CAS_BACKOFF_CAP = 0.1
"""The longest wait between two tries: all 64 take at most about 6 s."""


def new_event(name: str, payload: Any, event_id: str | None, now: float) -> InboxEvent:
    """The inbox entry for an event, checked: a plain name, a JSON payload, a sane size."""
    check_event_name(name)
    try:
        size = len(json.dumps(payload, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"event {name!r}: the payload must be JSON ({exc})") from None
    if size > MAX_EVENT_BYTES:
        raise ValueError(f"event {name!r}: the payload is {size:,} bytes of JSON; the limit is {MAX_EVENT_BYTES:,}")
    if event_id is not None and (not isinstance(event_id, str) or not 0 < len(event_id) <= 200):
        raise ValueError("event_id must be a non-empty string of at most 200 characters")
    return {"id": event_id or secrets.token_urlsafe(16), "name": name, "data": payload, "at": round(now, 3)}


def waits_for(record: TaskRecord, name: str) -> bool:
    """Whether the task's parked run waits for event `name`."""
    return any(w.get("kind") == "event" and w.get("name") == name for w in record.waiting)


def parked(record: TaskRecord, now: float) -> bool:
    """Parked on waits, no worker holding it: an event it waits for must wake it."""
    return record.status == "working" and bool(record.waiting) and (record.lease_owner is None)


async def deliver(
    store: TaskStore, task_id: str, event: InboxEvent, now: float, known: TaskRecord | None = None
) -> tuple[bool, TaskRecord]:
    """Put `event` (from `new_event`) in the task's inbox; returns (delivered now, the record).

    False with the stored record: the event id was delivered before (idempotent resend).

    Raises:
        EventNotDelivered: The task is unknown or expired, finished, or kept changing under us.
    """
    record = known if known is not None else await store.load(task_id, now)
    for attempt in range(_CAS_RETRIES):
        if record is None:
            raise EventNotDelivered(f"no task {task_id!r} (unknown or expired)", reason="unknown_task", task_id=task_id)
        if record.sealed:  # read without its key: its inbox is sealed, an event put beside it would be lost
            raise EventNotDelivered(
                f"task {task_id!r} is sealed at rest and no key given opens it", reason="sealed", task_id=task_id
            )
        if event["id"] in record.event_ids:
            return False, record
        if record.terminal:
            raise EventNotDelivered(
                f"task {task_id!r} is {record.status}: nothing will wait for event {event['name']!r} any more",
                reason="task_finished",
                task_id=task_id,
            )
        if len(record.inbox) >= MAX_INBOX:
            raise EventNotDelivered(
                f"task {task_id!r} holds {MAX_INBOX} undelivered events already",
                reason="inbox_full",
                task_id=task_id,
            )
        changes: dict[str, Any] = {
            "inbox": [*record.inbox, event],
            "event_ids": [*record.event_ids, event["id"]][-EVENT_IDS_KEPT:],
            "updated_at": now,
        }
        if parked(record, now) and waits_for(record, event["name"]):
            changes["lease_until"] = 0.0  # claimable now: the next scan (or the sender) resumes it
        changed = record.copy(**changes)
        if await store.save(changed):
            return True, changed
        # Lost the compare-and-set to another writer: back off (jittered) before the next try, so
        # a burst of senders to one task spreads out instead of colliding on every try.
        await asyncio.sleep(equal_jitter(attempt, _CAS_BACKOFF, _CAS_BACKOFF_CAP))
        record = await store.load(task_id, now)
    raise EventNotDelivered(f"task {task_id!r} kept changing; send the event again", reason="busy", task_id=task_id)


def settle_inbox(record: TaskRecord, journal_steps: dict[str, tuple[str, Any]], now: float) -> TaskRecord:
    """The record a run ends with: consumed events out of the inbox, and woken at once if an
    event it now waits for arrived while it ran."""
    taken = taken_events(journal_steps)
    inbox = [e for e in record.inbox if e.get("id") not in taken]
    record = record.copy(inbox=inbox) if len(inbox) != len(record.inbox) else record
    if record.status == "working" and record.waiting and any(waits_for(record, e.get("name", "")) for e in inbox):
        record = record.copy(lease_until=0.0)
    return record


__all__ = [
    "EVENT_IDS_KEPT",
    "MAX_EVENT_BYTES",
    "MAX_INBOX",
    "deliver",
    "new_event",
    "parked",
    "settle_inbox",
    "waits_for",
]
