"""FastMCP 4's own guard pattern by hand vs an `mrtr.fastmcp` flow: the same 2-round tool, one server.

One `fastmcp.FastMCP` server (with `request_state_security=RequestStateSecurity(keys=[...])`)
hosts both variants, so they share one stack, including the SDK's `RequestStateBoundary`
that seals and unseals every `requestState`:

  (1) guard   `@mcp.tool()` written in FastMCP's guard pattern: on round 1 it returns an
              `InputRequiredResult` with one elicitation and a 6-byte `requestState`; on
              round 2 it reads the answer from `ctx.input_responses` (and checks
              `ctx.request_state`), validates it and returns.
  (2) mrtr    `@mrtr.fastmcp.Flows(mcp).tool()` that awaits `ctx.elicit(...)` once and
              returns: the same 2 rounds, run by mrtr's journal replay.

Transports (all at protocol 2026-07-28: one request per round, no session):

  * in-process, official client: `mcp.Client` does not take a `FastMCP` object (entering it
    fails: a FastMCP is no SDK `Server`, `MCPServer` or `Transport`). It does take the
    FastMCP's SDK low-level server, `mcp._mcp_server` (a `mcp.server.lowlevel.Server`
    subclass), and then dispatches directly, without JSON-RPC framing. FastMCP's whole
    request path (its middleware, tool manager, Context) runs as usual.
  * in-memory, fastmcp's client (reference): `fastmcp.Client(mcp)`, FastMCP's own
    in-memory transport (JSON-RPC messages over memory streams), with an elicitation
    handler that answers. Not the official client; shown because it is how FastMCP
    users test in memory.
  * HTTP, official client: a uvicorn subprocess serving `mcp.http_app()` on 127.0.0.1,
    `mcp.Client(url)`.

The official client's elicitation callback answers each `InputRequiredResult`, so the rounds
run automatically. Method (as in benchmarks/rounds.py): warm up, then interleave the variants
round-robin (the order alternates every cycle) so drift affects both equally; report median,
p90 and minimum client-observed latency per call, the ratio of medians (2)/(1) with a
paired-bootstrap 95% interval, and whether the target (2)/(1) <= 1.10 is met. It also shows
the sealed `requestState` each variant sends. `--profile` then runs cProfile over the
in-process loop of each variant and prints where (2) spends its extra time.

Run: `.venv/bin/python benchmarks/fastmcp.py [--n N] [--quick] [--profile]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# This file is named fastmcp.py. Run as a script, its own directory leads sys.path and
# `import fastmcp` would import this file; drop that entry and import the shared helpers as
# `benchmarks.benchkit` from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fastmcp  # noqa: E402
import mcp_types as t  # noqa: E402
from benchmarks.benchkit import loopback_socket, ms, p90, ratio_ci, server_processes  # noqa: E402
from fastmcp import Context, FastMCP  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.session import ClientRequestContext  # noqa: E402
from mcp.server.elicitation import render_elicitation_schema  # noqa: E402
from mcp.server.request_state import RequestStateSecurity  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import mrtr  # noqa: E402
import mrtr._host.call as host_call  # noqa: E402
import mrtr.fastmcp  # noqa: E402

VARIANTS = ("guard", "mrtr")
LABELS = {"guard": "(1) FastMCP guard", "mrtr": "(2) mrtr flow"}
TARGET = 1.10  # (2)/(1), every transport
ARGS = {"service": "api"}
RESULT = "deployed api to prod"
Times = dict[str, list[float]]


# -- the server ------------------------------------------------------------------------------


class Target(BaseModel):
    env: str


QUESTION = "Deploy api where?"
ANSWER = {"env": "prod"}
ASK_KEY = "target"
GUARD_STATE = "asked1"  # what the guard carries to round 2: that it asked (sealed by the boundary)
# Built once, as a careful guard author would: rendering the schema per call is not the guard's cost.
GUARD_ASK = t.ElicitRequest(
    params=t.ElicitRequestFormParams(message=QUESTION, requested_schema=render_elicitation_schema(Target))
)


def build_server() -> FastMCP[Any]:
    """One FastMCP server hosting both variants, so the comparison runs on one stack."""
    security = RequestStateSecurity(keys=[os.urandom(32)])
    mcp: FastMCP[Any] = FastMCP("fm-bench", request_state_security=security)
    flows = mrtr.fastmcp.Flows(mcp)

    @mcp.tool(name="guard")
    async def guard(service: str, ctx: Context) -> str | t.InputRequiredResult:
        """(1) FastMCP's guard pattern: ask by returning InputRequiredResult, read the answer next round."""
        answers = ctx.input_responses
        reply = answers.get(ASK_KEY) if answers is not None else None
        if reply is None or ctx.request_state != GUARD_STATE:
            return t.InputRequiredResult(input_requests={ASK_KEY: GUARD_ASK}, request_state=GUARD_STATE)
        if not isinstance(reply, t.ElicitResult):
            raise ValueError(f"expected an elicitation result for {ASK_KEY!r}, got {type(reply).__name__}")
        if reply.action != "accept":
            return f"not deployed ({reply.action})"
        target = Target.model_validate(reply.content)
        return f"deployed {service} to {target.env}"

    @flows.tool(name="mrtr")
    async def mrtr_flow(service: str, ctx: mrtr.FlowContext) -> str:
        """(2) The same tool as an mrtr flow."""
        target = await ctx.elicit(QUESTION, Target)
        return f"deployed {service} to {target.env}"

    return mcp


