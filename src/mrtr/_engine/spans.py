"""The round span: `mrtr.round <flow>`, one run of a flow against its journal.

The one span that reads the engine's own types (the round, the journal and what sealing it
would cost), so it lives here, on the tracer and the log context of `mrtr._telemetry.tracing`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from mrtr._engine import journal as journal_codec
from mrtr._engine.sealing import sealed_size
from mrtr._telemetry import tracing

if TYPE_CHECKING:
    from mrtr._engine.round import Round
    from mrtr._engine.spec import FlowSpec


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
    if (task_id := tracing.current_task_id()) is not None:
        attributes["mrtr.task_id"] = task_id
    token = tracing.bind_flow(journal.flow_id)
    try:
        with tracing.tracer().start_as_current_span(f"mrtr.round {spec.name}", attributes=attributes) as span:
            try:
                yield span
            finally:
                if span.is_recording():
                    _finish_round(span, spec, replay, before, round)
    finally:
        tracing.unbind_flow(token)


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


__all__ = ["round_span"]
