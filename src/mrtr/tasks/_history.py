"""A task's history, for people: one row per entry, as the console's task page and
`mrtr tasks show` print it (what ran, how long it took, where, and who acted).

A step's run is one row: its start (written as its side effect begins) joined with its end.
A step that ran more than once (its worker was killed mid-step, and another instance ran it
again under the same idempotency key) shows one row per run, numbered, with the instance of
each, and which run finished: an operator sees that its effect may have happened twice."""

from __future__ import annotations

from mrtr._wire import HistoryEntry
from mrtr._wire import iso as wire_iso


def iso(ts: float) -> str:
    """A timestamp as operators read it: UTC, to the second (`2026-11-27T04:31:07Z`)."""
    return wire_iso(ts, timespec="seconds")


def history_row(entry: HistoryEntry) -> dict[str, str]:
    """`at`, `kind`, `attempt`, `what` (a step key), `took` and `outcome`, as text."""
    kind = str(entry.get("kind", ""))
    if kind == "step":
        seconds = entry.get("seconds")
        outcome = f"raised {entry['error']}" if entry.get("error") else "finished"
        what, took = str(entry.get("key", "")), f"{seconds * 1000:.1f} ms" if isinstance(seconds, int | float) else ""
    elif kind == "fork":
        what, took, outcome = str(entry.get("step", "")), "", f"forked by {entry.get('by') or 'an operator'}"
    else:
        what, took, outcome = "", "", f"by {entry.get('by') or 'an operator'}"
    at = entry.get("at")
    return {
        "at": iso(at) if isinstance(at, int | float) else "",
        "kind": kind,
        "attempt": str(entry.get("attempt", "")),
        "what": what,
        "took": took,
        "outcome": outcome,
    }


def history_rows(entries: list[HistoryEntry], running: bool = False) -> list[dict[str, str]]:
    """Rows for `entries`: `history_row`'s fields plus `run` (which run of its step), `where`
    (the instance) and `key` (the step's idempotency key); a step's start and end are one row.

    `running`: the task is still running, so a last start with no end is running, not cut short.
    """
    rows: list[dict[str, str]] = []
    runs: dict[str, int] = {}
    open_rows: dict[str, dict[str, str]] = {}  # step key -> the row of its run started and not ended
    for entry in entries:
        key = str(entry.get("key", ""))
        phase = entry.get("phase")
        if entry.get("kind") != "step" or phase not in ("start", "end"):
            row = history_row(entry)
            row |= {"run": "", "where": str(entry.get("instance", "")), "key": str(entry.get("idempotency_key", ""))}
            if entry.get("kind") == "step":  # written before starts were: an end on its own
                runs[key] = runs.get(key, 0) + 1
                row["run"] = str(runs[key])
            rows.append(row)
            continue
        if phase == "start":
            cut = open_rows.pop(key, None)
            if cut is not None:
                cut["outcome"] = "did not finish (its worker stopped)"
            runs[key] = runs.get(key, 0) + 1
            row = history_row(entry) | {
                "run": str(runs[key]),
                "where": str(entry.get("instance", "")),
                "key": str(entry.get("idempotency_key", "")),
                "outcome": "started",
            }
            open_rows[key] = row
            rows.append(row)
            continue
        ended = history_row(entry)
        started = open_rows.pop(key, None)
        if started is None:
            runs[key] = runs.get(key, 0) + 1
            where = {"where": str(entry.get("instance", "")), "key": str(entry.get("idempotency_key", ""))}
            rows.append(ended | {"run": str(runs[key])} | where)
        else:
            started["took"], started["outcome"] = ended["took"], ended["outcome"]
    for row in open_rows.values():
        row["outcome"] = "running" if running else "did not finish (its worker stopped)"
    for row in rows:  # "2 of 2": a step that ran more than once says so on every run
        if row["run"] and row["kind"] == "step":
            row["run"] = f"{row['run']} of {runs.get(row['what'], 1)}"
    return rows


__all__ = ["history_row", "history_rows", "iso"]
