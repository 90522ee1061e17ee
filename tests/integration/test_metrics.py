"""Metrics: a flow, a shed round, a guard refusal and task runs record the documented instruments.

Uses the OpenTelemetry SDK's `InMemoryMetricReader` (a dev dependency; mrtr itself needs
only `opentelemetry-api`). OpenTelemetry's global provider can be set once per process, so
each test hands its own provider to mrtr alone (`mrtr.metrics.use_meter_provider`) and
reads exact totals from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from pydantic import BaseModel

import mrtr
from mrtr._guard import ReplayGuard
from mrtr._telemetry import metrics as engine_metrics
from mrtr.client import FlowClient
from mrtr.metrics import METER_NAME, use_meter_provider
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import Driver, accept, manual_client, new_server, text_of

pytestmark = pytest.mark.anyio


class Name(BaseModel):
    name: str


class Confirm(BaseModel):
    ok: bool


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    use_meter_provider(provider)
    try:
        yield reader
    finally:
        use_meter_provider(None)
        provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The data points of instrument `name` on mrtr's meter (empty if it recorded nothing)."""
    data = reader.get_metrics_data()
    found: list[Any] = []
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            if scope.scope.name != METER_NAME:
                continue
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def totals(reader: InMemoryMetricReader, name: str, *keys: str) -> dict[tuple[Any, ...], Any]:
    """Sums (counters) or counts (histograms) of `name`, by the values of attributes `keys`."""
    result: Counter[tuple[Any, ...]] = Counter()
    for point in points(reader, name):
        key = tuple((point.attributes or {}).get(k) for k in keys)
        result[key] += point.count if isinstance(point, HistogramDataPoint) else point.value
    return {k: v for k, v in result.items() if v}


async def test_a_flow_over_two_rounds(reader: InMemoryMetricReader) -> None:
    server = new_server("metered")
    flows = mrtr.Flows(server)
    ran: list[str] = []

    def note(what: str) -> str:
        ran.append(what)
        return what

    @flows.tool()
    async def greet(ctx: mrtr.FlowContext) -> str:
        await ctx.step("lookup", note, "lookup")  # round 1 runs it, round 2 replays it
        who = await ctx.elicit("Who?", Name, key="who")
        await ctx.step("register", note, who.name)  # round 2 runs it
        return f"hello {who.name}"

    async with manual_client(server) as client:
        driver = Driver(client, "greet")
        first = await driver.send()
        assert isinstance(first, t.InputRequiredResult)
        sealed = len(first.request_state or "")
        final = await driver.send({"who": accept(name="Ada")})
    assert isinstance(final, t.CallToolResult) and text_of(final) == "hello Ada"
    assert ran == ["lookup", "Ada"]

    outcomes = ("mrtr.flow", "mrtr.outcome", "mrtr.task")
    assert totals(reader, "mrtr.rounds", *outcomes) == {
        ("greet", "input_required", False): 1,
        ("greet", "completed", False): 1,
    }
    assert totals(reader, "mrtr.round.duration", *outcomes) == {
        ("greet", "input_required", False): 1,
        ("greet", "completed", False): 1,
    }
    assert all(p.sum > 0 for p in points(reader, "mrtr.round.duration"))
    assert totals(reader, "mrtr.steps", "mrtr.flow", "mrtr.step.replayed") == {
        ("greet", False): 2,
        ("greet", True): 1,
    }
    (size,) = points(reader, "mrtr.state.size")
    assert size.count == 1 and size.attributes == {"mrtr.flow": "greet"}
    # the size the state cap estimates, against the token the client really got: over it, by less
    # than what a principal claim and the longest timestamps would add once sealed
    assert sealed <= size.sum <= sealed + 96, (sealed, size.sum)
    for quiet in ("mrtr.shed", "mrtr.replay_refused", "mrtr.task.transitions"):
        assert totals(reader, quiet) == {}, quiet


async def test_a_shed_round(reader: InMemoryMetricReader) -> None:
    server = new_server("metered-shed")
    overloaded = [True]
    flows = mrtr.Flows(server, shed_when=lambda: overloaded[0])

    @flows.tool()
    async def chain(ctx: mrtr.FlowContext) -> str:
        done = [await ctx.step("one", lambda: "one"), await ctx.step("two", lambda: "two")]
        return "+".join(done)

    async with manual_client(server) as client:
        driver = Driver(client, "chain")
        shed = await driver.send()  # runs step one, then sheds before step two
        assert isinstance(shed, t.InputRequiredResult) and not shed.input_requests
        overloaded[0] = False
        final = await driver.send()
    assert isinstance(final, t.CallToolResult) and text_of(final) == "one+two"
    assert flows.shedder is not None and flows.shedder.shed == 1

    assert totals(reader, "mrtr.shed", "mrtr.flow", "mrtr.reason") == {("chain", "overloaded"): 1}
    assert totals(reader, "mrtr.rounds", "mrtr.outcome", "error.type") == {("shed", None): 1, ("completed", None): 1}
    assert totals(reader, "mrtr.steps", "mrtr.step.replayed") == {(False,): 2, (True,): 1}
    assert totals(reader, "mrtr.state.size") == {}  # a shed round carries state, but asks nothing


