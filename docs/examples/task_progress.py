"""The durable tasks guide's progress example: `ctx.report_progress` becomes the task's `statusMessage`.

`main` creates the task with the official client (declaring the tasks extension), holds the
second chunk open and reads `tasks/get` meanwhile: it says "chunk 2 of 3". Run by
`tests/integration/test_docs_examples.py`; `tests/fleet/test_task_progress.py` checks the same on
both hosts and every store.
"""

from __future__ import annotations

import asyncio
import os

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

import mrtr
from mrtr.client import CreatedTask, TasksClient, get_task

held = asyncio.Event()


async def index_chunk(n: int) -> int:
    if n == 2:
        await held.wait()  # the example holds chunk 2 open to read the task meanwhile
    return n


def build() -> mrtr.Flows:
    server = MCPServer("indexer", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
    flows = mrtr.Flows(server, store=mrtr.SQLiteStore(":memory:"))

    # --8<-- [start:progress]
    @flows.tool(task="required")
    async def reindex(ctx: mrtr.FlowContext) -> str:
        for n in (1, 2, 3):
            await ctx.report_progress(n, 3, f"chunk {n} of 3")  # the task's statusMessage
            await ctx.step(f"chunk-{n}", index_chunk, n)
        return "reindexed"

    # --8<-- [end:progress]
    return flows


async def nothing_to_answer(request: object) -> object:
    raise AssertionError("reindex asks nothing")


async def main() -> None:
    flows = build()
    async with Client(flows.server, extensions=[TasksClient(nothing_to_answer)]) as client:
        created = await client.session.call_tool("reindex", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)  # the task, not its result: the client opted in
        task_id = created.task_id
        async with asyncio.timeout(10):
            while (task := await get_task(client.session, task_id)).status_message != "chunk 2 of 3":
                await asyncio.sleep(0.02)
        assert task.status == "working", task.status
        held.set()
        async with asyncio.timeout(10):
            while (task := await get_task(client.session, task_id)).status != "completed":
                await asyncio.sleep(0.02)
    await flows.runtime.close()
    print("tasks/get said 'chunk 2 of 3' while chunk 2 ran")


if __name__ == "__main__":
    asyncio.run(main())
