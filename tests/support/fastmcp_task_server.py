"""A FastMCP server with a durable mrtr task, for the fleet tests: `python tests/support/fastmcp_task_server.py`.

FastMCP 3.x-era code (`ctx: fastmcp.Context`, `ctx.elicit(..., response_type=bool)`) registered
with `mrtr.fastmcp.Flows(mcp, store=...)` as `task="optional"`. Reads MRTR_STATE_KEY (hex),
MRTR_INSTANCE (label), MRTR_STORE (+ MRTR_STORE_NAMESPACE) and MRTR_AUDIT (a file every step
appends a JSON line to). Built as the README's fleet recipe (a shared key and store, no other
option), so rounds are single-use by default. Serves `flows.http_app()`; prints
`fastmcp-task-server ready: URL`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from fastmcp import Context, FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.server.request_state import RequestStateSecurity

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
import mrtr.fastmcp  # noqa: E402
from mrtr.stores import open_store  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

INSTANCE = os.environ.get("MRTR_INSTANCE", "?")
READY = "fastmcp-task-server ready:"


def audit(step: str, phase: str) -> None:
    info = mrtr.current_step()
    line = {"step": step, "phase": phase, "instance": INSTANCE, "key": info.idempotency_key}
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps(line) + "\n")


async def fetch(job: str) -> str:
    audit("fetch", "done")
    return f"data({job})"


async def transform(data: str, seconds: float) -> str:
    audit("transform", "start")
    await asyncio.sleep(seconds)
    audit("transform", "end")
    return data.upper()


async def publish(item: str) -> str:
    audit("publish", "done")
    return f"published {item}"


def build() -> Any:
    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    mcp: FastMCP[Any] = FastMCP("fastmcp-task-fleet", request_state_security=RequestStateSecurity(keys=[key]))
    store = open_store(os.environ["MRTR_STORE"], namespace=os.environ.get("MRTR_STORE_NAMESPACE"))
    flows = mrtr.fastmcp.Flows(mcp, store=store, task_lease=1.0, task_scan_interval=0.2, task_poll_interval=0.1)

    @flows.tool(task="optional")
    async def pipeline(job: str, slow: float, ctx: Context) -> str:
        data = await mrtr.step("fetch", fetch, job)
        item = await mrtr.step("transform", transform, data, slow)
        answer = await ctx.elicit(f"Publish {item}?", response_type=bool)
        if not isinstance(answer, AcceptedElicitation) or not answer.data:
            return "not published"
        return await mrtr.step("publish", publish, item)

    @flows.tool()
    async def deploy(slow: float, ctx: Context) -> str:
        """Ephemeral, as tests/support/task_server.py's: ask where, apply (counted), ask to keep."""
        where = await ctx.elicit("Deploy where?", response_type=str)
        env = where.data if isinstance(where, AcceptedElicitation) else "nowhere"
        applied = await mrtr.step("apply", transform_as(f"apply@{env}"), slow)
        keep = await ctx.elicit(f"Keep {applied}?", response_type=bool)
        return f"{applied} at {env}, keep={isinstance(keep, AcceptedElicitation) and keep.data}"

    return flows.http_app()


def transform_as(name: str) -> Any:
    async def run(seconds: float) -> str:
        audit(name, "start")
        await asyncio.sleep(seconds)
        audit(name, "end")
        return f"{name} done"

    return run


if __name__ == "__main__":
    serve_main(build, READY)
