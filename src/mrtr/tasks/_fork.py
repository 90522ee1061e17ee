"""Forking a finished task from one of its steps (`TaskAdmin.rerun(task_id, from_step=...)`).

DBOS's "fork a workflow from a step", on mrtr's journal: the steps journaled before the chosen
one are kept, so a new run replays them; the chosen step and every step journaled after it are
cut, so they run again. Answers have no order of their own in the journal, so they are cut by
the engine instead: the journal remembers the fork point (`Journal.fork_from`), and the run
that reaches it drops the answers it has not used by then (`Replay._forked`): those asks come
after the step, and are asked again. Everything here is a pure change of the record; the
caller writes it with the store's compare-and-set.
"""

from __future__ import annotations

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal, JournalFormatError
from mrtr._wire import HistoryEntry
from mrtr.stores._base import HISTORY_KEPT, TaskRecord


class StepUnknown(ValueError):
    """The task has no step of that name (neither journaled nor in its history)."""


def step_name(key: str) -> str:
    """A journal step key's step name: `charge` for `charge`, `charge#2` and `0.1/charge`."""
    return key.rpartition("/")[2].partition("#")[0]


def fork_point(journal: Journal, history: list[HistoryEntry], name: str) -> str:
    """The journal key to fork at: `name` itself if it is a step key (`charge#2`, `0.1/charge`),
    else the first step of that name; a step that raised (in the history, never journaled)
    counts too.

    Raises:
        StepUnknown: No step of the task has that key or name.
    """
    ran = [str(entry["key"]) for entry in history if entry.get("kind") == "step" and entry.get("key")]
    for keys in (list(journal.steps), ran):
        if name in keys:
            return name
        named = [key for key in keys if step_name(key) == name]
        if named:
            return named[0]
    known = list(dict.fromkeys([*journal.steps, *ran]))
    shown = ", ".join(repr(k) for k in known[:20]) + (", ..." if len(known) > 20 else "")
    raise StepUnknown(f"the task has no step {name!r}; its steps: {shown or 'none'}")


def fork_change(record: TaskRecord, from_step: str, now: float, by: str | None = None) -> TaskRecord:
    """`record`, forked at step `from_step`: back to `working` under a new attempt, with no worker,
    its journal cut at that step (see the module docstring), and the fork in its history.

    Raises:
        ValueError: The task has not finished (only completed, failed or cancelled tasks fork),
            or its journal cannot be read.
        StepUnknown: No such step.
    """
    if not record.terminal:
        raise ValueError(
            f"task {record.task_id!r} is {record.status}: only finished tasks (completed, failed, cancelled) "
            "fork; cancel it first"
        )
    try:
        journal = journal_codec.decode(record.journal)
    except JournalFormatError as exc:
        raise ValueError(f"task {record.task_id!r}: its journal cannot be read, so it cannot fork ({exc})") from None
    try:
        key = fork_point(journal, record.history, from_step)
    except StepUnknown as exc:
        raise StepUnknown(f"task {record.task_id!r}: {exc}") from None
    keys = list(journal.steps)
    if key in keys:
        for later in keys[keys.index(key) :]:
            del journal.steps[later]
    journal.fork_from = key
    journal.pending = {}
    journal.reworded = 0
    attempt = record.attempt + 1
    entry: HistoryEntry = {"at": round(now, 3), "kind": "fork", "step": key, "attempt": attempt}
    if by:
        entry["by"] = by
    message = f"forked from step {key!r} by {by or 'an operator'} (attempt {attempt})"
    return new_attempt(record, journal, now, message, entry)


def new_attempt(record: TaskRecord, journal: Journal, now: float, message: str, entry: HistoryEntry) -> TaskRecord:
    """`record` back to `working` for a new attempt on `journal` (a re-run's or a fork's).

    Whatever the last attempt ended with or waited for is cleared, no worker holds it, and its
    deadline counts afresh from `now`; `entry` says in the history who started the attempt and why.
    """
    journal.started_at = now
    return record.copy(
        status="working",
        status_message=message,
        result=None,
        error=None,
        input_requests={},
        responses={},
        waiting=[],
        cancel_requested=False,
        lease_owner=None,
        lease_until=0.0,
        attempt=record.attempt + 1,
        journal=journal_codec.encode(journal),
        history=[*record.history, entry][-HISTORY_KEPT:],
        updated_at=now,
    )


__all__ = ["StepUnknown", "fork_change", "fork_point", "new_attempt", "step_name"]
