"""The engine's part of one inline round of a flow: `tools/call`, `prompts/get` or `resources/read`.

The host core reads the request into a `Round` (`mrtr._host.call.run_request`), loads its
journal (`load_journal`) and runs the instance's round policies (`Services.policies`: replay
guard, load shedding) around `round_body` -> `execute` (`mrtr._engine.run`: a `Replay` of the
journal) -> flow function -> the value, an `InputRequiredResult` whose `requestState` is the
encoded journal (the SDK's `RequestStateBoundary` seals it on the way out and verifies it on
the way back in), or — for a task-enabled call — `TaskStarted` (`start_task`): a durable task
takes over, at the flow's first side effect or `ctx.continue_as_task()`, or where another
round would pass the round cap (`max_rounds`): the client declared the tasks extension, so
the rest of its questions go through `tasks/get` and `tasks/update`, which it does not cap.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, InputRequiredResult
from mcp_types.version import is_version_at_least

from mrtr._engine import journal as journal_codec
from mrtr._engine import sealing
from mrtr._engine.journal import Journal, JournalFormatError
from mrtr._engine.replay import Replay
from mrtr._engine.round import Round, Services
from mrtr._engine.run import RunOptions, check_deadline, close_round, execute, wire_asks
from mrtr._engine.spec import FlowSpec, TaskStarted
from mrtr._telemetry import metrics

_STATELESS_VERSION = "2026-07-28"

logger = logging.getLogger("mrtr.engine")


@functools.lru_cache(maxsize=64)
def stateless(version: str) -> bool:
    """Whether `version` is 2026-07-28 or later: asked every round, of a handful of versions."""
    return is_version_at_least(version, _STATELESS_VERSION)


async def start_task(spec: FlowSpec, services: Services, round: Round, journal: Journal) -> TaskStarted:
    """The call becomes a durable task, created for the request's own principal and idempotency key."""
    if services.tasks is None:
        raise RuntimeError(f"flow {spec.name!r} can become a task, but no task engine was given")
    created = await services.tasks.start(spec, round.arguments, round.capabilities, journal, round.wire)
    return TaskStarted(created)


async def round_body(services: Services, round: Round) -> Any:
    """The engine's part of a round, behind the instance's policies: run, then answer."""
    spec, journal, state = round.spec, round.journal, round.state
    assert journal is not None  # loaded by the host core (`load_journal`) before any policy runs
    outcome = await execute(
        spec,
        journal,
        round.answers,
        round.capabilities,
        round.arguments,
        RunOptions(
            round=round,
            probe=round.probe,
            budget=journal_budget(round),
            state_cap=spec.limits.max_state_bytes,
            base_size=journal_codec.embedded_length(state) if state else None,
            shed=round.shed,
            checkpoint=round.checkpoint,
        ),
    )
    if outcome.parked:
        if round.probe and journal.rounds >= spec.limits.max_rounds:
            # The client declared the tasks extension and one more round would pass the cap its
            # own client most likely shares: the call continues as a durable task instead, with
            # every answer so far; its next questions go out through tasks/get, uncapped.
            logger.info(
                "flow %s (%s): reached its round cap (max_rounds=%d) inline; continues as a durable task",
                spec.name,
                journal.flow_id,
                spec.limits.max_rounds,
            )
            if round.gate is not None:
                await round.gate()  # creating the task is a side effect: only a run the round is this one's
            return await start_task(spec, services, round, journal)
        return _input_required(round, outcome.replay)
    if outcome.became_task:
        if round.gate is not None:
            await round.gate()  # creating the task is a side effect: only a run the round is this one's
        return await start_task(spec, services, round, journal)
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


def load_journal(spec: FlowSpec, state: str | None) -> Journal:
    """The journal `requestState` carries (a fresh one in round 1); -32602 for one this server cannot read."""
    if not state:
        return Journal.start()
    try:
        journal = journal_codec.decode(state)
    except JournalFormatError as exc:
        raise MCPError(
            code=INVALID_PARAMS,
            message="requestState is not a journal this server can read; start the call again without it",
            data={"reason": "incompatible_request_state", "flow": spec.name},
        ) from exc
    check_deadline(spec, journal)
    return journal


def _input_required(round: Round, replay: Replay) -> InputRequiredResult:
    journal = replay.journal
    close_round(round.spec, replay)
    state = sealing.state_within_cap(journal, round)
    if metrics.enabled():
        metrics.state_size(round.spec.name, sealing.sealed_size(state, round))
    return InputRequiredResult(input_requests=wire_asks(replay), request_state=state)


def journal_budget(round: Round) -> int:
    """Bytes the encoded journal may take so that the sealed state stays under the cap.

    An eighth of the cap stays free for what the round adds after the flow ran (the
    pending asks, the round counter), so the final check never fails after steps ran.
    """
    spec = round.spec
    cap = spec.limits.max_state_bytes
    key = (spec.name, spec.audience, round.method, cap)
    budget = _budgets.get(key)
    if budget is None:  # the envelope is the same for every round of a flow, but for its target
        if len(_budgets) > 1024:
            _budgets.clear()
        budget = _budgets[key] = (cap - sealing.sealed_size("", round, target="")) * 3 // 4 - cap // 8
    return budget - len(round.target) * 2  # escaped, as the envelope holds it


_budgets: dict[tuple[str, str, str, int], int] = {}


__all__ = ["journal_budget", "load_journal", "round_body", "start_task", "stateless"]
