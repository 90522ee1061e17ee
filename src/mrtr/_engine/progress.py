"""Progress from inside a flow: `ctx.report_progress(progress, total, message)`.

One call, three destinations, chosen by where the flow runs:

- inline (a round of a `tools/call`, any protocol): the request's own progress notification
  (`notifications/progress`, sent when the client gave a progress token);
- in a durable task: the task's `statusMessage`, which `tasks/get`, `notifications/tasks`,
  `mrtr tasks show` and the console show. A task has no request to notify, and its client
  polls; the status message is the one field every tasks client displays.

A report is neither an ask nor a step: nothing is journaled, and a run that replays its
journal (the next round, a task resumed elsewhere) does not report again what the flow
reported before its journal's frontier (`Replay.at_frontier`).

A task's reports are coalesced (`ThrottledStatus`): the first is written at once, later ones
at most once per `interval`, always the latest. A flow reporting in a tight loop costs a
bounded number of store writes, and the store keeps the last message of each interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from mrtr._engine.branches import outside_branch

logger = logging.getLogger("mrtr.progress")

STATUS_INTERVAL = 0.5
"""Seconds between two status writes of one task run (the first report is written at once)."""

STATUS_MAX_CHARS = 512
"""A status message is a line for people: longer ones are cut (with an ellipsis) before they are stored."""


class ProgressSink(Protocol):
    """Where a durable task's progress reports go (`ThrottledStatus`): a call that must not block."""

    def report(self, progress: float, total: float | None, message: str | None) -> None: ...


def status_text(progress: float, total: float | None, message: str | None) -> str:
    """The `statusMessage` a report makes: its message, else "`progress` of `total`" (or the bare count)."""
    if message is not None:
        text = message
    elif total is not None:
        text = f"{progress:g} of {total:g}"
    else:
        text = f"{progress:g}"
    if len(text) > STATUS_MAX_CHARS:
        text = text[: STATUS_MAX_CHARS - 1] + "…"
    return text


class ThrottledStatus:
    """A task run's progress reports, written as its status message: the latest, at most once per `interval`.

    Args:
        write: Stores one status message (and tells listeners). Its errors are the run's
            business (a lost lease, a store down): a failed write is logged and dropped, the
            next report tries again.
        interval: Seconds between two writes.
        clock: Monotonic seconds (replaceable in tests).

    `report` never waits: it notes the message and, when no write is under way or scheduled,
    starts one in the background. `close` stops it (the run's final write says where the
    task ended, status message included).
    """

    def __init__(
        self,
        write: Callable[[str], Awaitable[None]],
        *,
        interval: float = STATUS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._interval = interval
        self._clock = clock
        self._latest: str | None = None
        self._written: str | None = None
        self._last_write = float("-inf")
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0
        """Status writes made so far (what the throttle bounds)."""
        self.closed = False

    def report(self, progress: float, total: float | None, message: str | None) -> None:
        if self.closed:
            return
        self._latest = status_text(progress, total, message)
        if self._latest != self._written and (self._writer is None or self._writer.done()):
            with outside_branch():  # the writer is mrtr's, not one of the flow's branches
                self._writer = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while True:
            delay = self._last_write + self._interval - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            latest = self._latest
            if latest is None or latest == self._written:
                return
            self._last_write = self._clock()
            self.writes += 1
            try:
                await self._write(latest)
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # a lost lease or a store down: the run itself finds out
                logger.debug("could not write a task's status message: %r", exc)
                return
            self._written = latest

    async def close(self) -> None:
        """Stop writing: a write under way is cancelled (its compare-and-set is all or nothing)."""
        self.closed = True
        writer = self._writer
        if writer is not None and not writer.done():
            writer.cancel()
            await asyncio.wait([writer])  # a cancel of the caller itself still reaches it


__all__ = ["STATUS_INTERVAL", "STATUS_MAX_CHARS", "ProgressSink", "ThrottledStatus", "status_text"]
