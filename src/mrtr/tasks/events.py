"""`TaskEvents`: the one place a task engine reports committed state changes.

Whatever writes a task record (the runtime's lease-holding writes, the extension's
compare-and-set answers and cancels, or another task engine later) calls `changed(before,
after)` after its write committed. When the task's visible state moved (status, status
message, outstanding input requests, result, error: what `tasks/get` shows, heartbeats
aside), the full `DetailedTask` is published on the server's `SubscriptionBus` as a
`TaskChanged` event, which listen streams that asked for the task's id turn into
`notifications/tasks`, on whichever instance holds them. Publishing is best effort: a bus
that fails is logged, never the write's problem (clients that listen also refetch).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from mrtr.buses.events import TaskChanged
from mrtr.stores.base import TaskRecord
from mrtr.tasks.wire import detailed_task

logger = logging.getLogger(__name__)


class Bus(Protocol):
    """The publishing half of the SDK's `SubscriptionBus`."""

    async def publish(self, event: Any) -> None: ...


def _visible(record: TaskRecord) -> tuple[Any, ...]:
    return (record.status, record.status_message, record.input_requests, record.result, record.error)


class TaskEvents:
    """Publishes a task's `DetailedTask` on `bus` each time its visible state changes (no bus: nothing)."""

    def __init__(self, bus: Bus | None = None) -> None:
        self.bus = bus

    async def changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        """Report a committed write: `before` is the record the writer replaced (None on create)."""
        if self.bus is None or (before is not None and _visible(before) == _visible(after)):
            return
        event = TaskChanged(task_id=after.task_id, task=detailed_task(after), version=after.version)
        try:
            await self.bus.publish(event)
        except Exception:  # the write stands; listeners refetch after any gap
            logger.exception("task %s: could not publish its state change", after.task_id)


__all__ = ["Bus", "TaskEvents"]
