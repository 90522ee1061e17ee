"""What FastMCP 3.x's server-side sampling loop costs on mrtr: a 3-tool loop next to a plain `ctx.sample`.

One FastMCP server (`mrtr.fastmcp.Flows`), three tools, each a different use of FastMCP 3.x's
`ctx.sample`; the client's LLM is a `fastmcp.Client` sampling handler that answers at once, so
what is measured is mrtr's and the protocol's cost, not a model's:

  (1) plain     `await ctx.sample("...")`: one model turn, no tools.
  (2) 3 tools   `await ctx.sample("...", tools=[a, b, c])`; the model calls all three in its first
                turn (run as three steps, one at a time), then answers.
  (3) 3 turns   the same tools, but the model calls one per turn, then answers.
  (4) result    (2) with `result_type=`: the answer comes through the `final_response` tool.

Every model turn is a round (the call ends with `input_required`, and the client calls again
with the answer), so a loop of n turns is n + 1 requests; every replay runs the loop from the
top against the journal, so later rounds replay more. Reported per call: requests (`tools/call`
seen by a FastMCP middleware), median and p90 client-observed latency, and the size of the
last round's journal (the `requestState` before the SDK's boundary seals it), over FastMCP's
in-memory client and over HTTP (the official `mcp.Client`, uvicorn in this process).
Method as in benchmarks/rounds.py: warm up, interleave the variants round-robin, median.

Run: `.venv/bin/python benchmarks/sampling.py [--n N] [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/fastmcp.py would shadow the fastmcp package when this runs as a script: drop this
# directory from sys.path and import the shared helpers as `benchmarks.benchkit` from the root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import mcp_types as t  # noqa: E402
import uvicorn  # noqa: E402
from benchmarks.benchkit import loopback_socket, ms, p90  # noqa: E402
from fastmcp import Client, Context, FastMCP  # noqa: E402
from fastmcp.server.middleware import Middleware, MiddlewareContext  # noqa: E402
from mcp import Client as OfficialClient  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.server.request_state import RequestStateSecurity  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import mrtr.fastmcp  # noqa: E402

VARIANTS = ("plain", "3 tools", "3 turns", "result")
TOOL_NAMES = ("weather", "calendar", "traffic")


class Plan(BaseModel):
    leave_at: str
    reason: str


class Count(Middleware):
    """Counts `tools/call` requests (every round is one) and keeps the last journal's size (unsealed)."""

    def __init__(self) -> None:
        self.calls = 0
        self.state_bytes = 0

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        self.calls += 1
        result = await call_next(context)
        state = getattr(getattr(result, "input_required", None), "request_state", None)
        if state is None:
            state = getattr(result, "request_state", None)
        if isinstance(state, str):
            self.state_bytes = len(state)
        return result


def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: rain at 17:00"


def calendar(day: str) -> str:
    """What is on the calendar that day."""
    return f"{day}: dinner at 19:30"


def traffic(route: str) -> str:
    """Travel time on a route."""
    return f"{route}: 40 minutes"


