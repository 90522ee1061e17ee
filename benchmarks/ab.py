"""This tree's mrtr against an earlier one (a git ref) in ONE process, call by call.

`against.py` runs each benchmark script on both trees in turn; on a busy machine even
alternating runs drift apart. Here both engines serve side by side in one event loop and
every timed cycle calls both, in rotating order, so load and drift fall on both alike:

  * the earlier tree's `src/mrtr` (from `--base`, default `main`) is exported and imported
    as the package `mrtr_base`: its `mrtr` imports and module-path strings are renamed, a
    benchmark-only copy (logger and metric names change with it; nothing else does);
  * each engine gets its own `MCPServer` (same key type, same tools, plus the hand-written
    floor (d) of `rounds.py`) and its own official `mcp.Client`, in process;
  * flows that start no tasks of their own, so the two copies' task factories (one per
    loop, whichever installed first) never matter.

Figures, for each engine, with the ratio this/base:
  * the 2-round tool of `rounds.py` (c): client-observed median, and the server-side cost
    over the floor (d) on the same server (outermost middleware, boundary included);
  * the cost per replayed journal entry (`replay.py`'s last-round replays, N = 1/50/100
    answers or steps; least-squares slope of the client-observed medians);
  * a 100-round loop per request against the 2-round tool per request;
  * FastMCP 4: `mrtr.fastmcp` flow over FastMCP's own guard pattern (`fastmcp.py`'s tools),
    in process, on one FastMCP server per engine;
  * the engine alone (no SDK, no client): decoding, running and encoding a journal, per
    answer it holds.

Run: `PYTHONPATH=src .venv/bin/python benchmarks/ab.py [--base REF] [--n N] [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import mcp_types as t
from benchkit import ratio_ci
from mcp import Client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
CLOCK = time.perf_counter
"""Wall time; `--clock cpu` times this thread's CPU instead (both engines, client and server
run in it), which a busy machine's preemption does not inflate."""
ENGINES = ("base", "this")
SIZES = (1, 50, 100)
LOOP_ROUNDS = 100
QUESTION = "Deploy api where?"


class Target(BaseModel):
    env: str


class Answer(BaseModel):
    value: str


FLOOR_REQUEST = t.ElicitRequest(
    params=t.ElicitRequestFormParams(message=QUESTION, requested_schema=render_elicitation_schema(Target))
)


def question(i: int) -> str:
    return f"Question {i} of the chain?"


def make_plan(i: int) -> dict[str, Any]:
    return {"id": f"plan-{i}", "replicas": 3}


# -- the earlier tree, importable beside this one ------------------------------------------------

_IMPORT = re.compile(r"^(\s*)(from|import) mrtr(?=[.\s])", re.MULTILINE)
_MODULE_PATH = re.compile(r"""(["'])mrtr\.""")


def load_base(ref: str, into: Path) -> ModuleType:
    """`src/mrtr` at `ref`, renamed to `mrtr_base` (imports and module-path strings) and imported."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src/mrtr"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    package = into / "mrtr_base"
    (into / "src" / "mrtr").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = _IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} mrtr_base", text)
        path.write_text(_MODULE_PATH.sub(lambda m: f"{m.group(1)}mrtr_base.", text))
    sys.path.insert(0, str(into))
    return importlib.import_module("mrtr_base")


# -- servers -----------------------------------------------------------------------------------

SAMPLES: dict[str, list[float]] = defaultdict(list)
"""Server-side round times in seconds, keyed "<engine>:<tool>/<first|retry>"."""


def round_timer(engine: str) -> Callable[..., Awaitable[HandlerResult]]:
    async def timer(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}
        if ctx.method != "tools/call":
            return await call_next(ctx)
        retry = "retry" if params.get("requestState") is not None else "first"
        start = CLOCK()
        try:
            return await call_next(ctx)
        finally:
            SAMPLES[f"{engine}:{params.get('name')}/{retry}"].append(CLOCK() - start)

    return timer


def build_server(engine: str, lib: Any) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(
        f"ab-{engine}", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]), log_level="WARNING"
    )
    server._lowlevel_server.middleware.insert(0, round_timer(engine))
    flows = lib.Flows(server, max_rounds=LOOP_ROUNDS + 1)

    async def two(service: str, ctx: Any) -> str:
        """rounds.py's (c): one elicitation, then the result."""
        target = await ctx.elicit(QUESTION, Target)
        return f"deployed {service} to {target.env}"

    @server.tool()
    async def floor(service: str, ctx: Context[Any, Any]) -> str | t.InputRequiredResult:
        """rounds.py's (d): the cheapest correct 2-round tool."""
        answer = (ctx.input_responses or {}).get("target")
        if ctx.request_state == "1" and isinstance(answer, t.ElicitResult) and answer.action == "accept":
            return f"deployed {service} to {Target.model_validate(answer.content).env}"
        return t.InputRequiredResult(input_requests={"target": FLOOR_REQUEST}, request_state="1")

    async def asks(n: int, ctx: Any) -> int:
        total = 0
        for i in range(n):
            total += len((await ctx.elicit(question(i), Answer)).value)
        return total

    async def steps(n: int, ctx: Any) -> int:
        replicas = 0
        for i in range(n):
            replicas += (await ctx.step("plan", make_plan, i))["replicas"]
        return replicas + len((await ctx.elicit(question(0), Answer)).value)

    async def loop(ctx: Any) -> int:
        total = 0
        for i in range(LOOP_ROUNDS):
            total += len((await ctx.elicit(question(i), Answer)).value)
        return total

    for fn in (two, asks, steps, loop):  # each engine's own FlowContext class marks the parameter
        fn.__annotations__["ctx"] = lib.FlowContext
        flows.tool()(fn)
    return server


