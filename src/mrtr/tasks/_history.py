"""A task's history, for people: one row per entry, as the console's task page and
`mrtr tasks show` print it (what ran, how long it took, and who acted)."""

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


__all__ = ["history_row", "iso"]
