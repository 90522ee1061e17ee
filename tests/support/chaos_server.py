"""The flow server the chaos benchmark kills: `python tests/support/chaos_server.py --port 0`.

Every side effect is a step that does one Redis transaction: `INCR` a counter named by
`mrtr.current_step().idempotency_key` and append a record (flow, step, instance, pid,
start and end time) to a log list. Redis runs outside the fleet, so the count survives a
SIGKILL and the times tell whether a second run of one key coincided with a kill.

Flows (answers are numbers the client derives from the flow label, so it can check the
result; a wrong answer or a mixed-up journal shows up as a wrong value):
- `trip(flow, base)`: three rounds (call, answer `x`, answer `y`) and three side-effect
  steps; returns `(base + x) * 2 + y`. Ephemeral: its journal travels in `requestState`.
- `job(flow, base, slow)`: a durable task (`task="required"`): two steps (the second sleeps
  `slow` s), one question `z`, a last step; returns `base * 3 + z`.
- `pay(flow, base, slow)` and `pay_optional` (the same, `task="optional"`): one round, two
  steps: `charge`, then `notify`, which says it started (a `{NAMESPACE}:started` record: the
  checkpoint of `charge` is in the store by then) and sleeps `slow` s; returns
  `(base + 1) * 2`. A kill during `notify` is a kill after a step finished and before the
  round answered (`tests/fleet/test_resend.py`).

Also: `GET /healthz` for the balancer's health checks, and an outermost middleware that
counts `input_required` answers, and those with state only (no `inputRequests`: load
shed), in Redis, so shedding is counted the same whatever the client.

Environment: MRTR_STATE_KEY (hex), MRTR_INSTANCE (label), CHAOS_REDIS (URL), CHAOS_NAMESPACE
(key prefix of the store and the counters), CHAOS_PORT (port used when `--port 0` is given,
so a restarted instance comes back where the balancer expects it), CHAOS_STEP_SECONDS,
MRTR_TASK_LEASE (also the replay guard's lease), CHAOS_GUARD (1: replay guard on, the
default), CHAOS_MAX_INFLIGHT (shed past this many rounds in flight; 0: no shedding), CHAOS_BUS
(`plain`: the README's plain fleet recipe, no `subscriptions=`, so the bus comes from the store;
`explicit`: `MCPServer(subscriptions=mrtr.open_bus(url))`).
Prints `chaos-server ready: URL` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from mrtr._guard import open_guard  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

SERVER_NAME = "chaos"
READY_PREFIX = "chaos-server ready:"
INSTANCE = os.environ.get("MRTR_INSTANCE", "?")
NAMESPACE = os.environ.get("CHAOS_NAMESPACE", "mrtr_chaos")
STEP_SECONDS = float(os.environ.get("CHAOS_STEP_SECONDS", "0.02"))


def effects_key(idempotency_key: str) -> str:
    """The Redis counter of one step's runs (shared with the benchmark, which reads it)."""
    return f"{NAMESPACE}:fx:{idempotency_key}"


LOG_KEY = f"{NAMESPACE}:fxlog"
SHED_KEY = f"{NAMESPACE}:shed"
INPUT_KEY = f"{NAMESPACE}:input_rounds"
STARTED_KEY = f"{NAMESPACE}:started"


class Number(BaseModel):
    value: int


class SideEffects:
    """Runs the steps' side effects against Redis; one client per process."""

    def __init__(self, url: str) -> None:
        self.redis = aioredis.Redis.from_url(url, decode_responses=True)

    async def run(self, flow: str, step: str, value: int, seconds: float) -> int:
        """Sleep (the work a kill can interrupt), then count and log the run in one transaction."""
        key = mrtr.current_step().idempotency_key
        started = time.time()
        await asyncio.sleep(seconds)
        record = {"key": key, "flow": flow, "step": step, "instance": INSTANCE, "pid": os.getpid()}
        record |= {"start": started, "end": time.time()}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(effects_key(key))
            pipe.rpush(LOG_KEY, json.dumps(record))
            await pipe.execute()
        return value

    async def announced(self, flow: str, step: str, value: int, seconds: float) -> int:
        """`run`, after a record saying the step started on this instance (so a test can kill it then)."""
        record = {"flow": flow, "step": step, "instance": INSTANCE, "pid": os.getpid(), "at": time.time()}
        await self.redis.rpush(STARTED_KEY, json.dumps(record))
        return await self.run(flow, step, value, seconds)


