"""What one replayed journal entry costs: a round whose journal holds N answers (or N steps).

Every round of an mrtr flow runs the flow from the top, and every ask already answered and
every step already run is served from the journal again. This benchmark isolates that
per-entry cost, in process, on the official stack (`MCPServer`, `RequestStateBoundary`,
`mcp.Client`):

  * asks   a flow that asks N questions one after the other (one per round). We drive it to
           its last round once, keep that round's sealed `requestState` and answer, then call
           that same last round again and again: each call decodes a journal of N-1 answers,
           replays them, journals the N-th, and returns.
  * steps  a flow that runs N steps and then asks once. Its second (last) round replays N
           journaled steps and the answer, then returns.

N takes several values in one run, interleaved round-robin (the order rotates every cycle),
and the cost per entry is the least-squares slope of the medians against N, in microseconds:
client-observed (the whole call) and server-side (mrtr's `run_request` alone, the outermost
middleware round including the boundary's seal and unseal). The intercept is what a round
costs with nothing to replay.

The sealed state is valid for its TTL and can be sent any number of times (no replay guard
is configured), so every timed call does exactly the same work.

Run: `.venv/bin/python benchmarks/replay.py [--n N] [--quick] [--profile N_ENTRIES]`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

import mcp_types as t
from benchkit import ms
from mcp import Client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
import mrtr._host.call

SIZES = (1, 10, 25, 50, 100)
KINDS = ("asks", "steps")
TARGET_US_PER_ENTRY = 3.0  # issue #34: <= 3 us per replayed journal entry

SAMPLES: dict[str, list[float]] = defaultdict(list)


class Answer(BaseModel):
    value: str


ANSWER = {"value": "prod-eu-west-1"}


def question(i: int) -> str:
    return f"Question {i} of the chain?"


def make_plan(i: int) -> dict[str, Any]:
    return {"id": f"plan-{i}", "replicas": 3}


async def round_timer(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Outermost middleware: each `tools/call` round, boundary included."""
    start = time.perf_counter()
    try:
        return await call_next(ctx)
    finally:
        SAMPLES["round"].append(time.perf_counter() - start)


def instrument() -> None:
    run_request = mrtr._host.call.run_request

    async def timed_run_request(
        services: Any, spec: Any, request: Context[Any, Any], *args: Any, **options: Any
    ) -> Any:
        start = time.perf_counter()
        try:
            return await run_request(services, spec, request, *args, **options)
        finally:
            SAMPLES["engine"].append(time.perf_counter() - start)

    mrtr._host.call.run_request = timed_run_request  # type: ignore[assignment]


def build_server(max_entries: int) -> MCPServer[Any]:
    security = RequestStateSecurity(keys=[os.urandom(32)])
    server: MCPServer[Any] = MCPServer("bench-replay", request_state_security=security, log_level="WARNING")
    server._lowlevel_server.middleware.insert(0, round_timer)
    flows = mrtr.Flows(server, max_rounds=max_entries + 1)

    @flows.tool()
    async def asks(n: int, ctx: mrtr.FlowContext) -> int:
        """N questions, one per round."""
        total = 0
        for i in range(n):
            total += len((await ctx.elicit(question(i), Answer)).value)
        return total

    @flows.tool()
    async def steps(n: int, ctx: mrtr.FlowContext) -> int:
        """N steps, then one question."""
        replicas = 0
        for i in range(n):
            replicas += (await ctx.step("plan", make_plan, i))["replicas"]
        answer = await ctx.elicit(question(0), Answer)
        return replicas + len(answer.value)

    return server


Last = tuple[str, t.InputResponses]  # the last round's sealed state and answers


async def last_round(client: Client, tool: str, n: int) -> Last:
    """Drive `tool(n)` to its last round; return what that round's request carries."""
    result = await client.session.call_tool(tool, {"n": n}, allow_input_required=True)
    while True:
        assert isinstance(result, t.InputRequiredResult) and result.request_state is not None, result
        answers: t.InputResponses = {
            key: t.ElicitResult(action="accept", content=dict(ANSWER)) for key in (result.input_requests or {})
        }
        following = await client.session.call_tool(
            tool, {"n": n}, input_responses=answers, request_state=result.request_state, allow_input_required=True
        )
        if not isinstance(following, t.InputRequiredResult):
            return result.request_state, answers
        result = following


async def replay_last(client: Client, tool: str, n: int, last: Last) -> None:
    state, answers = last
    result = await client.session.call_tool(
        tool, {"n": n}, input_responses=answers, request_state=state, allow_input_required=True
    )
    if isinstance(result, t.InputRequiredResult) or result.is_error:
        raise RuntimeError(f"{tool}({n}) did not finish in its last round: {result!r}")