def build() -> tuple[FastMCP[Any], Count]:
    mcp: FastMCP[Any] = FastMCP("sampling-bench", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
    counter = Count()
    mcp.add_middleware(counter)
    flows = mrtr.fastmcp.Flows(mcp, max_rounds=20)
    tools = [weather, calendar, traffic]

    @flows.tool()
    async def plain(ctx: Context) -> str:
        return str((await ctx.sample("When should I leave?")).text)  # type: ignore[attr-defined]

    @flows.tool()
    async def three_tools(ctx: Context) -> str:
        return str((await ctx.sample("When should I leave? [all]", tools=tools)).text)  # type: ignore[attr-defined]

    @flows.tool()
    async def three_turns(ctx: Context) -> str:
        return str((await ctx.sample("When should I leave? [one]", tools=tools)).text)  # type: ignore[attr-defined]

    @flows.tool()
    async def result(ctx: Context) -> str:
        plan = await ctx.sample("When should I leave? [all]", tools=tools, result_type=Plan)  # type: ignore[attr-defined]
        return str(plan.result.leave_at)

    return mcp, counter


def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
    """The client's model: answers at once (the cost measured is the protocol's and mrtr's)."""
    first = messages[0].content
    assert isinstance(first, t.TextContent)
    done = sum(1 for m in messages for b in m.content_as_list if isinstance(b, t.ToolResultContent))
    structured = any(tool.name == "final_response" for tool in params.tools or [])

    def use(*names: str) -> t.CreateMessageResultWithTools:
        blocks = [
            t.ToolUseContent(type="tool_use", id=f"c{done + i}", name=n, input=_arguments(n))
            for i, n in enumerate(names)
        ]
        return t.CreateMessageResultWithTools(role="assistant", content=blocks, model="bench", stop_reason="toolUse")

    if params.tools and done < len(TOOL_NAMES):
        return use(*TOOL_NAMES) if first.text.endswith("[all]") else use(TOOL_NAMES[done])
    if structured:
        return t.CreateMessageResultWithTools(
            role="assistant",
            content=[
                t.ToolUseContent(
                    type="tool_use", id="final", name="final_response", input={"leave_at": "18:30", "reason": "rain"}
                )
            ],
            model="bench",
            stop_reason="toolUse",
        )
    return "Leave at 18:30."


def _arguments(name: str) -> dict[str, Any]:
    return {"weather": {"city": "Lisbon"}, "calendar": {"day": "today"}, "traffic": {"route": "home"}}[name]


TOOL_OF = {"plain": "plain", "3 tools": "three_tools", "3 turns": "three_turns", "result": "result"}
TOOLS_CAP = t.SamplingCapability(tools=t.SamplingToolsCapability())


@asynccontextmanager
async def http_url(mcp: FastMCP[Any]) -> AsyncIterator[str]:
    sock = loopback_socket()  # TCP_NODELAY on accepted sockets: no 40 ms Nagle stalls
    server = uvicorn.Server(uvicorn.Config(mcp.http_app(), log_level="warning", lifespan="on"))
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        await serving
        sock.close()


async def official_llm(context: Any, params: t.CreateMessageRequestParams) -> Any:
    """`llm` as the official client's sampling callback."""
    answer = llm(params.messages, params, context)
    if isinstance(answer, str):
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=answer), model="bench")
    return answer


def fastmcp_client(mcp: FastMCP[Any]) -> Any:
    return Client(mcp, sampling_handler=llm, sampling_capabilities=TOOLS_CAP, timeout=30.0)


def official_client(url: str) -> Any:
    return OfficialClient(
        streamable_http_client(url),
        sampling_callback=official_llm,
        sampling_capabilities=TOOLS_CAP,
        input_required_max_rounds=20,
    )


async def measure(client: Any, counter: Count, n: int, warmup: int) -> dict[str, tuple[list[float], int, int]]:
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    requests: dict[str, int] = {}
    state: dict[str, int] = {}
    async with client:
        for cycle in range(warmup + n):
            order = VARIANTS if cycle % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                before = counter.calls
                started = time.perf_counter()
                result = await client.call_tool(TOOL_OF[variant], {})
                elapsed = time.perf_counter() - started
                assert "18:30" in str(result.content[0].text), result
                if cycle >= warmup:
                    samples[variant].append(elapsed)
                requests[variant] = counter.calls - before
                state[variant] = counter.state_bytes
    return {v: (samples[v], requests[v], state[v]) for v in VARIANTS}


def report(name: str, results: dict[str, tuple[list[float], int, int]]) -> None:
    print(f"\n{name}")
    print(f"  {'variant':<10} {'requests':>8} {'median':>9} {'p90':>9} {'vs plain':>9} {'journal':>11}")
    base = statistics.median(results["plain"][0])
    for variant in VARIANTS:
        values, requests, state = results[variant]
        median = statistics.median(values)
        print(f"  {variant:<10} {requests:>8} {ms(median):>9} {ms(p90(values)):>9} {median / base:>8.1f}x {state:>9} B")


async def run(n: int, warmup: int) -> None:
    mcp, counter = build()
    print(f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; n={n} per variant")
    report("in-memory fastmcp.Client(mcp)", await measure(fastmcp_client(mcp), counter, n, warmup))
    async with http_url(mcp) as url:
        report(
            "HTTP (uvicorn in this process), the official mcp.Client",
            await measure(official_client(url), counter, n, warmup),
        )
    print("\nEvery variant's tools ran once per call (steps): requests = model turns + 1.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200, help="measured calls per variant and transport")
    parser.add_argument("--quick", action="store_true", help="a few calls only (a smoke run)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, runner: Callable[..., Any] = asyncio.run) -> None:
    args = parse_args(argv)
    n, warmup = (5, 1) if args.quick else (args.n, 20)
    runner(run(n, warmup))


if __name__ == "__main__":
    main()
