"""Temporal as mrtr's task engine (the `mrtr[temporal]` extra).

    from temporalio.client import Client
    from mrtr.temporal import TemporalTasks

    client = await Client.connect("localhost:7233")
    flows = mrtr.Flows(server, tasks=TemporalTasks(client, task_queue="mcp-tasks"))

Every MCP task becomes one Temporal workflow (workflow id = task id) whose history holds the
flow's journal; each step of the flow runs as one activity, on whichever worker takes it.
The same flow code runs on either engine. Modules:

- `tasks`: `TemporalTasks`, the engine (create, get, update, cancel; the in-process worker).
- `workflow`: the one generic workflow every task runs as.
- `activity`: the step activity, which advances a flow with mrtr's own replay engine.
- `shapes`: the dataclasses that cross Temporal.
- `worker`: `run_worker(flows)`, a worker in a process of its own.
- `codec`: `SealingCodec`, which seals every payload Temporal keeps with the server's key ring
  (installed by `TemporalTasks` unless `Flows(seal_at_rest=False)`; also what a codec endpoint
  for Temporal's UI decodes with).
"""

from __future__ import annotations

try:
    import temporalio  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("mrtr.temporal needs the temporal extra: pip install 'mrtr[temporal]'") from exc

from mrtr.temporal._codec import SealingCodec, sealed_client
from mrtr.temporal._devserver import dev_server
from mrtr.temporal._tasks import TemporalTasks
from mrtr.temporal._worker import run_worker

__all__ = ["SealingCodec", "TemporalTasks", "dev_server", "run_worker", "sealed_client"]
