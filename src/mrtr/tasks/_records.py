"""How a stored task shows on the wire, and who it belongs to.

`task_view` / `detailed_view` turn a task (a `TaskView`, whatever engine holds it) into the
extension's typed shapes
(`mrtr._wire`); `owner_tag`, `same_owner` and `keyed_task_id` are task identity: a digest
of the creator, never the identity, and ids derived from idempotency keys.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

from mrtr._wire import TERMINAL, WAITING, CreateTaskResult, DetailedTask, Task, TaskView, Wait, iso


def task_view(record: TaskView) -> Task:
    """The wire `Task` object (SEP-2663): the fields every task response carries."""
    return Task(
        task_id=record.task_id,
        status=record.status,
        status_message=record.status_message,
        created_at=iso(record.created_at),
        last_updated_at=iso(record.updated_at),
        ttl_ms=record.ttl_ms,
        poll_interval_ms=record.poll_interval_ms,
    )


def created_result(record: TaskView) -> CreateTaskResult:
    """What a task-augmented call answers instead of the tool's result."""
    return CreateTaskResult.model_validate(task_view(record).model_dump())


def detailed_view(record: TaskView) -> DetailedTask:
    """The `DetailedTask`: what `tasks/get` answers and `notifications/tasks` carries."""
    detailed = DetailedTask.model_validate(task_view(record).model_dump())
    if record.status == "input_required":
        detailed.input_requests = record.input_requests
    elif record.status == "completed" and record.result is not None:
        detailed.result = record.result
    elif record.status == "failed" and record.error is not None:
        detailed.error = record.error
    if record.waiting and record.status not in TERMINAL:
        detailed.meta = {WAITING: [waiting_wire(wait) for wait in record.waiting]}
    return detailed


def waiting_wire(wait: Wait) -> dict[str, Any]:
    """One durable wait as clients see it: its kind, the event's name, and its due time (ISO 8601)."""
    shown: dict[str, Any] = {"kind": wait.get("kind")}
    if (name := wait.get("name")) is not None:
        shown["name"] = name
    if (until := wait.get("until")) is not None:
        shown["until"] = iso(until)
    return shown


def task_fields(record: TaskView) -> dict[str, Any]:
    """`task_view(record)` as sent."""
    return task_view(record).wire()


def detailed_task(record: TaskView) -> dict[str, Any]:
    """`detailed_view(record)` as sent."""
    return detailed_view(record).wire()


def owner_tag(principal: str | None) -> str | None:
    """What a task stores about its creator: a digest of the SDK's principal, never the identity."""
    if principal is None:
        return None
    return hashlib.sha256(b"mrtr/task-owner\0" + principal.encode("utf-8", "surrogatepass")).hexdigest()


def same_owner(stored: str | None, caller: str | None) -> bool:
    """Tasks created without authentication stay open to everyone (as before ownership existed)."""
    return stored is None or (caller is not None and hmac.compare_digest(stored, caller))


def new_task_id() -> str:
    """A fresh task id: 144 random bits, URL-safe, never starting with `-`.

    A leading dash would read as an option on every command line that takes the id
    (`mrtr tasks show -KQAL...` is "no such option: -K"), one id in 64.
    """
    while True:
        task_id = secrets.token_urlsafe(18)
        if not task_id.startswith("-"):
            return task_id


def keyed_task_id(owner: str | None, flow: str, key: str) -> str:
    """The task id a (creator, tool, idempotency key) always maps to: 144 bits, like a random one."""
    raw = "\0".join(("mrtr/task-id", owner or "", flow, key)).encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:18]).decode()


__all__ = [
    "new_task_id",
    "created_result",
    "detailed_task",
    "detailed_view",
    "keyed_task_id",
    "owner_tag",
    "same_owner",
    "task_fields",
    "task_view",
    "waiting_wire",
]
