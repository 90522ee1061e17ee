"""Durable tasks: the `io.modelcontextprotocol/tasks` extension (SEP-2663) and its lease runtime.

`Flows(server, store=...)` wires all of this; these names are for building it by hand
(`TasksExtension(engine)` for `MCPServer(extensions=[...])`), for writing a task engine of
your own (`TaskEngine`), and for the wire shapes. Clients follow tasks with
`mrtr.client` (`TasksClient`, `follow_task`), which imports none of this.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mrtr._wire import (
        IDEMPOTENCY_KEY,
        TASKS_EXTENSION,
        TERMINAL,
        CreateTaskResult,
        DetailedTask,
        Task,
        TaskRequestParams,
        TaskStatus,
        UpdateTaskParams,
    )
    from mrtr.tasks._admin import BulkOutcome, TaskAdmin, TaskSealed, TaskUnknown
    from mrtr.tasks._export import export_task
    from mrtr.tasks._extension import TasksExtension
    from mrtr.tasks._fork import StepUnknown
    from mrtr.tasks._records import detailed_view, task_view
    from mrtr.tasks._runtime import TaskRuntime
    from mrtr.tasks._seam import Creator, EngineOptions, TaskCall, TaskEngine, TaskView
    from mrtr.tasks._worker import LeaseLost

_EXPORTS = {
    "IDEMPOTENCY_KEY": "mrtr._wire",
    "TASKS_EXTENSION": "mrtr._wire",
    "TERMINAL": "mrtr._wire",
    "CreateTaskResult": "mrtr._wire",
    "DetailedTask": "mrtr._wire",
    "Task": "mrtr._wire",
    "TaskRequestParams": "mrtr._wire",
    "TaskStatus": "mrtr._wire",
    "UpdateTaskParams": "mrtr._wire",
    "Creator": "mrtr.tasks._seam",
    "EngineOptions": "mrtr.tasks._seam",
    "TaskCall": "mrtr.tasks._seam",
    "TaskAdmin": "mrtr.tasks._admin",
    "BulkOutcome": "mrtr.tasks._admin",
    "TaskSealed": "mrtr.tasks._admin",
    "TaskUnknown": "mrtr.tasks._admin",
    "StepUnknown": "mrtr.tasks._fork",
    "export_task": "mrtr.tasks._export",
    "LeaseLost": "mrtr.tasks._worker",
    "TaskEngine": "mrtr.tasks._seam",
    "TaskView": "mrtr.tasks._seam",
    "TaskRuntime": "mrtr.tasks._runtime",
    "TasksExtension": "mrtr.tasks._extension",
    "detailed_view": "mrtr.tasks._records",
    "task_view": "mrtr.tasks._records",
}

__all__ = [
    "BulkOutcome",
    "CreateTaskResult",
    "Creator",
    "DetailedTask",
    "EngineOptions",
    "IDEMPOTENCY_KEY",
    "LeaseLost",
    "StepUnknown",
    "TASKS_EXTENSION",
    "TERMINAL",
    "Task",
    "TaskAdmin",
    "TaskCall",
    "TaskEngine",
    "TaskView",
    "TaskRequestParams",
    "TaskRuntime",
    "TaskStatus",
    "TaskSealed",
    "TaskUnknown",
    "TasksExtension",
    "UpdateTaskParams",
    "detailed_view",
    "export_task",
    "task_view",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mrtr.tasks' has no attribute {name!r}")
    return getattr(import_module(module), name)
