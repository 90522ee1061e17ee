"""Run a flow: one request of an ephemeral flow, or one run of a durable task.

request -> `run_flow` -> `execute` (a `Replay` of the journal, served by a `JournalDriver`)
-> flow function -> the value, an `InputRequiredResult` whose `requestState` is the
encoded journal (the SDK's `RequestStateBoundary` seals it on the way out and verifies it
on the way back in), or — for a task-enabled call — a durable task that takes over.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, ClientCapabilities, InputRequiredResult
from mcp_types.version import is_version_at_least

from mrtr import journal as journal_codec
from mrtr.context import FlowContext
from mrtr.drivers import BecomeTask, JournalDriver, LiveDriver
from mrtr.errors import FlowError, FlowExpired, StateTooLarge, TooManyRounds
from mrtr.journal import Journal, JournalFormatError
from mrtr.replay import Replay
from mrtr.shedding import run_round  # issue 11

if TYPE_CHECKING:
    from mrtr.guard import ReplayGuard  # issue 11
    from mrtr.shedding import LoadShedder, ShedPoint  # issue 11
    from mrtr.worker import TaskRuntime

_STATELESS_VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

TaskSupport = Literal["never", "optional", "required"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-flow limits. The deadline counts from the flow's first round and never renews."""

    max_rounds: int = 25
    deadline: float = 3600.0
    max_state_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        if not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ValueError("deadline must be a positive number of seconds")
        if self.max_state_bytes < 256:
            raise ValueError("max_state_bytes below 256 cannot hold a sealed journal")


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """A registered flow: the user's function and how to call it."""

    name: str
    fn: Callable[..., Any]
    ctx_param: str | None
    limits: Limits
    audience: str
    task: TaskSupport = "never"
    mrtr_first: bool = False
    """Task calls ask inline (MRTR rounds) until the first step or `continue_as_task()`."""
    runtime: TaskRuntime | None = None
    replay_guard: ReplayGuard | None = None  # issue 11: single-use rounds (mrtr.guard)
    shedding: LoadShedder | None = None  # issue 11: load shedding (mrtr.shedding)

    @property
    def request_param(self) -> str:
        """Where the SDK injects its `Context`: the flow's own ctx parameter, or a hidden one."""
        return self.ctx_param or "mrtr_request"


@dataclass
class Outcome:
    """How one run of a flow against its journal ended."""

    replay: Replay
    parked: bool = False
    """Settled with asks outstanding (`replay.parked`)."""
    became_task: bool = False
    value: Any = None
    error: BaseException | None = None


class TaskCreated(MCPError):
    """Carries a `CreateTaskResult` out of the SDK's tool call to the tasks extension.

    The SDK passes `MCPError`s through its tool wrapper untouched; the extension's
    `tools/call` interceptor catches this one and answers with `result` instead.
    """

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(code=INTERNAL_ERROR, message="task created outside the tasks extension")
        self.result = result


async def run_flow(spec: FlowSpec, request: Context[Any, Any], arguments: Mapping[str, Any]) -> Any:
    """Run one request of `spec`; returns the flow's value or an `InputRequiredResult`."""
    # Read the request once, from the SDK's plain per-request context: the pydantic
    # `Context` properties cost more per access than the rest of a round's bookkeeping.
    wire = request.request_context
    version = wire.protocol_version
    capabilities = wire.session.client_capabilities
    modern = version is not None and is_version_at_least(version, _STATELESS_VERSION)
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
            assert spec.runtime is not None
            raise TaskCreated(await spec.runtime.start(spec, arguments, capabilities, Journal.start()))
        probe = declared
    if not modern:
        return await call_flow(spec, FlowContext(LiveDriver(request), request), arguments)
    try:
        return await _run_round(spec, request, wire.params or {}, capabilities, arguments, probe)
    except FlowError as exc:
        raise as_protocol_error(spec, exc) from exc


def as_protocol_error(spec: FlowSpec, exc: FlowError) -> MCPError:
    code = INVALID_PARAMS if isinstance(exc, FlowExpired | TooManyRounds) else INTERNAL_ERROR
    return MCPError(code=code, message=str(exc), data={"reason": exc.reason, "flow": spec.name})


def declares_tasks(capabilities: ClientCapabilities | None) -> bool:
    return capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})


async def call_flow(spec: FlowSpec, ctx: FlowContext, arguments: Mapping[str, Any]) -> Any:
    kwargs = dict(arguments)
    if spec.ctx_param is not None:
        kwargs[spec.ctx_param] = ctx
    return await spec.fn(**kwargs)


