"""Spans and log context: mrtr's spans nest under the SDK's request span, one per round and per real step.

Uses the OpenTelemetry SDK's in-memory exporter (a dev dependency; mrtr itself needs only
`opentelemetry-api`). The provider is process-global, so it is installed once per process.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as t
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

import mrtr
import mrtr._telemetry.tracing
from mrtr.client import FlowClient
from mrtr.stores._sqlite import SQLiteStore
from mrtr.tracing import LogContextFilter
from tests.support.flowkit import new_server, sampled

pytestmark = pytest.mark.anyio

_EXPORTER = InMemorySpanExporter()


def _install_exporter() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER


exporter = _install_exporter()


class Name(BaseModel):
    name: str


class Confirm(BaseModel):
    ok: bool


RAN: list[str] = []


def remember(name: str) -> str:
    RAN.append(name)
    return f"id-{name}"


def build() -> mrtr.Flows:
    server = new_server("traced")
    flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), task_poll_interval=0.05)

    @flows.tool()
    async def greet(ctx: mrtr.FlowContext) -> str:
        who = await ctx.elicit("Who?", Name, key="who")
        ident = await ctx.step("register", remember, who.name)
        poem = await ctx.sample(f"A line for {who.name}", max_tokens=20, key="line")
        return f"{ident}: {poem.content.text}"

    @flows.tool(task="required")
    async def chore(ctx: mrtr.FlowContext) -> str:
        await ctx.step("prepare", remember, "chore")
        answer = await ctx.elicit("Go on?", Confirm, key="go")
        return "done" if answer.ok else "stopped"

    return flows


def by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_rounds_and_steps_nest_under_the_sdk_request_span() -> None:
    exporter.clear()
    RAN.clear()
    flows = build()
    sent: list[str] = []

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        sent.append(params.message)
        return t.ElicitResult(action="accept", content={"name": "Ada"})

    async def sample(params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return sampled("roses")

    async with FlowClient(flows.server, elicit=elicit, sample=sample) as client:
        result = await client.call_tool("greet", {})
    assert result.content[0].text == "id-Ada: roses"

    spans = exporter.get_finished_spans()
    requests = [s for s in by_name(spans, "tools/call greet") if s.kind == trace.SpanKind.SERVER]
    rounds = by_name(spans, "mrtr.round greet")
    steps = by_name(spans, "mrtr.step")
    assert len(requests) == 3 and len(rounds) == 3  # ask name, ask sampling, complete
    request_ids = {s.context.span_id for s in requests}
    assert all(r.parent is not None and r.parent.span_id in request_ids for r in rounds)

    first, second, last = sorted(rounds, key=lambda s: s.attributes["mrtr.round"])
    assert [r.attributes["mrtr.round"] for r in (first, second, last)] == [1, 2, 3]
    assert len({r.attributes["mrtr.flow_id"] for r in rounds}) == 1
    assert first.attributes["mrtr.outcome"] == "parked"
    assert first.attributes["mrtr.asks.parked"] == 1
    assert list(first.attributes["mrtr.asks.keys"]) == ["who"]
    assert 0 < first.attributes["mrtr.state.bytes"] < first.attributes["mrtr.state.sealed_bytes"]
    assert (second.attributes["mrtr.steps.replayed"], second.attributes["mrtr.steps.new"]) == (0, 1)
    assert (last.attributes["mrtr.steps.replayed"], last.attributes["mrtr.steps.new"]) == (1, 0)
    assert last.attributes["mrtr.outcome"] == "completed"

    # The step ran once (round 2), and its span sits in that round with its idempotency key.
    assert RAN == ["Ada"] and len(steps) == 1
    step = steps[0]
    assert step.parent is not None and step.parent.span_id == second.context.span_id
    flow_id = second.attributes["mrtr.flow_id"]
    assert step.attributes["mrtr.idempotency_key"] == f"{flow_id}:register"
    assert step.attributes["mrtr.step.outcome"] == "ok"


async def test_a_failing_step_is_marked_and_task_status_changes_are_events() -> None:
    exporter.clear()
    flows = build()

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        return t.ElicitResult(action="accept", content={"ok": True})

    async with FlowClient(flows.server, elicit=elicit, tasks=True) as client:
        result = await client.call_tool("chore", {})
    assert result.content[0].text == "done"
    spans = exporter.get_finished_spans()
    events = [(e.attributes or {}) for s in spans for e in s.events if e.name == "mrtr.task.status"]
    statuses = [e["mrtr.task.status"] for e in events]
    assert statuses == ["working", "input_required", "working", "completed"]  # created, asks, answered, done
    assert len({e["mrtr.task_id"] for e in events}) == 1
    task_rounds = by_name(spans, "mrtr.round chore")
    assert task_rounds and all(r.attributes.get("mrtr.task_id") == events[0]["mrtr.task_id"] for r in task_rounds)
    assert by_name(spans, "mrtr.step prepare")[0].attributes["mrtr.step.outcome"] == "ok"


async def test_step_errors_are_recorded_on_the_step_span() -> None:
    exporter.clear()
    server = new_server("traced-errors")
    flows = mrtr.Flows(server)

    def explode() -> None:
        raise RuntimeError("disk full")

    @flows.tool()
    async def fragile(ctx: mrtr.FlowContext) -> str:
        await ctx.step("explode", explode)
        return "unreachable"

    async with FlowClient(flows.server) as client:
        result = await client.call_tool("fragile", {})
    assert result.is_error
    (step,) = by_name(exporter.get_finished_spans(), "mrtr.step explode")
    assert step.attributes["mrtr.step.outcome"] == "RuntimeError"
    assert step.status.status_code == trace.StatusCode.ERROR
    (round_,) = by_name(exporter.get_finished_spans(), "mrtr.round fragile")
    assert round_.attributes["mrtr.outcome"] == "error:RuntimeError"


async def test_log_records_carry_the_flow_id(caplog: pytest.LogCaptureFixture) -> None:
    flows = build()
    answers: list[dict[str, Any]] = [{"name": 42}, {"name": "Bo"}]  # the first does not fit: re-asked

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        return t.ElicitResult(action="accept", content=answers.pop(0))

    async def sample(params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return sampled("x")

    caplog.handler.addFilter(LogContextFilter())
    with caplog.at_level(logging.INFO, logger="mrtr"):
        async with FlowClient(flows.server, elicit=elicit, sample=sample) as client:
            await client.call_tool("greet", {})
    reasks = [r for r in caplog.records if r.name == "mrtr.replay" and "re-asking" in r.getMessage()]
    assert reasks, [r.getMessage() for r in caplog.records]
    assert all(isinstance(r.flow_id, str) and len(r.flow_id) > 8 for r in reasks)  # type: ignore[attr-defined]


def test_shed_and_replay_refused_are_events_on_the_current_span() -> None:
    exporter.clear()
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("tools/call greet"):
        mrtr._telemetry.tracing.shed("greet", "overloaded")
        mrtr._telemetry.tracing.replay_refused("greet", "state already used")
    mrtr._telemetry.tracing.task_status("t1", "chore", "cancelled")  # no current span: a short span of its own
    spans = exporter.get_finished_spans()
    (request,) = by_name(spans, "tools/call greet")
    assert [(e.name, dict(e.attributes or {})) for e in request.events] == [
        ("mrtr.shed", {"mrtr.flow": "greet", "mrtr.reason": "overloaded"}),
        ("mrtr.replay_refused", {"mrtr.flow": "greet", "mrtr.reason": "state already used"}),
    ]
    (own,) = by_name(spans, "mrtr.task cancelled")
    assert own.events[0].attributes == {"mrtr.task_id": "t1", "mrtr.flow": "chore", "mrtr.task.status": "cancelled"}
