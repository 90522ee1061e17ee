"""A durable-flow server on Temporal for the fleet tests: `python tests/support/temporal_server.py --port 0`.

Reads MRTR_STATE_KEY (hex), MRTR_INSTANCE (label), MRTR_TEMPORAL (the frontend address),
MRTR_TASK_QUEUE, MRTR_AUDIT (a file every step appends a JSON line to, so tests count real
side effects), MRTR_FLOW_VERSION (`1` or `2`: the `release` flow before and after a change
guarded by `ctx.patched`), MRTR_HEARTBEAT (seconds of worker silence before a step is retried
elsewhere) and MRTR_WORKER (`0`: an MCP server without a worker; `only`: a worker process
with no HTTP, through `mrtr.temporal.run_worker`), MRTR_TOKENS (`name=token,...`: bearer
auth, one principal per token, as tests/support/task_server.py), MRTR_BUS (a fleet bus URL,
namespaced by the task queue: workers publish task changes on it). The `requests` tool
counts the requests the instance served, by method.
Prints `temporal-server ready: URL` once it serves (a worker-only process: `worker://LABEL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from temporalio.client import Client
from temporalio.common import RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
import mrtr.temporal  # noqa: E402
from mrtr.temporal import TemporalTasks  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402
from tests.support.task_server import (  # noqa: E402
    INSTANCE,
    REQUESTS,
    Confirm,
    audit,
    count_requests,
    fetch,
    publish,
    token_auth,
    transform,
)

READY = "temporal-server ready:"


def counted(name: str):  # type: ignore[no-untyped-def]
    async def run() -> str:
        audit(name, "done")
        return f"{name} done"

    return run


def build_flows(client: Client, worker: bool) -> mrtr.Flows:
    auth = token_auth()
    if bus_url := os.environ.get("MRTR_BUS"):
        auth["subscriptions"] = mrtr.open_bus(bus_url, namespace=os.environ["MRTR_TASK_QUEUE"].replace("-", "_"))
    server = MCPServer(
        "temporal-fleet",
        request_state_security=RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])]),
        middleware=[count_requests],
        **auth,
    )

    @server.tool()
    async def requests() -> dict[str, int]:
        """Requests this instance served so far, by method."""
        return dict(REQUESTS)

    heartbeat = float(os.environ.get("MRTR_HEARTBEAT", "2"))
    engine = TemporalTasks(
        client,
        task_queue=os.environ["MRTR_TASK_QUEUE"],
        worker=worker,
        heartbeat_timeout=heartbeat,
        step_retry=RetryPolicy(initial_interval=timedelta(seconds=0.2), maximum_interval=timedelta(seconds=1)),
        worker_options={"sticky_queue_schedule_to_start_timeout": timedelta(seconds=heartbeat)},
    )
    flows = mrtr.Flows(server, tasks=engine, task_poll_interval=0.1)
    version = os.environ.get("MRTR_FLOW_VERSION", "1")

    @flows.tool(task="required")
    async def pipeline(job: str, slow: float, ctx: mrtr.FlowContext) -> str:
        """Fetch, transform (slowly), ask whether to publish, publish: each side effect a step."""
        data = await ctx.step("fetch", fetch, job)
        shaped = await ctx.step("transform", transform, data, slow)
        answer = await ctx.elicit(f"Publish {shaped}?", Confirm)
        if not answer.publish:
            return "not published"
        return await ctx.step("publish", publish, shaped)

    @flows.tool(task="required")
    async def nap(seconds: float, ctx: mrtr.FlowContext) -> str:
        """Sleep durably (a Temporal timer) between two audited steps."""
        await ctx.step("before", counted("nap.before"))
        await ctx.sleep(seconds)
        await ctx.step("after", counted("nap.after"))
        return "rested"

    @flows.tool(task="required")
    async def release(name: str, ctx: mrtr.FlowContext) -> str:
        """v1 builds with `build`; v2 builds with `build_v2`, behind `ctx.patched`, so tasks
        that built under v1 stay on the old path when v2 replays them."""
        if version == "2" and ctx.patched("build-v2"):
            built = await ctx.step("build_v2", counted("build-v2"))
        else:
            built = await ctx.step("build", counted("build-v1"))
        answer = await ctx.elicit(f"Ship {name}?", Confirm)
        return f"{built}; shipped={answer.publish}; by v{version}"

    return flows


async def main(port: int) -> None:
    client = await Client.connect(os.environ["MRTR_TEMPORAL"])
    mode = os.environ.get("MRTR_WORKER", "1")
    flows = build_flows(client, worker=mode == "1")
    if mode == "only":
        print(f"{READY} worker://{INSTANCE}", flush=True)
        await mrtr.temporal.run_worker(flows)
        return
    await serve_http(flows.streamable_http_app(stateless_http=True), port, READY)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    signal.signal(signal.SIGTERM, _stop)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args().port))