async def execute(
    spec: FlowSpec,
    journal: Journal,
    answers: Mapping[str, Any],
    capabilities: ClientCapabilities | None,
    arguments: Mapping[str, Any],
    *,
    request: Context[Any, Any] | None = None,
    probe: bool = False,
    checkpoint: Callable[[], Awaitable[None]] | None = None,
    shed: ShedPoint | None = None,  # issue 11: shed points of an ephemeral round (mrtr.shedding)
) -> Outcome:
    """Run the flow once from the top against `journal`, until it ends or settles on asks."""
    replay = Replay(journal, answers, capabilities)
    driver = JournalDriver(replay, probe=probe, checkpoint=checkpoint, shed=shed)  # issue 11: shed=
    flow = asyncio.get_running_loop().create_task(call_flow(spec, FlowContext(driver, request), arguments))
    replay.flow_task = flow
    try:
        await flow
    except BaseException:
        # The flow ended badly or settled (we read which below) — unless *we* are being
        # cancelled, in which case awaiting it has cancelled it too: let it finish, re-raise.
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            if not flow.done():
                await asyncio.wait({flow})
            raise
    finally:
        replay.close()
    if flow.cancelled() and replay.settled:
        return Outcome(replay, parked=True)
    if flow.cancelled():
        raise asyncio.CancelledError
    error = flow.exception()
    if probe or isinstance(error, BecomeTask):
        # Probing ends at the first side effect, or at the end: either way a task takes over.
        return Outcome(replay, became_task=True)
    return Outcome(replay, value=None if error else flow.result(), error=error)


async def _run_round(
    spec: FlowSpec,
    request: Context[Any, Any],
    params: Mapping[str, Any],
    capabilities: ClientCapabilities | None,
    arguments: Mapping[str, Any],
    probe: bool,
) -> Any:
    # `params` already passed the SDK's validation (malformed inputResponses are -32602
    # before we run) and the boundary's unsealing (requestState is our plaintext).
    journal = _load_journal(spec, params.get("requestState"))
    answers = params.get("inputResponses") or {}
    # issue 11: the round runs under the instance's replay guard and load shedding (mrtr.shedding.run_round).
    body = _round_body(spec, request, capabilities, arguments, probe, journal, answers)
    return await run_round(spec, request, params, journal, answers, body)


async def _round_body(  # issue 11: the rest of _run_round, split off so run_round can wrap it
    spec: FlowSpec,
    request: Context[Any, Any],
    capabilities: ClientCapabilities | None,
    arguments: Mapping[str, Any],
    probe: bool,
    journal: Journal,
    answers: Mapping[str, Any],
) -> Any:
    shed = spec.shedding.point(journal) if spec.shedding is not None else None  # issue 11
    outcome = await execute(spec, journal, answers, capabilities, arguments, request=request, probe=probe, shed=shed)
    if outcome.parked:
        return _input_required(spec, request, outcome.replay)
    if outcome.became_task:
        assert spec.runtime is not None
        raise TaskCreated(await spec.runtime.start(spec, arguments, capabilities, journal))
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
    if time.time() > journal.started_at + spec.limits.deadline:
        raise FlowExpired(
            f"flow {spec.name!r} passed its {spec.limits.deadline:g}s deadline; start the call again without state"
        )
    return journal


def _input_required(spec: FlowSpec, request: Context[Any, Any], replay: Replay) -> InputRequiredResult:
    journal = replay.journal
    journal.rounds += 1
    if journal.rounds > spec.limits.max_rounds:
        raise TooManyRounds(f"flow {spec.name!r} needed more than {spec.limits.max_rounds} rounds of client input")
    journal.pending = replay.pending()
    state = journal_codec.encode(journal)
    # Sealing at most ~2.7x the state plus a fixed envelope: only near the cap is it worth estimating.
    if (
        3 * len(state) + 512 >= spec.limits.max_state_bytes
        and (sealed := sealed_size(state, request, spec.audience)) > spec.limits.max_state_bytes
    ):
        raise StateTooLarge(
            f"flow {spec.name!r} would carry a {sealed:,}-byte requestState, over its "
            f"{spec.limits.max_state_bytes:,}-byte cap; keep step results small (journal an id, not a payload)"
        )
    return InputRequiredResult(
        input_requests={key: ask.request for key, ask in replay.parked.items()},
        request_state=state,
    )


def sealed_size(state: str, request: Context[Any, Any], audience: str) -> int:
    """Upper estimate of the token `RequestStateBoundary` will mint around `state`.

    Mirrors its claims envelope (times, method, target, argument digest, audience and a
    principal tag) and AES-GCM framing (4-byte key id, 12-byte nonce, 16-byte tag, base64url).
    """
    params = request.request_context.params or {}
    method = request.request_context.method
    target = str(params.get("uri" if method == "resources/read" else "name", ""))
    now = time.time()
    claims = {"v": 1, "iat": now, "exp": now, "m": method, "t": target, "a": "x" * 22, "s": state}
    claims |= {"aud": audience, "p": "x" * 32}
    payload = len(json.dumps(claims, separators=(",", ":"))) + 8
    return 3 + math.ceil((4 + 12 + payload + 16) * 4 / 3)
