"""Cost of first rounds that survive their instance (`mrtr._host.identity`), per call and per step.

One flow per step count (0, 1, 4 and 8 steps, each trivial, then return: a one-round call) is
served by one in-process `MCPServer` per variant: no store (nothing joined, nothing
checkpointed: the baseline), and `store=` the local Redis or PostgreSQL (the replay guard on by
default, so each first round that carries an identity is claimed, checkpointed as its steps
finish, and its answer recorded). The official `mcp.Client` (in process, 2026-07-28) calls it
with a fresh `mrtr/idempotencyKey` each time, as `FlowClient` does. Variants are interleaved,
the order rotating every cycle.

Per call: the 0-step flow's extra over no store (one claim, one read of the checkpoint, one
recorded answer; no checkpoint is written). Per step: the slope from 1 to 8 steps, less the baseline's own slope
(back-to-back steps commit in groups: each step after the first waits for the write of the
one before it; the last step's write is carried by the answer).

Run: `.venv/bin/python benchmarks/first_rounds.py [--n 200 | --quick]`. Prints medians and p90 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

import mrtr
from mrtr._wire import IDEMPOTENCY_KEY

REDIS_URL = os.environ.get("MRTR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get("MRTR_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
STEPS = (0, 1, 4, 8)


def build(store: Any) -> MCPServer:
    server = MCPServer("first-rounds-bench", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
    flows = mrtr.Flows(server, store=store)

    def flow_with(count: int) -> None:
        async def work(ctx: mrtr.FlowContext) -> int:
            total = 0
            for i in range(count):
                total += await ctx.step(f"s{i}", _add, i)
            return total

        flows.tool(name=f"steps{count}")(work)

    for count in STEPS:
        flow_with(count)
    return server


async def _add(i: int) -> int:
    return i + 1


def stores(token: str) -> dict[str, Callable[[], Any]]:
    from mrtr.stores._postgres import PostgresStore
    from mrtr.stores._redis import RedisStore

    return {
        "redis": lambda: RedisStore(REDIS_URL, prefix=f"mrtr-bench1-{token}:"),
        "postgres": lambda: PostgresStore(POSTGRES_DSN, table=f"mrtr_bench1_{token}"),
    }


async def one_call(client: Client, count: int) -> float:
    meta = {IDEMPOTENCY_KEY: secrets.token_urlsafe(16)}
    start = time.perf_counter()
    result = await client.session.call_tool(f"steps{count}", {}, meta=meta)
    elapsed = time.perf_counter() - start
    assert not result.is_error, result
    return elapsed


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"median {statistics.median(ordered) * 1000:7.3f} ms   p90 {p90 * 1000:7.3f} ms"


async def main(n: int) -> None:
    token = secrets.token_hex(4)
    made = {name: factory() for name, factory in stores(token).items()}
    variants: dict[str, Client] = {"no store": Client(build(None))}
    for name, store in made.items():
        variants[name] = Client(build(store))
    clients = list(variants.items())
    samples: dict[tuple[str, int], list[float]] = {(name, c): [] for name in variants for c in STEPS}
    for _, client in clients:
        await client.__aenter__()
    try:
        for _ in range(10):  # warm-up
            for _, client in clients:
                for count in STEPS:
                    await one_call(client, count)
        for cycle in range(n):
            shift = cycle % len(clients)
            order = STEPS[cycle % len(STEPS) :] + STEPS[: cycle % len(STEPS)]
            for name, client in clients[shift:] + clients[:shift]:
                for count in order:
                    samples[(name, count)].append(await one_call(client, count))
    finally:
        for _, client in reversed(clients):
            await client.__aexit__(None, None, None)
        await cleanup(made, token)
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(f"one-round call with a fresh idempotency key (in process, n={n}):")
    for (name, count), values in samples.items():
        extra = "" if name == "no store" else f"   +{(med[(name, count)] - med[('no store', count)]) * 1000:.3f} ms"
        print(f"  {name:9s} {count} step(s)  {summary(values)}{extra}")
    base_slope = (med[("no store", 8)] - med[("no store", 1)]) / 7
    for name in made:
        per_call = med[(name, 0)] - med[("no store", 0)]
        per_step = (med[(name, 8)] - med[(name, 1)]) / 7 - base_slope
        print(f"  {name}: +{per_call * 1000:.3f} ms per call, +{per_step * 1000:.3f} ms per step")


async def cleanup(made: dict[str, Any], token: str) -> None:
    for store in made.values():
        await store.close()
    import psycopg
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"mrtr-bench1-{token}:*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
    async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as conn:
        await conn.execute(f"DROP TABLE IF EXISTS mrtr_bench1_{token}, mrtr_bench1_{token}_rounds")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a smoke run: n=5")
    args = parser.parse_args()
    asyncio.run(main(5 if args.quick else args.n))
