"""One run of a flow against its journal: what every engine uses.

`execute` runs the flow once from the top against a journal (a `Replay` of it, served by a
`JournalDriver`) until it ends or settles on asks and waits: for an inline request
(`mrtr._engine.inline`), for a durable task's run on the lease runtime
(`mrtr.tasks._worker`) and for a step of a task on Temporal (`mrtr.temporal._activity`).
`close_round` counts a round that ends waiting for the client and `wire_asks` shapes its
asks, for all of them alike; `check_deadline` and `as_protocol_error` are the same flow
limits and errors everywhere.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, ClientCapabilities, InputRequest

from mrtr._engine import branches, spans
from mrtr._engine.asks import Ask
from mrtr._engine.context import FlowContext, current_flow_context, describe_call
from mrtr._engine.drivers import BecomeTask, Checkpointer, JournalDriver
from mrtr._engine.journal import Journal
from mrtr._engine.progress import ProgressSink
from mrtr._engine.replay import Replay
from mrtr._engine.round import Round
from mrtr._engine.spec import FlowSpec, ShedCheck
from mrtr._engine.waits import WaitSource
from mrtr._errors import FlowDefinitionError, FlowError, FlowExpired, NondeterminismError, TooManyRounds
from mrtr._telemetry import metrics, tracing
from mrtr._wire import TASKS_EXTENSION, Wait

logger = logging.getLogger("mrtr.engine")
replay_logger = logging.getLogger("mrtr.replay")

__all__ = [
    "Outcome",
    "RunOptions",
    "as_protocol_error",
    "call_flow",
    "check_deadline",
    "close_round",
    "execute",
    "too_many_rounds",
    "wire_asks",
]


@dataclass
class Outcome:
    """How one run of a flow against its journal ended."""

    replay: Replay
    parked: bool = False
    """Settled with asks outstanding (`replay.parked`)."""
    became_task: bool = False
    value: Any = None
    error: BaseException | None = None
    would_run: list[str] = field(default_factory=list)
    """Steps a dry run reached but did not run (replay testing)."""
    waiting: list[Wait] = field(default_factory=list)
    """The durable waits (timers, events) the run settled on, beside any parked asks."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How `execute` runs a flow, beyond the journal, answers and arguments every run has."""

    round: Round | None = None
    """The request this run serves (None for a task's run, or a test's)."""
    probe: bool = False
    """Stop at the first side effect: the call may become a task (see `FlowSpec.mrtr_first`)."""
    checkpoint: Checkpointer | None = None
    """A durable task's journal writes (`mrtr.tasks._checkpoints.Checkpoints`)."""
    budget: int | None = None
    """Bytes the encoded journal may grow to (`journal_budget`)."""
    state_cap: int | None = None
    base_size: int | None = None
    """The encoded length of the journal the run started from, when it came as `requestState`."""
    shed: ShedCheck | None = None
    step_limit: int | None = None
    """Run at most this many new steps, then settle (Temporal runs one step per activity)."""
    dry_run: bool = False
    """Replay testing: reach steps without running them (`mrtr.testing.check_replay`)."""
    waits: WaitSource | None = None
    """A durable task's clock, events and callback URLs (None: `ctx.sleep` and friends refuse)."""
    progress: ProgressSink | None = None
    """A durable task's status message, set by `ctx.report_progress` (None: reports go to the request)."""


_PLAIN_RUN = RunOptions()


def as_protocol_error(spec: FlowSpec, exc: FlowError) -> MCPError:
    code = INVALID_PARAMS if isinstance(exc, FlowExpired | TooManyRounds) else INTERNAL_ERROR
    data: dict[str, Any] = {"reason": exc.reason, "flow": spec.name}
    if isinstance(exc, TooManyRounds):
        data.update(exc.data)
    return MCPError(code=code, message=str(exc), data=data)


async def call_flow(spec: FlowSpec, ctx: FlowContext, arguments: Mapping[str, Any]) -> Any:
    kwargs = dict(arguments)
    if spec.ctx_param is not None:
        kwargs[spec.ctx_param] = ctx if spec.wrap_context is None else spec.wrap_context(ctx)
    token = current_flow_context.set(ctx)  # `mrtr.step` / `mrtr.gather` find it here
    try:
        value = await spec.fn(**kwargs)
    except Exception as exc:
        ctx.check_awaited(spec.name, exc)  # a never-awaited ctx call is the cause to report
        raise
    except BaseException:  # the round ended (settled, handed over): not the flow's end
        ctx.unawaited()
        raise
    finally:
        current_flow_context.reset(token)
    if inspect.iscoroutine(value):
        call = describe_call(value)
        ctx.unawaited()
        raise FlowDefinitionError(f"flow {spec.name!r} returned {call} unawaited; write `return await {call}`")
    ctx.check_awaited(spec.name, None)
    return value