async def on_elicit(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    content = {"value": "prod-eu-west-1"} if params.message.startswith("Question ") else {"env": "prod"}
    return t.ElicitResult(action="accept", content=content)


def new_client(server: Any) -> Client:
    return Client(server, elicitation_callback=on_elicit, input_required_max_rounds=LOOP_ROUNDS + 1)


async def last_round(client: Client, tool: str, n: int) -> tuple[str, t.InputResponses]:
    result = await client.session.call_tool(tool, {"n": n}, allow_input_required=True)
    while True:
        assert isinstance(result, t.InputRequiredResult) and result.request_state is not None, result
        answers: t.InputResponses = {
            key: t.ElicitResult(action="accept", content={"value": "prod-eu-west-1"})
            for key in (result.input_requests or {})
        }
        following = await client.session.call_tool(
            tool, {"n": n}, input_responses=answers, request_state=result.request_state, allow_input_required=True
        )
        if not isinstance(following, t.InputRequiredResult):
            return result.request_state, answers
        result = following


# -- measuring ---------------------------------------------------------------------------------

Call = Callable[[], Awaitable[None]]


async def interleave(calls: dict[str, Call], n: int, warmup: int) -> dict[str, list[float]]:
    """Client-observed seconds per call of each case, the order rotating every cycle."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for cycle in range(warmup + n):
        if cycle == warmup:
            SAMPLES.clear()
            gc.collect()
        for j in range(len(names)):
            name = names[(cycle + j) % len(names)]
            start = CLOCK()
            await calls[name]()
            if cycle >= warmup:
                times[name].append(CLOCK() - start)
    return times


def slope(xs: tuple[int, ...], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


async def measure_mcp(libs: dict[str, Any], n: int, loops: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {engine: {} for engine in ENGINES}
    async with contextlib.AsyncExitStack() as stack:  # clients leave in reverse order (anyio's scopes)
        clients = {
            engine: await stack.enter_async_context(new_client(build_server(engine, lib)))
            for engine, lib in libs.items()
        }
        calls: dict[str, Call] = {}
        for engine, client in clients.items():
            for tool in ("two", "floor"):
                calls[f"{engine}:{tool}"] = _tool_call(client, tool, {"service": "api"})
            for kind in ("asks", "steps"):
                for size in SIZES:
                    state, answers = await last_round(client, kind, size)
                    calls[f"{engine}:{kind}{size}"] = _replay_call(client, kind, size, state, answers)
        times = await interleave(calls, n, max(10, n // 10))
        med = {name: statistics.median(values) for name, values in times.items()}
        rng = __import__("random").Random(34)
        for engine in ENGINES:
            row = figures[engine]
            row["(c) in-process ms"] = med[f"{engine}:two"] * 1e3
            row["(d) floor in-process ms"] = med[f"{engine}:floor"] * 1e3
            server = {
                tool: sum(statistics.median(SAMPLES[f"{engine}:{tool}/{r}"]) for r in ("first", "retry"))
                for tool in ("two", "floor")
            }
            row["(c) over (d) server ms"] = (server["two"] - server["floor"]) * 1e3
            for kind in ("asks", "steps"):
                row[f"{kind} us/entry"] = slope(SIZES, [med[f"{engine}:{kind}{s}"] for s in SIZES]) * 1e6
                row |= {f"{kind} N={s} last round ms": med[f"{engine}:{kind}{s}"] * 1e3 for s in SIZES}
        lo, hi = ratio_ci(times["this:two"], times["base:two"], rng)
        figures["this"]["(c) this/base 95% CI lo"], figures["this"]["(c) this/base 95% CI hi"] = lo, hi
        if not loops:
            return figures
        # The 100-round loop, interleaved with the 2-round tool, per request.
        loop_calls: dict[str, Call] = {}
        for engine, client in clients.items():
            loop_calls[f"{engine}:loop"] = _tool_call(client, "loop", {})
            loop_calls[f"{engine}:two"] = _tool_call(client, "two", {"service": "api"})
        times = await interleave(loop_calls, loops, 2)
        for engine in ENGINES:
            per_request = statistics.median(times[f"{engine}:loop"]) / (LOOP_ROUNDS + 1)
            single = statistics.median(times[f"{engine}:two"]) / 2
            figures[engine]["loop per request ms"] = per_request * 1e3
            figures[engine]["loop/1-round per request"] = per_request / single
    return figures


def _tool_call(client: Client, tool: str, args: dict[str, Any]) -> Call:
    async def call() -> None:
        result = await client.call_tool(tool, args)
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {result!r}")

    return call


def _replay_call(client: Client, tool: str, n: int, state: str, answers: t.InputResponses) -> Call:
    async def call() -> None:
        result = await client.session.call_tool(
            tool, {"n": n}, input_responses=answers, request_state=state, allow_input_required=True
        )
        if isinstance(result, t.InputRequiredResult) or result.is_error:
            raise RuntimeError(f"{tool}({n}) did not finish: {result!r}")

    return call


async def measure_fastmcp(libs: dict[str, Any], n: int) -> dict[str, dict[str, float]]:
    """`fastmcp.py`'s in-process comparison, one FastMCP server per engine, all interleaved."""
    # benchmarks/fastmcp.py would shadow the fastmcp package: import it (and the adapters) without this directory.
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    try:
        from fastmcp import Context as FastContext
        from fastmcp import FastMCP

        adapters = {engine: importlib.import_module(f"{lib.__name__}.fastmcp") for engine, lib in libs.items()}
    finally:
        sys.path[:] = saved
    calls: dict[str, Call] = {}
    stack = contextlib.AsyncExitStack()
    for engine, lib in libs.items():
        mcp: FastMCP[Any] = FastMCP(f"fm-{engine}", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
        flows = adapters[engine].Flows(mcp)

        async def guard(service: str, ctx: FastContext) -> str | t.InputRequiredResult:
            answers = ctx.input_responses
            reply = answers.get("target") if answers is not None else None
            if reply is None or ctx.request_state != "asked1":
                return t.InputRequiredResult(input_requests={"target": FLOOR_REQUEST}, request_state="asked1")
            if not isinstance(reply, t.ElicitResult) or reply.action != "accept":
                raise ValueError("expected an accepted elicitation")
            return f"deployed {service} to {Target.model_validate(reply.content).env}"

        async def flow(service: str, ctx: Any) -> str:
            target = await ctx.elicit(QUESTION, Target)
            return f"deployed {service} to {target.env}"

        guard.__annotations__["ctx"] = FastContext  # the annotations are strings; these classes are local
        flow.__annotations__["ctx"] = lib.FlowContext
        mcp.tool(name="guard")(guard)
        flows.tool(name="flow")(flow)
        client = await stack.enter_async_context(new_client(mcp._mcp_server))
        calls[f"{engine}:guard"] = _tool_call(client, "guard", {"service": "api"})
        calls[f"{engine}:flow"] = _tool_call(client, "flow", {"service": "api"})
    async with stack:
        times = await interleave(calls, n, max(10, n // 10))
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        engine: {
            "FastMCP flow/guard in-process": med[f"{engine}:flow"] / med[f"{engine}:guard"],
            "FastMCP flow in-process ms": med[f"{engine}:flow"] * 1e3,
        }
        for engine in ENGINES
    }


async def measure_engine(libs: dict[str, Any], n: int) -> dict[str, dict[str, float]]:
    """The engine alone, no SDK: decode, run and encode a journal of N answers, per entry.

    `execute` is run directly on each engine's own journal of the `asks` flow's last round
    (built by running the flow round by round), as the round body runs it; the slope between
    N=1 and N=100 is the cost of one replayed answer in each part.
    """
    caps = t.ClientCapabilities(elicitation=t.ElicitationCapability())
    answer = {"action": "accept", "content": {"value": "prod-eu-west-1"}}

    async def asks(n: int, ctx: Any) -> int:
        total = 0
        for i in range(n):
            total += len((await ctx.elicit(question(i), Answer)).value)
        return total

    cases: dict[tuple[str, int], tuple[Any, Any, Any, str, dict[str, Any]]] = {}
    for engine, lib in libs.items():
        codec = importlib.import_module(f"{lib.__name__}._engine.journal")
        try:  # execute and close_round: _engine/run.py since the engine's split, _engine/engine.py before
            run = importlib.import_module(f"{lib.__name__}._engine.run")
        except ModuleNotFoundError:
            run = importlib.import_module(f"{lib.__name__}._engine.engine")
        spec_module = importlib.import_module(f"{lib.__name__}._engine.spec")
        spec = spec_module.FlowSpec(
            name="asks", fn=asks, ctx_param="ctx", limits=spec_module.Limits(max_rounds=1000), audience="ab"
        )
        for size in (1, 100):
            journal, answers = codec.Journal.start(), {}
            while True:
                state = codec.encode(journal)
                outcome = await run.execute(spec, codec.decode(state), answers, caps, {"n": size})
                if not outcome.parked:
                    break
                run.close_round(spec, outcome.replay)
                journal = outcome.replay.journal
                answers = {key: json.loads(json.dumps(answer)) for key in outcome.replay.parked}
            # As an inline round carries it: a durable task's journal also keeps each ask's question
            # for people (#38), which a run without a round records; it is not part of this figure.
            inline = codec.decode(state)
            if getattr(inline, "questions", None):
                inline.questions = {}
                state = codec.encode(inline)
            cases[(engine, size)] = (codec, run, spec, state, answers)
    parts: dict[tuple[str, int], dict[str, list[float]]] = {case: defaultdict(list) for case in cases}
    order = list(cases)
    for cycle in range(n):
        for j in range(len(order)):
            case = order[(cycle + j) % len(order)]
            codec, run, spec, state, answers = cases[case]
            began = CLOCK()
            journal = codec.decode(state)
            decoded = CLOCK()
            outcome = await run.execute(spec, journal, answers, caps, {"n": case[1]})
            ran = CLOCK()
            codec.encode(journal)
            parts[case]["decode"].append(decoded - began)
            parts[case]["run"].append(ran - decoded)
            parts[case]["encode"].append(CLOCK() - ran)
            assert outcome.value is not None
    figures: dict[str, dict[str, float]] = {engine: {} for engine in ENGINES}
    for engine in ENGINES:
        for part in ("decode", "run", "encode"):
            wide, narrow = (statistics.median(parts[(engine, size)][part]) for size in (100, 1))
            figures[engine][f"engine {part} us/answer"] = (wide - narrow) / 99 * 1e6
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description="This tree's mrtr vs a git ref's, interleaved in one process.")
    parser.add_argument("--base", default="main", help="git ref of the earlier engine (default: main)")
    parser.add_argument("--n", type=int, default=600, help="timed cycles (each calls every case of both engines)")
    parser.add_argument("--loops", type=int, default=15, help="timed 100-round loops per engine")
    parser.add_argument("--quick", action="store_true", help="smoke run: n=30, 3 loops")
    parser.add_argument("--no-fastmcp", action="store_true", help="skip the FastMCP comparison")
    parser.add_argument("--no-loop", action="store_true", help="skip the 100-round loop")
    parser.add_argument("--this-first", action="store_true", help="build this tree's engine first (default: base)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what a call's time is (see CLOCK)")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        args.n, args.loops = 30, 3
    import mrtr

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mrtr-ab-") as tmp:
        base = load_base(args.base, Path(tmp))
        # Which engine's server is built (and runs) first matters in one process (an engine's
        # asks replay faster on the first-built server, by up to a third): run both orders.
        libs = {"this": mrtr, "base": base} if args.this_first else {"base": base, "this": mrtr}
        print(
            f"A/B in one process: base = {args.base} ({Path(base.__file__).parent}), this = "
            f"{Path(mrtr.__file__).parent}; Python {platform.python_version()}, {os.cpu_count()} CPUs, n={args.n}, "
            f"{args.clock} clock, {next(iter(libs))} first"
        )
        figures = asyncio.run(measure_mcp(libs, args.n, 0 if args.no_loop else args.loops))
        for engine, row in asyncio.run(measure_engine(libs, max(100, args.n // 3))).items():
            figures[engine] |= row
        if not args.no_fastmcp:
            for engine, row in asyncio.run(measure_fastmcp(libs, args.n)).items():
                figures[engine] |= row
    print(f"\n  {'figure':<34} {'base':>10} {'this':>10} {'this/base':>10}")
    for figure, value in figures["this"].items():
        base_value = figures["base"].get(figure)
        if base_value is None:
            print(f"  {figure:<34} {'':>10} {value:>10.3f}")
            continue
        print(f"  {figure:<34} {base_value:>10.3f} {value:>10.3f} {value / base_value:>10.3f}")
    print(f"\nmeasured in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