# -- the HTTP server subprocess --------------------------------------------------------------


def serve() -> None:
    """Child process: bind a free loopback port, print it, serve until killed."""
    import uvicorn

    app = build_server().http_app()
    sock = loopback_socket()
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


@contextlib.asynccontextmanager
async def http_server() -> AsyncIterator[tuple[str, int]]:
    """Start the server subprocess and yield its URL and pid. The process is always killed."""
    async with server_processes(Path(__file__).resolve(), [], 1) as (server,):
        yield server.url, server.pid


# -- the clients -----------------------------------------------------------------------------

Call = Callable[[str], Awaitable[None]]


async def on_elicit(context: ClientRequestContext | None, params: t.ElicitRequestParams) -> t.ElicitResult:
    if not isinstance(params, t.ElicitRequestFormParams) or params.message != QUESTION:
        raise RuntimeError(f"unexpected elicitation: {params!r}")
    return t.ElicitResult(action="accept", content=dict(ANSWER))


def official_client(target: Any) -> Client:
    return Client(target, elicitation_callback=on_elicit, read_timeout_seconds=30)  # a hung server fails the run


def official_call(client: Client) -> Call:
    async def call(variant: str) -> None:
        result = await client.call_tool(variant, ARGS)
        if result.is_error or result.structured_content != {"result": RESULT}:
            raise RuntimeError(f"{variant} returned {result!r}")

    return call