async def test_a_guard_refusal(reader: InMemoryMetricReader) -> None:
    server = new_server("metered-guard")
    flows = mrtr.Flows(server, replay_guard=ReplayGuard(SQLiteStore(":memory:")))

    @flows.tool()
    async def deploy(ctx: mrtr.FlowContext) -> str:
        where = await ctx.elicit("Where?", Name, key="where")
        return await ctx.step("apply", str, where.name)  # a step finished: re-answering is a fork

    async with manual_client(server) as client:
        driver = Driver(client, "deploy")
        await driver.send()
        state = driver.state
        assert isinstance(await driver.send({"where": accept(name="prod")}), t.CallToolResult)
        with pytest.raises(MCPError) as refused:  # round 2 again, answered differently: a fork
            await client.session.call_tool(
                "deploy", {}, input_responses={"where": accept(name="staging")}, request_state=state
            )
    assert refused.value.data == {"reason": "request_state_forked", "flow": "deploy"}

    assert totals(reader, "mrtr.replay_refused", "mrtr.flow", "mrtr.reason") == {("deploy", "request_state_forked"): 1}
    # the refused round ran nothing
    assert totals(reader, "mrtr.rounds", "mrtr.outcome") == {("input_required",): 1, ("completed",): 1}


async def test_task_runs_and_listen_streams(reader: InMemoryMetricReader) -> None:
    server = new_server("metered-tasks")
    flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), task_poll_interval=0.05)

    @flows.tool(task="required")
    async def chore(ctx: mrtr.FlowContext) -> str:
        await ctx.step("prepare", lambda: "ready")
        return "done"

    @flows.tool(task="required")
    async def review(ctx: mrtr.FlowContext) -> str:
        await ctx.step("prepare", lambda: "ready")
        answer = await ctx.elicit("Go on?", Confirm, key="go")
        return "approved" if answer.ok else "stopped"

    open_while_asked: list[int] = []

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        open_while_asked.append(sum(p.value for p in points(reader, "mrtr.listen.streams")))
        return t.ElicitResult(action="accept", content={"ok": True})

    async with FlowClient(server, elicit=elicit, tasks=True) as client:
        assert text_of(await client.call_tool("chore", {})) == "done"
        transitions = ("mrtr.flow", "mrtr.task.status")
        assert totals(reader, "mrtr.task.transitions", *transitions) == {
            ("chore", "working"): 1,
            ("chore", "completed"): 1,
        }
        assert totals(reader, "mrtr.rounds", "mrtr.flow", "mrtr.outcome", "mrtr.task") == {
            ("chore", "completed", True): 1
        }
        assert text_of(await client.call_tool("review", {})) == "approved"
    # created, parked on its ask, answered (working again), done
    assert totals(reader, "mrtr.task.transitions", *transitions) == {
        ("chore", "working"): 1,
        ("chore", "completed"): 1,
        ("review", "working"): 2,
        ("review", "input_required"): 1,
        ("review", "completed"): 1,
    }
    assert totals(reader, "mrtr.rounds", "mrtr.flow", "mrtr.outcome", "mrtr.task") == {
        ("chore", "completed", True): 1,
        ("review", "input_required", True): 1,
        ("review", "completed", True): 1,
    }
    assert totals(reader, "mrtr.steps", "mrtr.flow", "mrtr.step.replayed") == {
        ("chore", False): 1,
        ("review", False): 1,
        ("review", True): 1,
    }
    # the client followed the task over a listen stream while it was asked; closed with the client
    assert open_while_asked and open_while_asked[0] >= 1
    assert sum(p.value for p in points(reader, "mrtr.listen.streams")) == 0


async def test_tasks_by_status_from_the_store(reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteStore(":memory:")
    monkeypatch.setattr(engine_metrics, "TASK_COUNT_INTERVAL", 0.0)  # every scan refreshes the counts
    engine_metrics._task_counts.clear()  # counts of the stores of earlier tests in this process
    server = new_server("metered-gauge")
    flows = mrtr.Flows(server, store=store, task_poll_interval=0.05, task_scan_interval=0.05)

    @flows.tool(task="required")
    async def chore(ctx: mrtr.FlowContext) -> str:
        return "done"

    @flows.tool(task="required")
    async def review(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("Go on?", Confirm, key="go")
        return "approved"

    seen: list[dict[tuple[Any, ...], Any]] = []

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        # one task done, one asked: the runtime's scanner reports it within a few scans
        for _ in range(100):
            counted = totals(reader, "mrtr.tasks", "mrtr.task.status")
            seen.append({status: n for status, n in counted.items() if n})  # stores report every status
            if seen[-1] == {("completed",): 1, ("input_required",): 1}:
                break
            await anyio.sleep(0.02)
        return t.ElicitResult(action="accept", content={"ok": True})

    async with FlowClient(server, elicit=elicit, tasks=True) as client:
        assert text_of(await client.call_tool("chore", {})) == "done"
        assert text_of(await client.call_tool("review", {})) == "approved"
    assert seen[-1] == {("completed",): 1, ("input_required",): 1}, seen[-3:]
