"""What travels on a bus: the SDK's listen events, mrtr's task event, and their wire text.

The SDK's `SubscriptionBus` carries typed `ServerEvent` values (`ToolsListChanged`,
`PromptsListChanged`, `ResourcesListChanged`, `ResourceUpdated`). mrtr adds two:

- `TaskChanged`: a task's state changed; `task` is its `DetailedTask` exactly as `tasks/get`
  shows it, delivered to listen streams that asked for its id (`notifications.taskIds`).
- `BusGap`: never sent, only raised locally by a fleet bus after it reconnects to its broker:
  events may have been lost while it was away, so mrtr's listen handler ends its streams and
  clients re-listen and refetch (the SDK's rule for any dropped stream).

Both carry a `uri` that no resource subscription names, so the SDK's own listen handler,
which matches every non-list event by `event.uri`, passes them over instead of raising.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)

_NO_URI = "\x00mrtr"
"""The `uri` of mrtr's own events: not a URI, so no `resourceSubscriptions` entry matches it."""


@dataclass(frozen=True, eq=False)
class TaskChanged:
    """A task's state changed; `task` is its full `DetailedTask` (the `notifications/tasks` params)."""

    task_id: str
    task: Mapping[str, Any] = field(repr=False)
    version: int | None = None
    """The record's store version: newer states have larger ones (clients drop stale arrivals)."""

    @property
    def uri(self) -> str:
        return _NO_URI


@dataclass(frozen=True)
class BusGap:
    """This instance's bus lost its broker for a while: events may be missing; re-listen and refetch."""

    @property
    def uri(self) -> str:
        return _NO_URI


_LISTS: dict[str, Any] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


def event_body(event: Any) -> dict[str, Any] | None:
    """The JSON body of an event for the broker, or None for one that stays on this instance."""
    if isinstance(event, ToolsListChanged):
        return {"e": "tools"}
    if isinstance(event, PromptsListChanged):
        return {"e": "prompts"}
    if isinstance(event, ResourcesListChanged):
        return {"e": "resources"}
    if isinstance(event, ResourceUpdated):
        return {"e": "resource", "uri": event.uri}
    if isinstance(event, TaskChanged):
        return {"e": "task", "id": event.task_id, "task": dict(event.task), "v": event.version}
    return None


def event_from_body(body: Mapping[str, Any]) -> Any | None:
    """The event a broker message carries, or None if this version does not know its kind."""
    kind = body.get("e")
    if isinstance(kind, str) and kind in _LISTS:
        return _LISTS[kind]
    if kind == "resource" and isinstance(body.get("uri"), str):
        return ResourceUpdated(uri=body["uri"])
    if kind == "task" and isinstance(body.get("id"), str) and isinstance(body.get("task"), dict):
        version = body.get("v")
        return TaskChanged(task_id=body["id"], task=body["task"], version=version if isinstance(version, int) else None)
    return None


def dumps(body: Mapping[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


__all__ = ["BusGap", "TaskChanged", "dumps", "event_body", "event_from_body"]