def build_server(
    key: bytes,
    redis_url: str,
    lease: float,
    *,
    guard: bool = True,
    max_inflight: int | None = None,
    bus: str = "plain",
) -> tuple[MCPServer, mrtr.Flows]:
    """The fleet's server: tasks in Redis; a replay guard there too (its lease as short as the
    tasks', so a round whose instance died is taken over quickly); shedding past
    `max_inflight` rounds in flight; `bus` as CHAOS_BUS."""
    if bus not in ("plain", "explicit"):
        raise ValueError(f"CHAOS_BUS must be 'plain' or 'explicit', not {bus!r}")
    options: dict[str, Any] = {}
    if bus == "explicit":
        options["subscriptions"] = mrtr.open_bus(redis_url, namespace=NAMESPACE)
    server = MCPServer(SERVER_NAME, request_state_security=RequestStateSecurity(keys=[key]), **options)
    # CHAOS_GUARD=0 turns the guard off explicitly: a shared store would otherwise bring it by default.
    replay_guard = open_guard(redis_url, namespace=f"{NAMESPACE}:guard", lease=lease) if guard else False
    flows = mrtr.Flows(
        server,
        store=mrtr.open_store(redis_url, namespace=NAMESPACE),
        task_lease=lease,
        task_scan_interval=min(0.25, lease / 4),
        task_poll_interval=0.1,
        replay_guard=replay_guard,
        max_inflight_rounds=max_inflight,
    )
    effects = SideEffects(redis_url)

    @flows.tool()
    async def trip(flow: str, base: int, ctx: mrtr.FlowContext) -> int:
        """Three rounds, three side effects: reserve, ask x, charge, ask y, commit."""
        reserved = await ctx.step("reserve", effects.run, flow, "reserve", base, STEP_SECONDS)
        x = await ctx.elicit(f"{flow} x?", Number, key="x")
        charged = await ctx.step("charge", effects.run, flow, "charge", reserved + x.value, STEP_SECONDS)
        y = await ctx.elicit(f"{flow} y?", Number, key="y")
        return await ctx.step("commit", effects.run, flow, "commit", charged * 2 + y.value, STEP_SECONDS)

    @flows.tool(task="required")
    async def job(flow: str, base: int, slow: float, ctx: mrtr.FlowContext) -> int:
        """A durable task: fetch, work (slow), ask z, publish."""
        fetched = await ctx.step("fetch", effects.run, flow, "fetch", base, STEP_SECONDS)
        worked = await ctx.step("work", effects.run, flow, "work", fetched * 3, min(slow, 5.0))
        z = await ctx.elicit(f"{flow} z?", Number, key="z")
        return await ctx.step("publish", effects.run, flow, "publish", worked + z.value, STEP_SECONDS)

    async def pay_body(flow: str, base: int, slow: float, ctx: mrtr.FlowContext) -> int:
        charged = await ctx.step("charge", effects.run, flow, "charge", base, STEP_SECONDS)
        notified = await ctx.step("notify", effects.announced, flow, "notify", charged + 1, min(slow, 10.0))
        return notified * 2

    @flows.tool()
    async def pay(flow: str, base: int, slow: float, ctx: mrtr.FlowContext) -> int:
        """One round, two side effects: charge, then notify (slow)."""
        return await pay_body(flow, base, slow, ctx)

    @flows.tool(task="optional")
    async def pay_optional(flow: str, base: int, slow: float, ctx: mrtr.FlowContext) -> int:
        """`pay`, as a durable task for a client that declares the tasks extension."""
        return await pay_body(flow, base, slow, ctx)

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> JSONResponse:
        """The balancer's health check (not MCP)."""
        return JSONResponse({"ok": True, "instance": INSTANCE})

    return server, flows


class RoundCounter:
    """ASGI middleware: counts `input_required` responses, and those with state only (shed rounds).

    Reads the body as it streams past (MRTR responses are small, one JSON object), so it
    sees exactly what any client would, whether or not that client can retry. The total
    is a check that the counting works: a flow of three rounds gives two.
    """

    def __init__(self, app: ASGIApp, redis_url: str) -> None:
        self.app = app
        self.redis = aioredis.Redis.from_url(redis_url)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.body" and len(body) < 65536:
                body.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, watch)
        kind = input_required_kind(bytes(body))
        if kind is not None:
            await self.redis.incr(SHED_KEY if kind == "shed" else INPUT_KEY)


def input_required_kind(body: bytes) -> str | None:
    """`"shed"` for `input_required` without `inputRequests`, `"input"` with them, else None."""
    if b"input_required" not in body:
        return None
    for line in body.splitlines():  # a JSON body, or SSE `data:` lines
        text = line.removeprefix(b"data:").strip()
        if not text.startswith(b"{"):
            continue
        try:
            result: Any = json.loads(text).get("result")
        except ValueError:
            continue
        if isinstance(result, dict) and result.get("resultType") == "input_required":
            return "input" if result.get("inputRequests") else "shed"
    return None


def exit_with_parent() -> None:
    """Exit when the benchmark that started this process dies, even by SIGKILL (no orphans)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> None:
    exit_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    port = args.port or int(os.environ.get("CHAOS_PORT", "0"))
    redis_url = os.environ.get("CHAOS_REDIS", "redis://127.0.0.1:6379/0")
    lease = float(os.environ.get("MRTR_TASK_LEASE", "1.0"))
    guard = os.environ.get("CHAOS_GUARD", "1") == "1"
    max_inflight = int(os.environ.get("CHAOS_MAX_INFLIGHT", "0")) or None
    key = bytes.fromhex(os.environ["MRTR_STATE_KEY"])
    bus = os.environ.get("CHAOS_BUS", "plain")
    _, flows = build_server(key, redis_url, lease, guard=guard, max_inflight=max_inflight, bus=bus)
    app = RoundCounter(flows.streamable_http_app(), redis_url)
    asyncio.run(serve_http(app, port, READY_PREFIX, ready_suffix=f"instance={INSTANCE}"))


if __name__ == "__main__":
    main()
