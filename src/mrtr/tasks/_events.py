"""`TaskEvents`: task state changes as `notifications/tasks`, on the server's bus.

Every task engine reports each committed state change through one hook
(`TaskEngine.on_change`, see `mrtr.tasks._seam`): on creation, on an answer or a cancel,
and where a run ends (asking, completed, failed, cancelled). `Flows` points that hook at
`TaskEvents.publish`, which puts the full `DetailedTask` (exactly what `tasks/get` shows
at that moment) on the server's `SubscriptionBus` as a `TaskChanged` event; listen streams
that asked for the task's id turn it into `notifications/tasks`, on whichever instance
holds them. Publishing is best effort: a bus that fails is logged, never the write's
problem (clients that listen also refetch after any gap).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from mrtr._wire import TaskView
from mrtr.buses._events import TaskChanged
from mrtr.tasks._records import detailed_task

logger = logging.getLogger("mrtr.tasks.events")


class Bus(Protocol):
    """The publishing half of the SDK's `SubscriptionBus`."""

    async def publish(self, event: Any) -> None: ...


class TaskEvents:
    """Publishes a task's `DetailedTask` on `bus` each time an engine reports a change."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def publish(self, record: TaskView) -> None:
        """An engine's `on_change`: `record` is the task's state as just committed."""
        # The store version orders a task's states: listeners drop stale arrivals by it.
        event = TaskChanged(task_id=record.task_id, task=detailed_task(record), version=record.version)
        try:
            await self.bus.publish(event)
        except Exception:  # the write stands; listeners refetch after any gap
            logger.exception("task %s: could not publish its state change", record.task_id)


__all__ = ["Bus", "TaskEvents"]
