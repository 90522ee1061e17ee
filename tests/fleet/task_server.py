"""A durable-flow server for the fleet tests: `python tests/fleet/task_server.py --port 0`.

Reads MRTR_STATE_KEY (hex), MRTR_INSTANCE (label), MRTR_STORE (sqlite:///path, redis://...,
postgresql://...), MRTR_STORE_NAMESPACE (Redis prefix / Postgres table) and MRTR_AUDIT (a
file every step appends a JSON line to, so tests can count real side effects).
Prints `task-server ready: URL` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from mrtr.stores import open_store  # noqa: E402
from tests.serving import serve_http  # noqa: E402

INSTANCE = os.environ.get("MRTR_INSTANCE", "?")


def audit(step: str, phase: str) -> None:
    info = mrtr.current_step()
    line = {"step": step, "phase": phase, "instance": INSTANCE, "key": info.idempotency_key}
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps(line) + "\n")


class Confirm(BaseModel):
    publish: bool


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


def build_server() -> tuple[MCPServer, mrtr.Flows]:
    server = MCPServer(
        "task-fleet", request_state_security=RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])])
    )
    flows = mrtr.Flows(
        server,
        store=open_store(os.environ["MRTR_STORE"], namespace=os.environ.get("MRTR_STORE_NAMESPACE", "mrtr_fleet")),
        task_lease=float(os.environ.get("MRTR_LEASE", "1.0")),
        task_scan_interval=0.2,
        task_poll_interval=0.1,
    )

    @flows.tool(task="required")
    async def pipeline(job: str, slow: float, ctx: mrtr.FlowContext) -> str:
        """Fetch, transform (slowly), ask whether to publish, publish: each side effect a step."""
        data = await ctx.step("fetch", fetch, job)
        shaped = await ctx.step("transform", transform, data, slow)
        answer = await ctx.elicit(f"Publish {shaped}?", Confirm)
        if not answer.publish:
            return "not published"
        return await ctx.step("publish", publish, shaped)

    return server, flows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    _, flows = build_server()
    app = flows.streamable_http_app(stateless_http=True)  # the task worker starts with the app
    asyncio.run(serve_http(app, args.port, "task-server ready:"))


if __name__ == "__main__":
    main()
