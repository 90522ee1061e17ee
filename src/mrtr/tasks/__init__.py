"""Durable tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663), split by role.

- `wire`: the extension's method parameters, the wire `Task` object, task identity.
- `extension`: the SDK `Extension` serving `tasks/get`, `tasks/update`, `tasks/cancel`.
- `engine`: the `TaskEngine` protocol every engine meets (the lease runtime, `mrtr.temporal`).
- `runtime`: `TaskRuntime`, which runs flows as tasks under a lease and resumes them anywhere;
  `lease_ops`: its reads, answers and cancels over the store.
- `outcome`: where a run of a flow leaves its task (shared by the engines).
- `seed_dialect`: SEP-2322's original `tasks/result` + `tasks/input_response`, opt-in.
- `client`: following tasks from the client side (`TasksClient`, `follow_task`).

Names load on first use, so a client importing `mrtr.tasks.client` pulls in no server code.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "TasksExtension": "extension",
    "TaskRuntime": "runtime",
    "TaskEngine": "engine",
    "LeaseLost": "runtime",
    "TaskRequestParams": "wire",
    "UpdateTaskParams": "wire",
    "IDEMPOTENCY_KEY": "wire",
    "TASKS_EXTENSION": "wire",
    "task_fields": "wire",
    "TasksClient": "client",
    "CreatedTask": "client",
    "TaskSnapshot": "client",
    "TaskCancelled": "client",
    "follow_task": "client",
    "get_task": "client",
    "update_task": "client",
    "cancel_task": "client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mrtr.tasks' has no attribute {name!r}")
    return getattr(import_module(f"mrtr.tasks.{module}"), name)
