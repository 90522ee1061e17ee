"""Traces and log context for flows: what a round, a step, a shed or a task did, and where.

The official SDK already opens an OpenTelemetry span per inbound request (`tools/call
deploy`, kind SERVER). mrtr nests its own spans under it, through `opentelemetry-api` only
(no exporter is forced on anyone: without an SDK configured these are no-op spans that
cost a context-variable lookup):

- `mrtr.round <flow>`: one run of a flow against its journal (one MRTR round, or one run
  of a durable task), with the flow id, the round number, how many steps came from the
  journal and how many really ran, the asks parked, and the sealed state size;
- `mrtr.step <name>`: one step that really runs (never a replay), with its idempotency key
  and outcome;
- events on the current span for a replayed `requestState` refused, a request shed, and a
  task's status change (each also counted by `mrtr._engine.metrics`).

Logging: `get_logger(name)` is a standard logger (named by role: `mrtr.engine`,
`mrtr.tasks.runtime`, ...) whose records carry
`flow_id` and `task_id` attributes (None outside a flow), taken from the flow being run;
`LogContextFilter` stamps the same attributes on any record (attach it to a handler to
use `%(flow_id)s` in a format shared with other libraries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode

from mrtr._engine import metrics
from mrtr._engine.sealing import sealed_size

if TYPE_CHECKING:
    from mrtr._engine.round import Round
    from mrtr._engine.spec import FlowSpec

TRACER_NAME = "mrtr"
"""The OpenTelemetry tracer mrtr's spans come from (filter or sample on it)."""
_tracer = trace.get_tracer(TRACER_NAME)

_flow_id: ContextVar[str | None] = ContextVar("mrtr_flow_id", default=None)
_task_id: ContextVar[str | None] = ContextVar("mrtr_task_id", default=None)


# -- log context ----------------------------------------------------------------------------


def bind_task(task_id: str) -> None:
    """Mark the current asyncio task (and the tasks it starts) as running durable task `task_id`."""
    _task_id.set(task_id)


def current_ids() -> dict[str, str | None]:
    """The flow id and task id of the code running now (None outside a flow or task), for log records."""
    return {"flow_id": _flow_id.get(), "task_id": _task_id.get()}


class _FlowLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**current_ids(), **(kwargs.get("extra") or {})}
        return msg, kwargs


def get_logger(name: str) -> logging.LoggerAdapter:  # type: ignore[type-arg]
    """`logging.getLogger(name)`, with `flow_id` / `task_id` on every record it emits."""
    return _FlowLogger(logging.getLogger(name), {})


