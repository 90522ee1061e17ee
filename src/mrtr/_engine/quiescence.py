"""When has a flow done all it can before the client answers? Accounting, task by task.

A round may end only when no task of the flow can make progress without an answer. Each
task the flow started (see `branches`) is classified:

- *done*, or *parked* on an unanswered ask: quiet;
- *runnable*: not waiting on anything, or waiting on a future that is already done (its
  wake-up is scheduled): busy;
- waiting on a *timer* (`asyncio.sleep`) or on a *thread*
  (`asyncio.to_thread`, `run_in_executor`): busy until that future completes — time or
  the thread will move it forward without the client;
- waiting on anything else — a sibling task, a `gather`, a `TaskGroup`, an `Event`, a
  `Queue`, a `Lock`: quiet, because only another task of the flow can wake it, and those
  are all quiet too. So is a timeout (`asyncio.wait_for`, `asyncio.timeout`) around parked
  work: an ask counts as answered at once, however long the person takes.

Steps are counted separately (`Replay`): a running step always keeps the round open.

asyncio exposes what a task waits on only through `Task._fut_waiter`, timers through
`loop._scheduled`, and thread hand-offs through the callback `_chain_future` registers;
these names have been stable since Python 3.4. Where a loop implementation lacks them,
`Busy.UNKNOWN` tells the caller to fall back to watching for activity instead.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Set
from typing import Any


class Busy(enum.Enum):
    RUNNABLE = "runnable"
    UNKNOWN = "unknown"


def classify(tasks: Iterable[asyncio.Task[Any]], parked: Set[asyncio.Task[Any]]) -> Busy | asyncio.Future[Any] | None:
    """`None` when every task is quiet; else what keeps the flow busy (a future to await, or why)."""
    waited: list[asyncio.Future[Any]] = []
    for task in tasks:
        if task.done() or task in parked:
            continue
        try:
            waiter: asyncio.Future[Any] | None = task._fut_waiter  # type: ignore[attr-defined]
        except AttributeError:
            return Busy.UNKNOWN
        if waiter is None or waiter.done():
            return Busy.RUNNABLE
        if _fed_by_thread(waiter):
            return waiter
        waited.append(waiter)
    if waited:
        return _first_timed(waited)
    return None


def _fed_by_thread(future: asyncio.Future[Any]) -> bool:
    for callback, *_ in getattr(future, "_callbacks", None) or ():
        if getattr(callback, "__qualname__", "").startswith("_chain_future."):
            return True
    return False


# A timeout (`asyncio.wait_for`'s) only races the work it guards; when that work is parked
# on an ask, the client's think time is not the flow's time: the ask is answered "at once".
_TIMEOUTS = frozenset({"_release_waiter"})


def _first_timed(waited: list[asyncio.Future[Any]]) -> asyncio.Future[Any] | None:
    """The first of `waited` that a scheduled timer will complete (a sleeping branch)."""
    scheduled = getattr(asyncio.get_running_loop(), "_scheduled", None)
    if not scheduled:
        return None
    ids = {id(f): f for f in waited}
    for handle in scheduled:
        if handle.cancelled() or getattr(handle._callback, "__name__", "") in _TIMEOUTS:
            continue
        for arg in handle._args or ():
            if id(arg) in ids:
                return ids[id(arg)]
    return None


__all__ = [
    "Busy",
    "classify",
]