async def execute(
    spec: FlowSpec,
    journal: Journal,
    answers: Mapping[str, Any],
    capabilities: ClientCapabilities | None,
    arguments: Mapping[str, Any],
    run: RunOptions = _PLAIN_RUN,
) -> Outcome:
    """Run the flow once from the top against `journal`, until it ends or settles on asks.

    Every task the flow started is cancelled and awaited before this returns.
    """
    branches.install(asyncio.get_running_loop())
    replay = Replay(
        journal,
        answers,
        capabilities,
        flow=spec.name,
        budget=run.budget,
        state_cap=run.state_cap,
        base_size=run.base_size,
    )
    driver = JournalDriver(
        replay,
        probe=run.probe,
        checkpoint=run.checkpoint,
        dry_run=run.dry_run,
        shed=run.shed,
        step_limit=run.step_limit,
        waits=run.waits,
        progress=run.progress,
    )
    round = run.round
    request = round.request if round is not None else None
    if (journal.rounds or journal.steps or journal.answers) and not run.dry_run:  # the body runs again
        _log_replay(spec, journal)
    meters = metrics.instruments()  # None (the common case) while no MeterProvider is configured
    started = time.perf_counter() if meters is not None else 0.0
    if tracing.enabled():
        with spans.round_span(spec, replay, round):
            await _run(spec, replay, driver, request, arguments)
    else:  # the common case, kept free of context-manager machinery: every round runs it
        token = tracing.bind_flow(journal.flow_id)
        try:
            await _run(spec, replay, driver, request, arguments)
        finally:
            tracing.unbind_flow(token)
    if meters is not None and not run.dry_run:
        elapsed = time.perf_counter() - started
        meters.round_ran(spec.name, replay, round is None, elapsed, driver.steps_replayed, driver.steps_started)
    outcome = Outcome(replay, would_run=driver.would_run)
    ending = replay.ending
    if replay.settled:
        outcome.parked = True
        outcome.waiting = list(replay.waits.values())
    elif isinstance(ending, asyncio.CancelledError):
        raise asyncio.CancelledError
    elif run.probe or isinstance(ending, BecomeTask):
        # Probing ends at the first side effect, or at the end: either way a task takes over.
        outcome.became_task = True
    elif isinstance(ending, BaseException):
        outcome.error = ending
    else:
        outcome.value = ending
    replay.release()
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("flow %s (%s): this run %s", spec.name, journal.flow_id, _ending(outcome))
    return outcome


def _log_replay(spec: FlowSpec, journal: Journal) -> None:
    """Make a re-run of the body visible: every line outside `ctx.step` runs again, once per round.

    DEBUG on logger `mrtr.replay`; WARNING for a flow registered under `Flows(strict=True)`.
    """
    level = logging.WARNING if spec.strict else logging.DEBUG
    if replay_logger.isEnabledFor(level):
        replay_logger.log(
            level,
            "flow %s (%s): replaying the body for round %d; code outside ctx.step runs again "
            "(its %d journaled step(s) do not)",
            spec.name,
            journal.flow_id,
            journal.rounds + 1,
            len(journal.steps),
        )


def _ending(outcome: Outcome) -> str:
    if outcome.parked:
        return f"settled, waiting for {sorted(outcome.replay.parked)}"
    if outcome.became_task:
        return "continues as a durable task"
    if outcome.error is not None:
        return f"raised {type(outcome.error).__name__}: {outcome.error}"
    return "returned"


async def _run(
    spec: FlowSpec,
    replay: Replay,
    driver: JournalDriver,
    request: Context[Any, Any] | None,
    arguments: Mapping[str, Any],
) -> None:
    """Run the flow as the root of its branches, in this task; tear down all it started.

    The flow's body runs in the calling task rather than a task of its own: a round is
    short, and a task (its creation and the loop passes around it) would cost as much as
    the rest of the round's bookkeeping. Its outcome is left in `replay.ending`.
    """
    task = asyncio.current_task()
    assert task is not None
    cancels_before = task.cancelling()
    replay.root_task = replay.root.task = task
    replay.adopt(task, replay.root)
    token = branches.current_branch.set(replay.root)
    try:
        replay.ending = await call_flow(spec, FlowContext(driver, request), arguments)
    except (KeyboardInterrupt, SystemExit):
        replay.flow_ended = True
        await replay.close()
        raise
    except BaseException as exc:  # the flow's own outcome, or the round settling (read in `execute`)
        replay.ending = exc
    finally:
        replay.flow_ended = True
        branches.current_branch.reset(token)
    # Settling cancelled this task to unwind the flow, and flow code may have left cancel
    # requests of its own on it (Python 3.11's TaskGroup does): none of them is the
    # request's. A cancellation of the request itself ended the flow with CancelledError,
    # which `execute` re-raises unless the round settled anyway.
    for _ in range(task.cancelling() - cancels_before):
        task.uncancel()
    if replay.alone():
        replay.suspended = True  # all `close` would do
    else:
        await replay.close()


