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
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr.stores import TaskStore

INSTANCE = os.environ.get("MRTR_INSTANCE", "?")


def make_store(url: str, namespace: str) -> TaskStore:
    if url.startswith("sqlite:///"):
        from mrtr.stores.sqlite import SQLiteStore

        return SQLiteStore(url.removeprefix("sqlite:///"))
    if url.startswith("redis://"):
        from mrtr.stores.redis import RedisStore

        return RedisStore(url, prefix=f"{namespace}:")
    from mrtr.stores.postgres import PostgresStore

    return PostgresStore(url, table=namespace)


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
        store=make_store(os.environ["MRTR_STORE"], os.environ.get("MRTR_STORE_NAMESPACE", "mrtr_fleet")),
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
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # queue connections until uvicorn accepts them
    port = sock.getsockname()[1]
    _, flows = build_server()
    app = flows.streamable_http_app(stateless_http=True)  # the task worker starts with the app
    print(f"task-server ready: http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
