"""Cost of single-use rounds (`Flows(replay_guard=...)`) per round, per store.

One flow (ask once, then return) is served by one in-process `MCPServer` per variant: no
guard, and a guard on SQLite in memory, a SQLite file, the local Redis and the local
PostgreSQL. The official `mcp.Client` (in process, 2026-07-28) drives it by hand: round 1
(no state, never guarded) is untimed; round 2 (state + answer: claim, run, record the
outcome) is timed. Variants are interleaved, the order rotating every cycle. Then the
ledger alone: one `claim_round` + `finish_round` pair per store, as the guard issues them.

Run: `.venv/bin/python benchmarks/guard.py [--n 300]`. Prints medians and p90 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr._guard import ReplayGuard

REDIS_URL = os.environ.get("MRTR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get("MRTR_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


class Target(BaseModel):
    env: str


async def _refuse(*args: Any) -> Any:
    raise AssertionError("driven by hand")


def build(guard: ReplayGuard | None) -> MCPServer:
    server = MCPServer("guard-bench", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
    flows = mrtr.Flows(server, replay_guard=guard)

    @flows.tool()
    async def deploy(ctx: mrtr.FlowContext) -> str:
        target = await ctx.elicit("Where?", Target, key="where")
        return target.env

    return server


def stores(tmp: str, token: str) -> dict[str, Callable[[], Any]]:
    from mrtr.stores._postgres import PostgresStore
    from mrtr.stores._redis import RedisStore
    from mrtr.stores._sqlite import SQLiteStore

    return {
        "sqlite :memory:": lambda: SQLiteStore(":memory:"),
        "sqlite file": lambda: SQLiteStore(f"{tmp}/guard-bench.db"),
        "redis": lambda: RedisStore(REDIS_URL, prefix=f"mrtr-bench-{token}:"),
        "postgres": lambda: PostgresStore(POSTGRES_DSN, table=f"mrtr_bench_{token}"),
    }


async def round_two(client: Client) -> float:
    first = await client.session.call_tool("deploy", {}, allow_input_required=True)
    answers = {"where": {"action": "accept", "content": {"env": "prod"}}}
    start = time.perf_counter()
    await client.session.call_tool(
        "deploy", {}, input_responses=answers, request_state=first.request_state, allow_input_required=True
    )
    return time.perf_counter() - start


async def ledger_pair(ledger: Any) -> float:
    round_id = secrets.token_hex(8)
    start = time.perf_counter()
    await ledger.claim_round(round_id, "d", "owner", 10.0, time.time() + 60)
    await ledger.finish_round(round_id, "owner", '{"k":"v","v":"prod"}')
    return time.perf_counter() - start


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"median {statistics.median(ordered) * 1000:7.3f} ms   p90 {p90 * 1000:7.3f} ms"


async def main(n: int) -> None:
    import tempfile

    token = secrets.token_hex(4)
    with tempfile.TemporaryDirectory() as tmp:
        made = {name: factory() for name, factory in stores(tmp, token).items()}
        variants: dict[str, Client] = {"no guard": Client(build(None), elicitation_callback=_refuse)}
        for name, store in made.items():
            variants[f"guard: {name}"] = Client(build(ReplayGuard(store)), elicitation_callback=_refuse)
        samples: dict[str, list[float]] = {name: [] for name in variants}
        ledger: dict[str, list[float]] = {name: [] for name in made}
        clients = list(variants.items())
        for _, client in clients:
            await client.__aenter__()
        try:
            for _ in range(20):  # warm-up
                for _, client in clients:
                    await round_two(client)
            for cycle in range(n):
                shift = cycle % len(clients)
                for name, client in clients[shift:] + clients[:shift]:
                    samples[name].append(await round_two(client))
            for _ in range(n):
                for name, store in made.items():
                    ledger[name].append(await ledger_pair(store))
        finally:
            for _, client in reversed(clients):
                await client.__aexit__(None, None, None)
            await cleanup(made, token)
    base = statistics.median(samples["no guard"])
    print(f"guarded round (round 2 of a 2-round flow, in process, n={n}):")
    for name, values in samples.items():
        extra = "" if name == "no guard" else f"   +{(statistics.median(values) - base) * 1000:.3f} ms"
        print(f"  {name:22s} {summary(values)}{extra}")
    print("ledger alone (claim_round + finish_round):")
    for name, values in ledger.items():
        print(f"  {name:22s} {summary(values)}")


async def cleanup(made: dict[str, Any], token: str) -> None:
    for store in made.values():
        await store.close()
    import psycopg
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"mrtr-bench-{token}:*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
    async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as conn:
        await conn.execute(f"DROP TABLE IF EXISTS mrtr_bench_{token}, mrtr_bench_{token}_rounds")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    run: Callable[[int], Awaitable[None]] = main
    asyncio.run(run(parser.parse_args().n))