def check_deadline(spec: FlowSpec, journal: Journal) -> None:
    """The flow's deadline counts from its first round and is never renewed (inline and task alike)."""
    if time.time() > journal.started_at + spec.limits.deadline:
        raise FlowExpired(
            f"flow {spec.name!r} passed its {spec.limits.deadline:g}s deadline; start the call again without state"
        )


def close_round(spec: FlowSpec, replay: Replay, *, task: bool = False) -> None:
    """Count a round that ends waiting for the client, and remember what it asked.

    Inline rounds and task rounds alike (`task`: the round of a durable task, capped by
    `Limits.task_rounds` rather than the inline `max_rounds`). A question that changes every
    time it is answered (its text holds a clock or a random value) would be asked forever, each
    answer wasted: a single change is a legitimate rolling upgrade, but twice in a row it is
    nondeterminism, reported as such before the round cap is reached.
    """
    journal = replay.journal
    unused = replay.unused_answers()
    journal.reworded = journal.reworded + 1 if unused and replay.parked else 0
    if journal.reworded >= 2:
        new = [key for key in replay.parked if key not in journal.pending] or list(replay.parked)
        raise NondeterminismError(
            f"flow {spec.name!r} asked {_describe(replay.parked[new[0]])} (key {new[0]!r}) instead of the "
            f"question just answered ({unused[0]!r}), twice in a row: the question changes between runs. "
            "Compute its changing parts (clocks, random values, I/O) in a ctx.step so every replay asks the same"
        )
    journal.rounds += 1
    cap = spec.limits.task_rounds if task else spec.limits.max_rounds
    if journal.rounds > cap:
        raise too_many_rounds(spec, cap, journal.rounds - 1, task=task)
    journal.pending = replay.pending()
    if journal.questions:  # keep the questions of the answers and of the asks now out, no others
        journal.questions = {k: v for k, v in journal.questions.items() if k in journal.answers or k in journal.pending}
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "flow %s (%s): round %d ends waiting for %s",
            spec.name,
            journal.flow_id,
            journal.rounds,
            sorted(replay.parked),
        )


def too_many_rounds(spec: FlowSpec, cap: int, used: int, *, task: bool) -> TooManyRounds:
    """The round cap's error: the cap, the rounds used, and what the user (or the server's author) can do.

    An inline call to a tool that can be a task did not declare the tasks extension (one that
    did continues as a task at the cap: `mrtr._engine.inline`), so that is the user's way out;
    a task, or a tool that is never one, can only have its cap raised on the server.
    """
    head = f"flow {spec.name!r} reached its round cap: it asked for client input in {used} rounds, "
    if task:
        return TooManyRounds(
            head + f"the most a task may (task_max_rounds={cap}), and asked again. The server can raise "
            "task_max_rounds= (Flows or the tool decorator) if the flow legitimately asks more",
            max_rounds=cap,
            rounds_used=used,
        )
    client_cap = (
        "the client's own cap with it (the official mcp.Client stops after input_required_max_rounds=10 by default)"
    )
    if spec.task != "never":
        way_out = (
            f"To go on, declare the {TASKS_EXTENSION} extension (FlowClient(tasks=True), or mcp.Client with "
            "mrtr.client.TasksClient) and call again: past the cap the call continues as a durable task, whose "
            f"tasks/get and tasks/update have no round cap. Or raise max_rounds= on the server and {client_cap}"
        )
    else:
        way_out = (
            f"To go on, raise max_rounds= (Flows or the decorator) and {client_cap}; or, for a tool, declare it "
            f"task='optional' (with mrtr_first=True it asks inline first), so that a client declaring the "
            f"{TASKS_EXTENSION} extension runs it as a durable task, past this cap"
        )
    return TooManyRounds(
        head + f"the most max_rounds={cap} allows, and asked again. " + way_out, max_rounds=cap, rounds_used=used
    )


def _describe(ask: Ask) -> str:
    params = getattr(ask.request, "params", None)
    message = getattr(params, "message", None)
    return f"{ask.kind} {message!r}" if isinstance(message, str) else f"a new {ask.kind} request"


def wire_asks(replay: Replay) -> dict[str, InputRequest]:
    """The parked asks as `inputRequests`; a re-asked question says why, so the client can show it.

    The reason goes in the form's message (what a person sees; it is not part of the
    question's identity) and in `_meta["mrtr/reaskReason"]` (raw wire clients see it; the
    official SDK client drops unknown `_meta` keys when it parses an input request).
    """
    asks: dict[str, InputRequest] = {}
    for key, ask in replay.parked.items():
        request = ask.request
        reason = replay.reasked.get(key)
        if reason is not None and request.params is not None:
            update: dict[str, object] = {"meta": {"mrtr/reaskReason": reason}}
            message = getattr(request.params, "message", None)
            if ask.kind == "elicit" and isinstance(message, str):
                update["message"] = f"{message}\n\n(Asked again: {reason}.)"
            request = request.model_copy(update={"params": request.params.model_copy(update=update)})
        asks[key] = request
    return asks
