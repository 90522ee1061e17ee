"""One inline request of a flow: a round of `tools/call`, `prompts/get` or `resources/read`.

request -> `run_flow` (the request read once into a `Round`, its journal loaded) -> the
instance's round policies (`Services.policies`: replay guard, load shedding) -> the round
body -> `execute` (`mrtr._engine.run`: a `Replay` of the journal) -> flow function -> the
value, an `InputRequiredResult` whose `requestState` is the encoded journal (the SDK's
`RequestStateBoundary` seals it on the way out and verifies it on the way back in), or —
for a task-enabled call — `TaskStarted`: a durable task takes over.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, InputRequiredResult
from mcp_types.version import is_version_at_least

from mrtr._engine import journal as journal_codec
from mrtr._engine import metrics, sealing
from mrtr._engine.asks import supports
from mrtr._engine.context import FlowContext
from mrtr._engine.drivers import LiveDriver, missing_capability
from mrtr._engine.journal import Journal, JournalFormatError
from mrtr._engine.replay import Replay
from mrtr._engine.round import Round, Services, chain
from mrtr._engine.run import RunOptions, as_protocol_error, call_flow, check_deadline, close_round, execute, wire_asks
from mrtr._engine.spec import FlowSpec, TaskStarted
from mrtr._errors import FlowError
from mrtr._wire import TASKS_EXTENSION, declares_tasks

_STATELESS_VERSION = "2026-07-28"

_NO_SERVICES = Services()


@functools.lru_cache(maxsize=64)
def _stateless(version: str) -> bool:
    """Whether `version` is 2026-07-28 or later: asked every round, of a handful of versions."""
    return is_version_at_least(version, _STATELESS_VERSION)


async def run_flow(
    spec: FlowSpec,
    request: Any,
    arguments: Mapping[str, Any],
    services: Services | None = None,
    *,
    wire: Any = None,
    state_security: Callable[[], RequestStateSecurity | None] | None = None,
) -> Any:
    """Run one request of `spec`; returns the flow's value, an `InputRequiredResult`, or `TaskStarted`.

    `services` are what the instance lends the flow (task creation, replay guard, load
    shedding); the engine only knows their shapes (`mrtr._engine.spec`). What it raises (a
    user's refusal, a protocol error for the client) the host core sorts and logs
    (`mrtr._host.call`).
    """
    services = services or _NO_SERVICES
    round = Round.read(spec, request, arguments, wire, state_security)
    version, capabilities = round.protocol_version, round.capabilities
    modern = version is not None and _stateless(version)
    for capability in spec.requires:  # in round 1, before the user answers anything
        if not supports(capabilities, capability):
            raise missing_capability(capability)
    probe = False
    if spec.task != "never":
        declared = modern and declares_tasks(capabilities)
        if spec.task == "required" and not declared:
            raise MCPError(
                code=-32021,
                message=f"{spec.name!r} runs only as a task; declare the {TASKS_EXTENSION} extension",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        if declared and not spec.mrtr_first:
            return await start_task(spec, services, round, Journal.start())
        probe = declared
    if not modern:
        return await call_flow(spec, FlowContext(LiveDriver(round.wire, spec.name), request), arguments)
    round.probe = probe
    # `params` already passed the SDK's validation (malformed inputResponses are -32602
    # before we run) and the boundary's unsealing (requestState is our plaintext).
    handler = services.handler
    if handler is None:
        handler = services.handler = chain(services.policies, lambda round: _round_body(services, round))
    try:
        round.journal = _load_journal(spec, round.state)
        return await handler(round)
    except FlowError as exc:
        raise as_protocol_error(spec, exc) from exc


async def start_task(spec: FlowSpec, services: Services, round: Round, journal: Journal) -> TaskStarted:
    """The call becomes a durable task, created for the request's own principal and idempotency key."""
    if services.tasks is None:
        raise RuntimeError(f"flow {spec.name!r} can become a task, but no task engine was given")
    created = await services.tasks.start(spec, round.arguments, round.capabilities, journal, round.wire)
    return TaskStarted(created)


async def _round_body(services: Services, round: Round) -> Any:
    """The engine's part of a round, behind the instance's policies: run, then answer."""
    spec, journal, state = round.spec, round.journal, round.state
    assert journal is not None  # loaded by `run_flow` before any policy runs
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
        ),
    )
    if outcome.parked:
        return _input_required(round, outcome.replay)
    if outcome.became_task:
        return await start_task(spec, services, round, journal)
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


def _load_journal(spec: FlowSpec, state: str | None) -> Journal:
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


__all__ = ["journal_budget", "run_flow", "start_task"]
