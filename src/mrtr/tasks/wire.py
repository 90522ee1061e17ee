"""The tasks extension's wire: its methods' parameters, the `Task` object, task identity.

Shared by the server (`extension`, `runtime`, `seed_dialect`) and read by nothing that
runs flows; importing it pulls in no engine.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

from mcp_types import RequestParams
from pydantic import Field

from mrtr.spec import TASKS_EXTENSION
from mrtr.stores.base import TaskRecord

IDEMPOTENCY_KEY = "mrtr/idempotencyKey"
"""`params._meta` key of a task-augmented `tools/call` that makes task creation idempotent."""
RELATED_TASK = "io.modelcontextprotocol/related-task"


class TaskRequestParams(RequestParams):
    task_id: str = Field(min_length=1)


class UpdateTaskParams(TaskRequestParams):
    input_responses: dict[str, Any]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_fields(record: TaskRecord) -> dict[str, Any]:
    """The wire `Task` object (SEP-2663): the fields every task response carries."""
    fields: dict[str, Any] = {
        "taskId": record.task_id,
        "status": record.status,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.updated_at),
        "ttlMs": record.ttl_ms,
        "pollIntervalMs": record.poll_interval_ms,
    }
    if record.status_message is not None:
        fields["statusMessage"] = record.status_message
    return fields


def detailed_task(record: TaskRecord) -> dict[str, Any]:
    """The `DetailedTask`: what `tasks/get` answers and `notifications/tasks` carries."""
    detailed = task_fields(record)
    if record.status == "input_required":
        detailed["inputRequests"] = record.input_requests
    elif record.status == "completed" and record.result is not None:
        detailed["result"] = record.result
    elif record.status == "failed" and record.error is not None:
        detailed["error"] = record.error
    return detailed


def owner_tag(principal: str | None) -> str | None:
    """What a task stores about its creator: a digest of the SDK's principal, never the identity."""
    if principal is None:
        return None
    return hashlib.sha256(b"mrtr/task-owner\0" + principal.encode("utf-8", "surrogatepass")).hexdigest()


def same_owner(stored: str | None, caller: str | None) -> bool:
    """Tasks created without authentication stay open to everyone (as before ownership existed)."""
    return stored is None or (caller is not None and hmac.compare_digest(stored, caller))


def keyed_task_id(owner: str | None, flow: str, key: str) -> str:
    """The task id a (creator, tool, idempotency key) always maps to: 144 bits, like a random one."""
    raw = "\0".join(("mrtr/task-id", owner or "", flow, key)).encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:18]).decode()


__all__ = [
    "IDEMPOTENCY_KEY",
    "RELATED_TASK",
    "TASKS_EXTENSION",
    "TaskRequestParams",
    "detailed_task",
    "UpdateTaskParams",
    "iso",
    "keyed_task_id",
    "owner_tag",
    "same_owner",
    "task_fields",
]
