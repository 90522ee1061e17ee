"""`run_worker(flows)`: a Temporal worker for a `Flows`' task flows, in a process of its own.

MCP servers built with `TemporalTasks(client, ..., worker=False)` only create and read
tasks; their steps then run wherever `run_worker` runs, e.g.:

    async def main() -> None:
        client = await Client.connect("temporal:7233")
        flows = build_flows(TemporalTasks(client, task_queue="mcp-tasks", worker=False))
        await mrtr.temporal.run_worker(flows)   # until cancelled (Ctrl-C, SIGTERM)

The flows must be registered exactly as on the MCP servers (same names, same code version).
"""

from __future__ import annotations

from typing import Any

from mrtr.temporal._tasks import TemporalTasks


async def run_worker(flows: Any) -> None:
    """Serve `flows`' task flows as a Temporal worker until cancelled.

    Args:
        flows: A `mrtr.Flows` built with `tasks=TemporalTasks(...)`, its task flows registered.
    """
    engine = flows.runtime
    if not isinstance(engine, TemporalTasks):
        raise TypeError("run_worker needs Flows(server, tasks=TemporalTasks(...))")
    try:
        await engine.serve()
    finally:
        await engine.close()


__all__ = ["run_worker"]