async def fastmcp_answer(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
    if message != QUESTION:
        raise RuntimeError(f"unexpected elicitation: {message!r}")
    return dict(ANSWER)


def fastmcp_call(client: fastmcp.Client[Any]) -> Call:
    async def call(variant: str) -> None:
        result = await client.call_tool(variant, ARGS)
        if result.is_error or result.data != RESULT:
            raise RuntimeError(f"{variant} returned {result!r}")

    return call


@contextlib.asynccontextmanager
async def inprocess() -> AsyncIterator[tuple[Call, Client]]:
    async with official_client(build_server()._mcp_server) as client:
        yield official_call(client), client


@contextlib.asynccontextmanager
async def inmemory() -> AsyncIterator[tuple[Call, fastmcp.Client[Any]]]:
    async with fastmcp.Client(build_server(), elicitation_handler=fastmcp_answer, timeout=30) as client:
        yield fastmcp_call(client), client


# -- measuring -------------------------------------------------------------------------------


async def timed_cycles(call: Call, n: int, warmup: int) -> Times:
    """Run the warm-up, then `n` cycles, each timing every variant once (order alternating)."""
    for _ in range(warmup):
        for variant in VARIANTS:
            await call(variant)
    times: Times = {v: [] for v in VARIANTS}
    gc.collect()
    for i in range(n):
        for j in range(len(VARIANTS)):
            variant = VARIANTS[(i + j) % len(VARIANTS)]
            start = time.perf_counter()
            await call(variant)
            times[variant].append(time.perf_counter() - start)
    return times


async def state_sizes(client: Client) -> dict[str, int]:
    """Length of the sealed `requestState` each variant's round 1 sends (the string the client echoes)."""
    sizes: dict[str, int] = {}
    for variant in VARIANTS:
        result = await client.session.call_tool(variant, ARGS, allow_input_required=True)
        if not isinstance(result, t.InputRequiredResult) or result.request_state is None:
            raise RuntimeError(f"{variant} did not ask on round 1: {result!r}")
        sizes[variant] = len(result.request_state.encode())
    return sizes


def report(title: str, times: Times, rng: random.Random) -> tuple[float, tuple[float, float]]:
    print(f"\n{title}: client-observed latency per 2-round call, n={len(times['guard'])} each")
    print(f"  {'variant':<18} {'median ms':>10} {'p90 ms':>9} {'min ms':>9}")
    for variant in VARIANTS:
        values = times[variant]
        print(f"  {LABELS[variant]:<18} {ms(statistics.median(values)):>10} {ms(p90(values)):>9} {ms(min(values)):>9}")
    guard, flow = statistics.median(times["guard"]), statistics.median(times["mrtr"])
    ratio, ci = flow / guard, ratio_ci(times["mrtr"], times["guard"], rng)
    print(f"  (2)/(1) = {ratio:.3f}  95% CI {ci[0]:.3f}-{ci[1]:.3f}   (2) - (1) = {ms(flow - guard)} ms per call")
    return ratio, ci


def verdict(name: str, ratio: float, ci: tuple[float, float]) -> str:
    status = "MET" if ratio <= TARGET else "NOT MET"
    note = "" if (ci[1] <= TARGET or ci[0] > TARGET) else "   (95% CI straddles the limit)"
    return f"  (2)/(1) {name:<26} {ratio:6.3f}  95% CI {ci[0]:.3f}-{ci[1]:.3f}  target <= {TARGET}  {status}{note}"


async def main(args: argparse.Namespace) -> list[tuple[str, float, tuple[float, float]]]:
    rng = random.Random(2322)
    started = time.perf_counter()
    print(
        f"FastMCP guard pattern vs mrtr.fastmcp flow: fastmcp {version('fastmcp')}, mcp {version('mcp')}, "
        f"mrtr {mrtr.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"n={args.n} cycles (+{args.warmup} warm-up) per transport"
    )
    found = []

    async with inprocess() as (call, client):
        sizes = await state_sizes(client)
        times = await timed_cycles(call, args.n, args.warmup)
    print(
        f"\nrequestState as sealed on the wire: (1) guard {sizes['guard']} bytes, (2) mrtr {sizes['mrtr']} bytes "
        f"(plaintext: guard {len(GUARD_STATE)} bytes; mrtr's journal)"
    )
    medians = {f"{v} in-process ms": statistics.median(times[v]) * 1e3 for v in VARIANTS}
    title = "In-process, official mcp.Client(mcp._mcp_server), 2026-07-28 direct dispatch"
    found.append(("in-process", *report(title, times, rng)))

    async with inmemory() as (call, _fm_client):
        times = await timed_cycles(call, args.n, args.warmup)
    title = "In-memory, fastmcp.Client(mcp) (FastMCPTransport; fastmcp's own client, reference)"
    found.append(("in-memory fastmcp.Client", *report(title, times, rng)))

    async with http_server() as (url, pid), official_client(url) as client:
        await client.list_tools()
        print(f"\nHTTP: uvicorn {version('uvicorn')} subprocess pid {pid} serving mcp.http_app() at {url}")
        times = await timed_cycles(official_call(client), args.n, args.warmup)
    found.append(("HTTP", *report("HTTP (loopback), official mcp.Client(url)", times, rng)))

    print("\nTarget (ratio of median latencies; interval = paired bootstrap)")
    for name, ratio, ci in found:
        print(verdict(name, ratio, ci))
    met = all(ratio <= TARGET for _name, ratio, _ci in found)
    print(f"\n{'TARGET MET' if met else 'TARGET NOT MET'} (measured in {time.perf_counter() - started:.0f}s)")
    if args.summary:  # one machine-readable line, for benchmarks/against.py
        print("SUMMARY " + json.dumps({f"(2)/(1) {name}": ratio for name, ratio, _ci in found} | medians))
    return found


# -- profiling -------------------------------------------------------------------------------


def _where(filename: str) -> str:
    """A short file name: relative to site-packages or src/, else the file's own name."""
    if "site-packages/" in filename:
        return filename.split("site-packages/")[-1]
    if "/src/" in filename:
        return filename.split("/src/")[-1]
    return Path(filename).name if filename.startswith("/") else filename


def _package(filename: str) -> str:
    """Who owns a frame: mrtr, fastmcp, mcp (incl. mcp_types), pydantic, this script, or the stdlib."""
    where = _where(filename)
    if filename == __file__:
        return "benchmark"
    for name in ("mrtr", "fastmcp", "mcp_types", "mcp", "pydantic_core", "pydantic", "anyio"):
        if where.startswith(f"{name}/"):
            return "mcp" if name == "mcp_types" else "pydantic" if name == "pydantic_core" else name
    return "stdlib/other"


def profile_inprocess(n: int, top: int = 20) -> None:
    """cProfile `n` in-process calls of each variant on one client; print where (2)'s extra time goes.

    Both variants are profiled on the same server and client, interleaved, after a shared warm-up.
    Reported per call: own (self) time by package, the functions whose cumulative time grows most
    from (1) to (2), and mrtr's own functions in (2).
    """

    async def run() -> dict[str, pstats.Stats]:
        profilers = {variant: cProfile.Profile() for variant in VARIANTS}
        async with inprocess() as (call, _client):
            for _ in range(100):
                for variant in VARIANTS:
                    await call(variant)
            gc.collect()
            for i in range(n):  # interleaved like the timed cycles; each profiler sees only its variant
                for j in range(len(VARIANTS)):
                    variant = VARIANTS[(i + j) % len(VARIANTS)]
                    profilers[variant].enable()
                    await call(variant)
                    profilers[variant].disable()
        return {variant: pstats.Stats(profiler) for variant, profiler in profilers.items()}

    stats = asyncio.run(run())
    raw: dict[str, dict[tuple[str, int, str], Any]] = {v: s.stats for v, s in stats.items()}  # type: ignore[attr-defined]
    totals = {v: sum(row[2] for row in raw[v].values()) / n for v in VARIANTS}
    print(
        f"\nProfile: {n} in-process calls per variant under cProfile (it inflates small calls; compare the two "
        f"columns, not with the latencies above). CPU per call: (1) {ms(totals['guard'])} ms, "
        f"(2) {ms(totals['mrtr'])} ms, (2)-(1) = {ms(totals['mrtr'] - totals['guard'])} ms"
    )

    own: dict[str, dict[str, float]] = {v: {} for v in VARIANTS}
    for variant in VARIANTS:
        for (filename, _line, _name), row in raw[variant].items():
            package = _package(filename)
            own[variant][package] = own[variant].get(package, 0.0) + row[2] / n
    print(f"\n  own (self) time per call by package: {'(1) us':>8} {'(2) us':>8} {'(2)-(1)':>8}")
    packages = sorted(set(own["guard"]) | set(own["mrtr"]), key=lambda p: -(own["mrtr"].get(p, 0.0)))
    for package in packages:
        guard, flow = own["guard"].get(package, 0.0), own["mrtr"].get(package, 0.0)
        print(f"  {package:<37} {guard * 1e6:>8.1f} {flow * 1e6:>8.1f} {(flow - guard) * 1e6:>+8.1f}")

    def cumulative(variant: str) -> dict[tuple[str, int, str], float]:
        return {key: row[3] / n for key, row in raw[variant].items() if "asyncio" not in key[0]}

    cum = {v: cumulative(v) for v in VARIANTS}
    keys = set(cum["guard"]) | set(cum["mrtr"])
    delta = {key: cum["mrtr"].get(key, 0.0) - cum["guard"].get(key, 0.0) for key in keys}
    print(f"\n  largest growth in cumulative time per call, (1) -> (2): {'(1) us':>8} {'(2) us':>8} {'(2)-(1)':>8}")
    for key, grow in sorted(delta.items(), key=lambda kv: -kv[1])[:top]:
        filename, line, name = key
        label = f"{name} ({_where(filename)}:{line})"
        guard, flow = cum["guard"].get(key, 0.0), cum["mrtr"].get(key, 0.0)
        print(f"  {label[:70]:<70} {guard * 1e6:>8.1f} {flow * 1e6:>8.1f} {grow * 1e6:>+8.1f}")

    print(f"\n  what (1) does and (2) skips, by cumulative time: {'(1) us':>8} {'(2) us':>8} {'(2)-(1)':>8}")
    for key, grow in sorted(delta.items(), key=lambda kv: kv[1])[: top // 2]:
        filename, line, name = key
        label = f"{name} ({_where(filename)}:{line})"
        guard, flow = cum["guard"].get(key, 0.0), cum["mrtr"].get(key, 0.0)
        print(f"  {label[:70]:<70} {guard * 1e6:>8.1f} {flow * 1e6:>8.1f} {grow * 1e6:>+8.1f}")

    print(f"\n  {LABELS['mrtr']}: mrtr's own functions by cumulative time per call {'us':>8} {'own us':>7}")
    rows = [(key, row) for key, row in raw["mrtr"].items() if _package(key[0]) == "mrtr"]
    for (filename, line, name), row in sorted(rows, key=lambda kv: -kv[1][3])[:top]:
        label = f"{name} ({_where(filename)}:{line})"
        print(f"  {label[:70]:<70} {row[3] / n * 1e6:>8.1f} {row[2] / n * 1e6:>7.1f}")


def engine_timers(n: int) -> None:
    """Wall time of mrtr's `run_request` per round inside real in-process (2) calls (timers, no profiler)."""
    samples: dict[str, list[float]] = {"first": [], "retry": []}
    original = host_call.run_request

    async def timed_run_request(services: Any, spec: Any, ctx: Any, *args: Any, **kwargs: Any) -> Any:
        retry = ctx.request_state is not None
        start = time.perf_counter()
        try:
            return await original(services, spec, ctx, *args, **kwargs)
        finally:
            samples["retry" if retry else "first"].append(time.perf_counter() - start)

    async def run() -> Times:
        async with inprocess() as (call, _client):
            times = await timed_cycles(call, n, 100)
        for values in samples.values():
            del values[: len(values) - n]  # keep the timed cycles only
        return times

    host_call.run_request = timed_run_request  # type: ignore[assignment]
    try:
        times = asyncio.run(run())
    finally:
        host_call.run_request = original
    first, retry = statistics.median(samples["first"]), statistics.median(samples["retry"])
    extra = statistics.median(times["mrtr"]) - statistics.median(times["guard"])
    print(
        f"\nmrtr's engine alone in (2), in-process, medians over {n} calls (timers, no profiler): run_request round 1 "
        f"{ms(first)} ms + round 2 {ms(retry)} ms = {ms(first + retry)} ms per call; (2)-(1) latency in the same "
        f"run: {ms(extra)} ms per call. The rest of (2) is the FastMCP/SDK path it shares with (1)."
    )


# -- entry -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="FastMCP guard pattern vs mrtr.fastmcp flow, same 2-round tool.")
    parser.add_argument("--n", type=int, default=1500, help="timed cycles per transport; each times both variants")
    parser.add_argument("--warmup", type=int, default=None, help="untimed cycles first (default: n/10, at least 20)")
    parser.add_argument("--quick", action="store_true", help="smoke run: n=40, 10 warm-up cycles")
    parser.add_argument("--profile", action="store_true", help="then cProfile the in-process loop of each variant")
    parser.add_argument("--profile-n", type=int, default=2000, help="calls per profile pass (default 2000)")
    parser.add_argument("--summary", action="store_true", help="end with one SUMMARY line of JSON (for against.py)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.warmup, args.profile_n = 40, 10, 200
    if args.warmup is None:
        args.warmup = max(20, args.n // 10)
    if args.n < 5:
        parser.error("--n must be at least 5")
    return args


def _entry() -> int:
    args = parse_args()
    if args.serve:
        serve()
        return 0
    asyncio.run(main(args))
    if args.profile:
        engine_timers(args.profile_n)
        profile_inprocess(args.profile_n)
    return 0  # a measurement, not a test: missing the target is reported, never an error


if __name__ == "__main__":
    sys.exit(_entry())
