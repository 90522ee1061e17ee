"""What travels on a bus: the SDK's listen events, mrtr's task event, and their wire text.

The SDK's `SubscriptionBus` carries typed `ServerEvent` values (`ToolsListChanged`,
`PromptsListChanged`, `ResourcesListChanged`, `ResourceUpdated`). mrtr adds two:

- `TaskChanged`: a task's state changed; `task` is its `DetailedTask` exactly as `tasks/get`
  shows it, delivered to listen streams that asked for its id (`notifications.taskIds`).
- `BusGap`: raised locally by a fleet bus when events may have been lost on their way to this
  instance. After a reconnect, or a gap in a sender's sequence numbers that nobody explained,
  nothing is known of what was lost (`known` is false): mrtr's listen handler ends its streams
  and clients re-listen and refetch (the SDK's rule for any dropped stream). When a sender had
  to drop events from its outbox, it says which tasks, URIs and lists they were about (a *loss
  notice*, `lost_key` below): the gap is `known`, and only the streams that watch one of them
  refetch, at once, without ending.

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
    """Events may be missing here: re-listen and refetch (all of them, or only what `known` names).

    With `known` false (a reconnect, or events lost in transit), any event may be missing.
    With `known` true, a sender dropped events about exactly these tasks, resource URIs and
    list kinds (`"tools"`, `"prompts"`, `"resources"`), and nothing else.
    """

    known: bool = False
    task_ids: frozenset[str] = frozenset()
    uris: frozenset[str] = frozenset()
    lists: frozenset[str] = frozenset()
    reason: str = "resubscribed"
    """Why: `resubscribed` (the bus reconnected), `dropped` (a sender's loss notice) or `lost` (a sequence gap)."""

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


def lost_key(body: Mapping[str, Any]) -> tuple[str, str]:
    """What a listener would have to refetch if the event with this body were lost: (kind, name)."""
    kind = body.get("e")
    if kind == "task":
        return "t", str(body.get("id"))
    if kind == "resource":
        return "u", str(body.get("uri"))
    return "l", str(kind)


def gap_from_notice(lost: Any) -> BusGap:
    """The `BusGap` a sender's loss notice describes (`"*"`, or anything unreadable: everything)."""
    if not isinstance(lost, Mapping):
        return BusGap(reason="dropped")

    def names(key: str) -> frozenset[str]:
        values = lost.get(key)
        return frozenset(v for v in values if isinstance(v, str)) if isinstance(values, list) else frozenset()

    return BusGap(known=True, task_ids=names("t"), uris=names("u"), lists=names("l"), reason="dropped")


def dumps(body: Mapping[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


__all__ = ["BusGap", "TaskChanged", "dumps", "event_body", "event_from_body", "gap_from_notice", "lost_key"]