async def on_elicit(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    """Declares elicitation (the flows ask); the rounds here are driven by hand, so it never runs."""
    return t.ElicitResult(action="accept", content=dict(ANSWER))


def new_client(server: MCPServer[Any]) -> Client:
    return Client(server, elicitation_callback=on_elicit, read_timeout_seconds=30)


def slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys against xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return b, my - b * mx


async def measure(n: int, warmup: int, sizes: Sequence[int]) -> dict[str, dict[str, dict[int, float]]]:
    """Medians in seconds: {kind: {"client"|"round"|"engine": {N: median}}}."""
    server = build_server(max(sizes))
    cases = [(kind, size) for kind in KINDS for size in sizes]
    async with new_client(server) as client:
        await client.list_tools()
        lasts = {case: await last_round(client, *case) for case in cases}
        times: dict[tuple[str, int], dict[str, list[float]]] = {case: defaultdict(list) for case in cases}
        gc.collect()
        for cycle in range(warmup + n):
            for j in range(len(cases)):
                case = cases[(cycle + j) % len(cases)]
                SAMPLES.clear()
                start = time.perf_counter()
                await replay_last(client, *case, lasts[case])
                elapsed = time.perf_counter() - start
                if cycle >= warmup:
                    times[case]["client"].append(elapsed)
                    times[case]["round"] += SAMPLES["round"]
                    times[case]["engine"] += SAMPLES["engine"]
    out: dict[str, dict[str, dict[int, float]]] = {kind: defaultdict(dict) for kind in KINDS}
    for (kind, size), series in times.items():
        for what, values in series.items():
            out[kind][what][size] = statistics.median(values)
    return out


def report(medians: dict[str, dict[str, dict[int, float]]], sizes: Sequence[int], figures: dict[str, float]) -> bool:
    met = True
    for kind in KINDS:
        label = "answers" if kind == "asks" else "steps (+1 answer)"
        print(f"\n{kind}: the last round of a flow whose journal holds N {label}; medians in ms")
        print(f"  {'N':>5} {'client':>9} {'round':>9} {'engine':>9}")
        for size in sizes:
            row = medians[kind]
            print(f"  {size:>5} {ms(row['client'][size]):>9} {ms(row['round'][size]):>9} {ms(row['engine'][size]):>9}")
        fits = {what: slope(sizes, [medians[kind][what][s] for s in sizes]) for what in ("client", "round", "engine")}
        cells = ", ".join(f"{what} {b * 1e6:.2f} us (+{a * 1e3:.3f} ms)" for what, (b, a) in fits.items())
        print(f"  per entry (slope, intercept): {cells}")
        per_entry = fits["client"][0] * 1e6
        figures |= {f"{kind} us/entry {what}": b * 1e6 for what, (b, _a) in fits.items()}
        figures |= {f"{kind} N={size} client ms": medians[kind]["client"][size] * 1e3 for size in sizes}
        ok = per_entry <= TARGET_US_PER_ENTRY
        met &= ok
        status = "MET" if ok else "NOT MET"
        print(f"  {kind}: {per_entry:.2f} us per replayed entry (client); target <= {TARGET_US_PER_ENTRY} {status}")
    return met


def profile(entries: int, calls: int) -> None:
    """cProfile `calls` replays of the asks flow's last round with `entries` answers."""

    async def run() -> cProfile.Profile:
        server = build_server(entries)
        async with new_client(server) as client:
            last = await last_round(client, "asks", entries)
            for _ in range(20):
                await replay_last(client, "asks", entries, last)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(calls):
                await replay_last(client, "asks", entries, last)
            profiler.disable()
        return profiler

    profiler = asyncio.run(run())
    print(f"\ncProfile: {calls} replays of asks({entries})'s last round (inflates small calls)")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Cost of one replayed journal entry (answers, steps).")
    parser.add_argument("--n", type=int, default=300, help="timed cycles; each times every (kind, N) once")
    parser.add_argument("--warmup", type=int, default=None, help="untimed cycles first (default: n/10, at least 5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: n=20")
    parser.add_argument("--profile", type=int, default=0, metavar="ENTRIES", help="cProfile asks(ENTRIES) replays")
    parser.add_argument("--summary", action="store_true", help="end with one SUMMARY line of JSON (for against.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n = 20
    if args.warmup is None:
        args.warmup = max(5, args.n // 10)
    return args


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    print(
        f"mrtr replay benchmark: mcp {version('mcp')}, mrtr {mrtr.__version__} ({mrtr.__file__}), "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, n={args.n} (+{args.warmup} warm-up) per N"
    )
    instrument()
    medians = asyncio.run(measure(args.n, args.warmup, SIZES))
    figures: dict[str, float] = {}
    met = report(medians, SIZES, figures)
    print(f"\n{'ALL TARGETS MET' if met else 'NOT ALL TARGETS MET'} (measured in {time.perf_counter() - started:.0f}s)")
    if args.summary:  # one machine-readable line, for benchmarks/against.py
        print("SUMMARY " + json.dumps(figures))
    if args.profile:
        profile(args.profile, 200)
    return 0  # a measurement, not a test


if __name__ == "__main__":
    sys.exit(main())