class LogContextFilter(logging.Filter):
    """Adds `flow_id` / `task_id` to every record passing a handler (None outside a flow)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current_ids().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


# -- spans ----------------------------------------------------------------------------------


def enabled() -> bool:
    """Whether an OpenTelemetry SDK is configured (spans cost a round ~20 µs even as no-ops).

    Until an application sets a provider, the API hands out a proxy whose spans are no-ops.
    `get_tracer_provider()` reads the environment on every call, so the global it fills is
    read directly where the API has it.
    """
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # an API without that global: ask it (slower)
        provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return provider is not None and not isinstance(provider, trace.NoOpTracerProvider)


_UNKNOWN = object()


def bind_flow(flow_id: str) -> Token[str | None]:
    """Put `flow_id` on every log record of the current context (see `LogContextFilter`)."""
    return _flow_id.set(flow_id)


def unbind_flow(token: Token[str | None]) -> None:
    _flow_id.reset(token)


@contextmanager
def round_span(spec: FlowSpec, replay: Any, round: Round | None = None) -> Iterator[Span]:
    """Span one run of `spec` against `replay`'s journal; everything is read off `replay` at the end.

    Wrap the body of `engine.execute` in it: the flow runs as an asyncio task created
    inside, so steps and logs in the flow see this span and the flow id.
    """
    journal = replay.journal
    before = set(journal.steps)
    attributes: dict[str, Any] = {
        "mrtr.flow": spec.name,
        "mrtr.flow_id": journal.flow_id,
        "mrtr.round": journal.rounds + 1,
    }
    if (task_id := _task_id.get()) is not None:
        attributes["mrtr.task_id"] = task_id
    token = _flow_id.set(journal.flow_id)
    try:
        with _tracer.start_as_current_span(f"mrtr.round {spec.name}", attributes=attributes) as span:
            try:
                yield span
            finally:
                if span.is_recording():
                    _finish_round(span, spec, replay, before, round)
    finally:
        _flow_id.reset(token)


def _finish_round(span: Span, spec: FlowSpec, replay: Any, before: set[str], round: Round | None) -> None:
    journal = replay.journal
    new = [key for key in journal.steps if key not in before]
    span.set_attribute("mrtr.steps.replayed", len(before))
    span.set_attribute("mrtr.steps.new", len(new))
    parked = list(replay.parked) if replay.settled else []
    span.set_attribute("mrtr.outcome", _outcome(replay, parked))
    span.set_attribute("mrtr.asks.parked", len(parked))
    if parked:
        span.set_attribute("mrtr.asks.keys", parked)
        if round is not None:
            # What `_input_required` will seal: measured only when someone records the span.
            from dataclasses import replace

            from mrtr._engine import journal as journal_codec

            state = journal_codec.encode(replace(journal, rounds=journal.rounds + 1, pending=replay.pending()))
            span.set_attribute("mrtr.state.bytes", len(state))
            span.set_attribute("mrtr.state.sealed_bytes", sealed_size(state, round))


def _outcome(replay: Any, parked: list[str]) -> str:
    """`parked`, `completed`, `became_task`, `cancelled` or `error:<type>` (flow errors are values, not raises)."""
    if parked:
        return "parked"
    ending = getattr(replay, "ending", None)
    if not getattr(replay, "flow_ended", False):
        return "interrupted"
    if isinstance(ending, asyncio.CancelledError):
        return "cancelled"
    if not isinstance(ending, BaseException):
        return "completed"
    return "became_task" if type(ending).__name__ == "BecomeTask" else f"error:{type(ending).__name__}"


@contextmanager
def step_span(name: str, idempotency_key: str) -> Iterator[Span]:
    """Span one step that really runs; outcome `ok` or the exception's type (recorded)."""
    attributes = {"mrtr.step": name, "mrtr.idempotency_key": idempotency_key}
    if (flow_id := _flow_id.get()) is not None:
        attributes["mrtr.flow_id"] = flow_id
    with _tracer.start_as_current_span(f"mrtr.step {name}", attributes=attributes) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute("mrtr.step.outcome", type(exc).__name__)
            span.set_status(StatusCode.ERROR, str(exc) or type(exc).__name__)
            raise
        span.set_attribute("mrtr.step.outcome", "ok")


def _event(name: str, attributes: dict[str, Any], fallback_span: str) -> None:
    """An event on the current span, or on a short span of its own when none is recording.

    Background work (a task worker, a scanner) may run in the context of a request span
    that has already ended; an event added there would be dropped. Without a configured
    OpenTelemetry SDK nothing records it: skipped (the no-op span alone costs ~60 µs).
    """
    if not enabled():
        return
    attributes = {k: v for k, v in attributes.items() if v is not None}
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes)
        return
    with _tracer.start_as_current_span(fallback_span, attributes=attributes) as own:
        own.add_event(name, attributes)


def replay_refused(flow: str, reason: str) -> None:
    """A `requestState` came back that must not be used again (e.g. already consumed)."""
    metrics.replay_refused(flow, reason)
    _event("mrtr.replay_refused", {"mrtr.flow": flow, "mrtr.reason": reason}, f"mrtr.replay_refused {flow}")


def shed(flow: str, reason: str) -> None:
    """A request was turned away (or answered with state only) to protect the server."""
    metrics.shed(flow, reason)
    _event("mrtr.shed", {"mrtr.flow": flow, "mrtr.reason": reason}, f"mrtr.shed {flow}")


def task_status(task_id: str, flow: str, status: str, message: str | None = None, previous: str | None = None) -> None:
    """A durable task moved to `status` (working, input_required, completed, failed, cancelled).

    `previous`: the status it left, when known (None: a new task); a run parking on durable
    waits stays `working`, which is an event on the span but no transition in the metrics.
    """
    if previous != status:
        metrics.task_status(flow, status)
    attributes = {"mrtr.task_id": task_id, "mrtr.flow": flow, "mrtr.task.status": status, "mrtr.message": message}
    _event("mrtr.task.status", attributes, f"mrtr.task {status}")


__all__ = [
    "TRACER_NAME",
    "LogContextFilter",
    "bind_task",
    "current_ids",
    "get_logger",
    "replay_refused",
    "round_span",
    "shed",
    "step_span",
    "task_status",
]
