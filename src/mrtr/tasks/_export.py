"""One task as one JSON document (`mrtr tasks export`): what `mrtr replay` replays at home.

The document holds the record (status, timestamps, attempt, owner tag), the arguments and the
client capabilities the flow ran with, the journal twice, and the history, result and error.
The journal's `wire` form is the journal exactly as stored (every field, those of newer mrtr
versions too), for replay; its `entries` are the same journal for people, numbered: the steps
in the order they finished, then the answers in the order they were given, then the asks
still outstanding. A divergence found by replay names an entry by that number.
"""

from __future__ import annotations

import time
from typing import Any

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr._engine.waits import CALLBACK_PREFIX, EVENT_PREFIX, TIMER
from mrtr._wire import iso
from mrtr.stores._base import TaskRecord

FORMAT = "mrtr.task-export"
VERSION = 1


class ExportSealed(ValueError):
    """The record is sealed at rest and no key given opens it: an export would hold nothing."""


def export_task(record: TaskRecord, *, now: float | None = None) -> dict[str, Any]:
    """`record` as one JSON-ready document (see the module docstring).

    Raises:
        ExportSealed: The record was read without a key that opens it (`record.sealed`).
        mrtr._engine.journal.JournalFormatError: Its journal cannot be read.
    """
    if record.sealed:
        raise ExportSealed(
            f"task {record.task_id!r} is sealed at rest: exporting it needs the key ring that opens it "
            "(MRTR_STATE_KEY or --key-file)"
        )
    journal = journal_codec.decode(record.journal)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exportedAt": iso(time.time() if now is None else now),
        "task": {
            "taskId": record.task_id,
            "flow": record.flow,
            "status": record.status,
            "statusMessage": record.status_message,
            "createdAt": iso(record.created_at),
            "updatedAt": iso(record.updated_at),
            "ttlMs": record.ttl_ms,
            "attempt": record.attempt,
            "owner": record.owner,
            "waiting": record.waiting,
            "inputRequests": record.input_requests,
            "pendingEvents": record.inbox,
        },
        "arguments": record.arguments,
        "capabilities": record.capabilities,
        "journal": {
            "flowId": journal.flow_id,
            "startedAt": iso(journal.started_at),
            "rounds": journal.rounds,
            "entries": journal_entries(journal, outstanding=not record.terminal),
            "wire": journal.to_wire(),
        },
        "history": record.history,
        "result": record.result,
        "error": record.error,
    }


def journal_entries(journal: Journal, *, outstanding: bool = True) -> list[dict[str, Any]]:
    """The journal's entries for people, numbered from 0: steps, then answers, then outstanding asks
    (`outstanding=False`, for a finished task: none; its journal may still name the last round's).

    Read from the wire form, so an entry shows whatever the journal holds for it: an answer entry
    carries its question's digest (`question`) and the answer, and under `recorded` anything more
    the journal keeps about that ask (beside the answer, or in a table of its own keyed by the
    same key: a newer journal's question text, title, time and principal).
    """
    wire = journal.to_wire()
    entries: list[dict[str, Any]] = []
    for key, (digest, value, *_) in (wire.get("s") or {}).items():
        entry: dict[str, Any] = {"kind": step_kind(key), "key": key, "result": value}
        if entry["kind"] == "step":
            entry |= {"arguments": digest, "idempotencyKey": f"{journal.flow_id}:{key}"}
        entries.append(entry)
    tables = {name: table for name, table in wire.items() if name not in _PLAIN and isinstance(table, dict)}
    for key, (digest, answer, *more) in (wire.get("a") or {}).items():
        entry = {"kind": "answer", "key": key, "question": digest, "answer": answer}
        recorded: dict[str, Any] = {name: table[key] for name, table in tables.items() if key in table}
        if more:
            recorded["entry"] = more
        if recorded:
            entry["recorded"] = recorded
        asked = recorded.get("q")
        if isinstance(asked, dict):  # what was asked (`mrtr._engine.questions`), for the person reading
            entry |= {name: asked[short] for short, name in _ASKED.items() if asked.get(short) is not None}
        entries.append(entry)
    for key, digest in journal.pending.items() if outstanding else ():
        entries.append({"kind": "ask", "key": key, "question": digest})
    return [{"index": index} | entry for index, entry in enumerate(entries)]


_ASKED = {"q": "questionText", "t": "title", "k": "askKind", "a": "askedAt", "r": "answeredAt"}
"""A journal's question note (wire field `q`), spelled out on its answer's entry."""

_PLAIN = frozenset("vftnaspmow")
"""Wire fields that hold no per-ask record (version, ids, counters, the answer/step/pending tables, markers)."""


def step_kind(key: str) -> str:
    """`step`, or the durable wait a journal step key stands for: `timer`, `event`, `callback`."""
    name = key.rpartition("/")[2]
    if name.startswith(TIMER):
        return "timer"
    if name.startswith(EVENT_PREFIX):
        return "event"
    if name.startswith(CALLBACK_PREFIX):
        return "callback"
    return "step"


__all__ = ["FORMAT", "VERSION", "ExportSealed", "export_task", "journal_entries", "step_kind"]
