"""The MCP server Claude Code drives in tests/external/test_claude_code.py: `python server.py --port 0`.

Reads MRTR_STATE_KEY (hex, shared by every instance), MRTR_INSTANCE (label), MRTR_STORE (the
tasks' store URL, shared by every instance) and MRTR_GATES (a directory: a task's chunk n
waits until the file `chunk-<n>` exists there, so the test decides when a task may go on,
and knows it is mid-step when it kills the instance). Prints `claude-code-server ready: URL`.

- `book_trip`: MRTR rounds as a person meets them in Claude Code: one form, then two forms
  gathered into one round, then a last form. It declares `requires=["elicitation"]`.
- `reindex` (`task="required"`): three chunks, each announced with `ctx.report_progress`
  ("chunk n of 3": the task's status message), then a question (the task goes
  `input_required`), answered from Claude Code's task panel.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from mrtr.stores import open_store  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

INSTANCE = os.environ.get("MRTR_INSTANCE", "?")
READY = "claude-code-server ready:"


class City(BaseModel):
    city: str = Field(description="Where to")


class Dates(BaseModel):
    nights: int = Field(description="How many nights")


class Seat(BaseModel):
    seat: str = Field(description="window or aisle")


class Confirm(BaseModel):
    book: bool = Field(description="Book it?")


class Publish(BaseModel):
    publish: bool = Field(description="Publish the new index?")


def _note(event: str, **fields: Any) -> None:
    """One JSON line per step that really ran, with the instance it ran on (the test reads them)."""
    log = os.environ.get("MRTR_AUDIT")
    if log:
        with open(log, "a") as out:
            out.write(json.dumps({"event": event, "instance": INSTANCE} | fields) + "\n")


async def index_chunk(n: int) -> int:
    _note("chunk-start", n=n)
    gate = Path(os.environ["MRTR_GATES"]) / f"chunk-{n}"
    while not gate.exists():
        await asyncio.sleep(0.05)
    _note("chunk-end", n=n)
    return n


def build() -> Any:
    security = RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])])
    server = MCPServer("trips", request_state_security=security)
    store = open_store(os.environ["MRTR_STORE"])
    flows = mrtr.Flows(server, store=store, task_lease=2.0, task_scan_interval=0.25, instance_name=INSTANCE)

    @flows.tool(requires=["elicitation"])
    async def book_trip(ctx: mrtr.FlowContext) -> str:
        """Book a trip: asks where, then how long and which seat (together), then to confirm."""
        where = await ctx.elicit("Where to?", City)
        dates, seat = await ctx.gather(
            ctx.elicit(f"How many nights in {where.city}?", Dates), ctx.elicit("Window or aisle?", Seat)
        )
        ok = await ctx.elicit(f"Book {dates.nights} nights in {where.city}, {seat.seat} seat?", Confirm)
        return f"booked {where.city} for {dates.nights} nights, {seat.seat}" if ok.book else "not booked"

    @flows.tool(task="required")
    async def reindex(ctx: mrtr.FlowContext) -> str:
        """Rebuild the search index in three chunks, then ask to publish it (a durable task)."""
        for n in (1, 2, 3):
            await ctx.report_progress(n, 3, f"chunk {n} of 3")
            await ctx.step(f"chunk-{n}", index_chunk, n)
        answer = await ctx.elicit("Publish the new index?", Publish)
        return "index published" if answer.publish else "index kept"

    return flows.streamable_http_app()


def main() -> None:
    serve_main(build, READY)


if __name__ == "__main__":
    main()
