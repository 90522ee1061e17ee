"""Traces and log context for flows: what a round, a step, a shed or a task did, and where.

The official SDK already opens an OpenTelemetry span per inbound request (`tools/call
deploy`, kind SERVER). mrtr nests its own spans under it, through `opentelemetry-api` only
(no exporter is forced on anyone: without an SDK configured these are no-op spans that
cost a context-variable lookup):

- `mrtr.round <flow>`: one run of a flow against its journal (one MRTR round, or one run
  of a durable task), with the flow id, the round number, how many steps came from the
  journal and how many really ran, the asks parked, and the sealed state size; the engine
  opens it (`mrtr._engine.spans.round_span`), on this module's tracer and log context;
- `mrtr.step <name>`: one step that really runs (never a replay), with its idempotency key
  and outcome;
- events on the current span for a replayed `requestState` refused, a request shed, and a
  task's status change (each also counted by `mrtr._telemetry.metrics`).

Logging: `get_logger(name)` is a standard logger (named by role: `mrtr.engine`,
`mrtr.tasks.runtime`, ...) whose records carry
`flow_id` and `task_id` attributes (None outside a flow), taken from the flow being run;
`LogContextFilter` stamps the same attributes on any record (attach it to a handler to
use `%(flow_id)s` in a format shared with other libraries).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode, Tracer

from mrtr._telemetry import metrics

TRACER_NAME = "mrtr"
"""The OpenTelemetry tracer mrtr's spans come from (filter or sample on it)."""
_tracer = trace.get_tracer(TRACER_NAME)


def tracer() -> Tracer:
    """mrtr's tracer (`TRACER_NAME`), for spans opened outside this module (the engine's round span)."""
    return _tracer


_flow_id: ContextVar[str | None] = ContextVar("mrtr_flow_id", default=None)
_task_id: ContextVar[str | None] = ContextVar("mrtr_task_id", default=None)


# -- log context ----------------------------------------------------------------------------


def bind_task(task_id: str) -> None:
    """Mark the current asyncio task (and the tasks it starts) as running durable task `task_id`."""
    _task_id.set(task_id)


def current_task_id() -> str | None:
    """The durable task the code running now belongs to (see `bind_task`), or None."""
    return _task_id.get()


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
    "bind_flow",
    "bind_task",
    "current_ids",
    "current_task_id",
    "enabled",
    "get_logger",
    "replay_refused",
    "shed",
    "step_span",
    "task_status",
    "tracer",
    "unbind_flow",
]
