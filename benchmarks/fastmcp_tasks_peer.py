"""The fastmcp-tasks side of `benchmarks/fastmcp_tasks.py`; runs in ITS venv (`.venv-fastmcp-tasks`), never ours.

fastmcp-tasks pins its own FastMCP (`fastmcp-slim[server]==4.1.4`), so everything that imports it
runs under that venv's interpreter, started by `fastmcp_tasks.py`:

  serve REDIS_URL NAME   FastMCP + `TasksExtension(url=REDIS_URL, name=NAME)` (Docket on Redis, its
                         worker in this process), the two benchmark tools as `task=True`; prints its
                         port, serves until killed.
  drive                  FastMCP's own `Client` (its task driver is fastmcp-tasks' client half)
                         answering line-JSON commands on stdin (see `fastmcp_tasks.py`, "drivers").

Only the standard library, FastMCP, fastmcp-tasks and uvicorn are imported: nothing of mrtr.
"""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

# Run as a script, this directory leads sys.path, and its `fastmcp.py` would shadow FastMCP: drop
# it, and import the shared driver loop from the repository root (nothing there imports mrtr).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import mcp_types as t  # noqa: E402
from benchmarks.fastmcp_tasks_drive import drive, run_load, serve_app  # noqa: E402
from fastmcp import Client, Context, FastMCP  # noqa: E402  (after the path fix above)
from fastmcp_tasks import TasksExtension  # noqa: E402
from mcp.server.elicitation import render_elicitation_schema  # noqa: E402
from pydantic import BaseModel  # noqa: E402

ARGS = {"item": "x"}
EXPECTED = {"one_step": "done x", "one_answer": "go=True"}
QUESTION = "Go on?"
ASK_KEY = "go"
ASKED = "asked"


class Go(BaseModel):
    go: bool


# Built once, as a careful guard author would: rendering the schema per call is not the guard's cost.
GO_ASK = t.ElicitRequest(
    params=t.ElicitRequestFormParams(message=QUESTION, requested_schema=render_elicitation_schema(Go))
)


# -- server ------------------------------------------------------------------------------------


def build_app(redis_url: str, name: str) -> Any:
    mcp: Any = FastMCP("ft-bench")
    mcp.add_extension(TasksExtension(url=redis_url, name=name))

    @mcp.tool(task=True)
    async def one_step(item: str, ctx: Context) -> str:
        """The work, once, as a background task (Docket runs it once: its own durable unit)."""
        return f"done {item}" if ctx.is_background_task else "ran inline"

    @mcp.tool(task=True)
    async def one_answer(item: str, ctx: Context) -> str | t.InputRequiredResult:
        """The work, then one question: the task parks `input_required` until `tasks/update`.

        fastmcp-tasks refuses `await ctx.elicit(...)` in a background task ("use the guard pattern
        instead"), so this asks FastMCP's way: return `InputRequiredResult`, read the answer when
        the task re-runs.
        """
        if not ctx.is_background_task:
            return "ran inline"
        answers = ctx.input_responses
        reply = answers.get(ASK_KEY) if answers is not None else None
        if reply is None or ctx.request_state != ASKED:
            return t.InputRequiredResult(input_requests={ASK_KEY: GO_ASK}, request_state=ASKED)
        if not isinstance(reply, t.ElicitResult) or reply.action != "accept":
            return "not accepted"
        return f"go={Go.model_validate(reply.content).go}"

    return mcp.http_app()


def serve(redis_url: str, name: str) -> None:
    serve_app(build_app(redis_url, name))


# -- driver: FastMCP's own client --------------------------------------------------------------


async def answer(message: str, response_type: Any, params: Any, context: Any) -> Any:
    if message != QUESTION:
        raise RuntimeError(f"unexpected question {message!r}")
    return {"go": True}


class Driver:
    """Open clients by URL; one call per `lat` command, a window of concurrent loops per `load`."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self.stack = stack
        self.clients: dict[str, Any] = {}

    @staticmethod
    def client(url: str) -> Any:
        return Client(url, elicitation_handler=answer, timeout=30)

    async def call(self, client: Any, tool: str) -> None:
        result = await client.call_tool(tool, ARGS)
        text = "".join(getattr(block, "text", "") for block in result.content)
        if text != EXPECTED[tool]:
            raise RuntimeError(f"{tool} returned {text!r}, expected {EXPECTED[tool]!r}")

    async def lat(self, url: str, tool: str) -> dict[str, Any]:
        if url not in self.clients:
            self.clients[url] = await self.stack.enter_async_context(self.client(url))
        start = time.perf_counter()
        await self.call(self.clients[url], tool)
        return {"s": time.perf_counter() - start}

    async def load(self, url: str, tool: str, clients: int, warmup: float, seconds: float) -> None:
        await run_load(lambda: self.client(url), lambda c: self.call(c, tool), clients, warmup, seconds)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "drive":
        asyncio.run(drive(Driver))
    else:
        sys.exit(f"usage: {sys.argv[0]} serve REDIS_URL NAME | drive")
