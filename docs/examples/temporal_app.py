"""The Temporal guide's example: the same flows, with tasks run as Temporal workflows.

Type-checked in `make test` (mypy) and imported by `tests/integration/test_docs_examples.py`;
it needs a Temporal service to run, so `main` only checks what it can without one. The same
wiring runs against a real dev server (`mrtr.temporal.dev_server()`) in
`tests/fleet/test_temporal.py`.
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from starlette.applications import Starlette

import mrtr


async def serve(server: MCPServer) -> Starlette:
    # --8<-- [start:app]
    from temporalio.client import Client

    from mrtr.temporal import TemporalTasks  # pip install 'mrtr[temporal]'

    client = await Client.connect("temporal.internal:7233")
    flows = mrtr.Flows(server, tasks=TemporalTasks(client, task_queue="mcp-tasks"))
    app = flows.streamable_http_app()  # this process also runs a Temporal worker
    # --8<-- [end:app]
    return app


async def worker_only(server: MCPServer) -> None:
    # --8<-- [start:worker]
    from temporalio.client import Client

    from mrtr.temporal import TemporalTasks, run_worker

    client = await Client.connect("temporal.internal:7233")
    flows = mrtr.Flows(server, tasks=TemporalTasks(client, task_queue="mcp-tasks", worker=False))
    # ... register the same flows as the MCP servers do, then:
    await run_worker(flows)
    # --8<-- [end:worker]


async def main() -> None:
    import mrtr.temporal

    server = MCPServer("t", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
    assert callable(serve) and callable(worker_only) and server.name == "t"
    assert {"TemporalTasks", "dev_server", "run_worker"} <= set(mrtr.temporal.__all__)


if __name__ == "__main__":
    asyncio.run(main())
