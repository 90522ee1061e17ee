"""Drivers: how a `FlowContext` is served in each protocol era.

`JournalDriver` (2026-07-28) answers from the journal, parks unanswered asks, journals
steps, and — while a task-enabled call is still deciding — hands over to a durable task
at the first side effect. `LiveDriver` (2025-11-25 and earlier) sends asks as ordinary
server-to-client requests and just runs steps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar, cast

from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateMessageResultWithTools,
    ElicitResult,
    ListRootsResult,
)
from pydantic import ValidationError

from mrtr._engine.asks import (
    MAX_REJECTED,
    AnswerRejected,
    Ask,
    BadAnswer,
    Capability,
    malformed,
    required_capability,
    supports,
)
from mrtr._engine.branches import asking_branch, asking_from, current_branch, outside_branch
from mrtr._engine.progress import ProgressSink
from mrtr._engine.replay import Replay, check_step_name, step_key
from mrtr._engine.spec import ShedCheck
from mrtr._engine.steps import StepInfo, arg_digest, call_step, to_journal
from mrtr._engine.waits import CALLBACK_PREFIX, EVENT_PREFIX, TIMER, WaitSource, WaitState, needs_task, taken_events
from mrtr._telemetry import tracing
from mrtr._wire import Wait

_State = TypeVar("_State", bound=Mapping[str, object])

logger = logging.getLogger("mrtr.drivers")

_LEGACY_REASK_LIMIT = MAX_REJECTED


class BecomeTask(BaseException):
    """Raised inside a probing flow at its first side effect: from here on it runs as a task.

    A BaseException so that a flow's `except Exception` cannot swallow the handover.
    """


def missing_capability(capability: Capability) -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"This call needs the client capability {capability!r}, which the request did not declare",
        data={"requiredCapabilities": required_capability(capability)},
    )


class Checkpointer(Protocol):
    """A durable task's journal writes (`mrtr.tasks._checkpoints.Checkpoints`)."""

    def after_step(self) -> None: ...

    async def durable(self) -> None: ...

    def step_started(self, key: str, idempotency_key: str) -> None:
        """A step's side effect is about to begin (not a replay): noted for people, stored by the
        `durable()` that follows."""
        ...

    def step_ran(self, key: str, seconds: float, error: str | None, idempotency_key: str = "") -> None:
        """A step really ran (not a replay): how long, and what it raised if it did (for people)."""
        ...


class JournalDriver:
    """2026-07-28: asks and steps are served from, and recorded into, the journal.

    Args:
        probe: The call may become a task; stop (raise `BecomeTask`) at the first step or
            `continue_as_task()`, so every side effect happens inside the durable task.
        checkpoint: A durable task's journal writes (`mrtr.tasks._checkpoints.Checkpoints`): told
            of each finished step, and awaited before each new step's side effect, so a
            worker that dies after a step never repeats it.
        dry_run: Never run a new step: hold the branch there instead (replay testing).
        shed: Where this round may hand its progress back to the client when the instance is
            overloaded (ephemeral rounds only).
        step_limit: Run at most this many new steps; further new steps are held, as in a dry
            run (`would_run`), so the run settles after them (the Temporal engine runs one step
            per activity this way).
        waits: A durable task's clock, events and callback URLs (`ctx.sleep`,
            `ctx.wait_for_event`, `ctx.callback_url`); None outside a task, where they are refused.
        gate: Awaited before each new step's side effect (`Round.gate`: the replay guard's
            claim, checked while the round's replayed code runs).
        progress: A durable task's status message (`ctx.report_progress`); None inline, where
            reports go to the request as progress notifications.
    """

    def __init__(
        self,
        replay: Replay,
        *,
        probe: bool = False,
        checkpoint: Checkpointer | None = None,
        dry_run: bool = False,
        shed: ShedCheck | None = None,
        step_limit: int | None = None,
        waits: WaitSource | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        progress: ProgressSink | None = None,
    ) -> None:
        self._waits = waits
        self._gate = gate
        self.progress = progress
        self._shed = shed
        self._step_limit = step_limit
        self.steps_started = 0
        self.steps_replayed = 0
        """Steps this run returned from the journal (`steps_started`: steps it ran)."""
        self._replay = replay
        self._probe = probe
        self._checkpoint = checkpoint
        self._dry_run = dry_run
        self.would_run: list[str] = []
        self.flow_id = replay.journal.flow_id

    def supports(self, capability: Capability) -> bool:
        return supports(self._replay.capabilities, capability)

    def replaying(self) -> bool:
        """Whether the calling branch is still before the journal's frontier (what it does, it did before).

        Inside a step's function (no branch: FastMCP's `Progress` in a task that is one step as a
        whole, say) the run is past the frontier by definition: a step's function runs only when new.
        """
        replay = self._replay
        if current_branch.get() is None and asking_branch.get() is None:
            return False
        return not replay.at_frontier(replay.branch())

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        key, answer = self.recall(ask)
        if answer is not None:
            return key, answer
        return key, await self.wait_answer(key, ask)

    def recall(self, ask: Ask) -> tuple[str, Any]:
        """`ask`'s first half, with no coroutine: its wire key, and its answer (None: not answered yet).

        Most asks of a round are replays of answered ones; `FlowContext.elicit` calls this
        directly and awaits `wait_answer` only for the one that waits, which saves a
        coroutine per replayed answer.
        """
        replay = self._replay
        key = replay.key_for(replay.branch(), ask)
        return key, replay.answer_for(key, ask)

    async def wait_answer(self, key: str, ask: Ask) -> Any:
        """`ask`'s second half: park the branch on an unanswered ask (its capability checked first)."""
        replay = self._replay
        if not supports(replay.capabilities, ask.capability):
            raise missing_capability(ask.capability)
        return await replay.park(key, ask)

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        replay = self._replay
        branch = replay.branch()
        check_step_name(replay.flow, name)
        if self._probe:
            raise BecomeTask
        key = step_key(branch, name)
        digest = arg_digest(args, kwargs)
        found, value = replay.recorded_step(key, digest)
        if found:
            self.steps_replayed += 1
            logger.debug("flow %s: step %r replayed from the journal", replay.flow, key)
            return value
        if self._dry_run or (self._step_limit is not None and self.steps_started >= self._step_limit):
            self.would_run.append(key)
            await replay.park(key, None)
        self.shed_point()  # an overloaded instance may end the round here, before new work
        if self._gate is not None:
            await self._gate()  # the round is this run's to serve (raises if it is not)
        self.steps_started += 1
        replay.step_started()
        try:
            with outside_branch(), tracing.step_span(key, f"{self.flow_id}:{key}"):
                idempotency_key = f"{self.flow_id}:{key}"
                if self._checkpoint is not None:
                    self._checkpoint.step_started(key, idempotency_key)
                    await self._checkpoint.durable()  # every finished step, and this one's start, is stored first
                began = time.perf_counter()
                try:
                    result = await call_step(StepInfo(key, self.flow_id, idempotency_key), fn, args, kwargs)
                    value = to_journal(key, result, fn)
                except Exception as exc:
                    if self._checkpoint is not None:
                        error = f"{type(exc).__name__}: {exc}"
                        self._checkpoint.step_ran(key, time.perf_counter() - began, error, idempotency_key)
                    raise
                replay.record_step(key, digest, value)
                if self._checkpoint is not None:
                    self._checkpoint.step_ran(key, time.perf_counter() - began, None, idempotency_key)
                    self._checkpoint.after_step()
        finally:
            replay.step_ended()
        logger.debug("flow %s: step %r ran and was journaled", replay.flow, key)
        return value

    async def inline_step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """A step whose function may ask (see `FlowContext.inline_step`).

        Until it returns, each round runs it again (its asks answered from the journal, as the
        flow's own are); once it returns, its value is journaled and replayed as a step's.
        It runs in a task and branch of its own, made on every round whether it runs or is
        replayed, so its asks and steps never take the numbers of the flow's own; its function
        runs outside the flow's branches, as a step's does (tasks it starts, an HTTP client's,
        are not the flow's), and asks from that branch.
        """
        replay = self._replay
        branch = replay.branch()
        check_step_name(replay.flow, name)
        if self._probe:
            raise BecomeTask
        key = step_key(branch, name)
        digest = arg_digest(args, kwargs)

        async def run() -> Any:
            found, value = replay.recorded_step(key, digest)
            if found:
                self.steps_replayed += 1
                return value
            if self._dry_run:
                self.would_run.append(key)
                await replay.park(key, None)
            self.shed_point()
            if self._gate is not None:
                await self._gate()  # the round is this run's to serve (raises if it is not)
            if self._checkpoint is not None:
                with outside_branch():
                    await self._checkpoint.durable()  # every finished step is stored before this one runs
            here = current_branch.get()
            assert here is not None  # this task's own branch, made by the flow's task factory
            with asking_from(here):
                result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
            value = to_journal(key, result, fn)
            replay.record_step(key, digest, value)
            if self._checkpoint is not None:
                self._checkpoint.after_step()
            return value

        return await asyncio.get_running_loop().create_task(run())

    def patched(self, patch_id: str) -> bool:
        replay = self._replay
        return replay.patched(replay.branch(), patch_id)

    async def wait(self, kind: Literal["timer", "event"], name: str | None, limit: float | None) -> WaitState:
        """A durable timer (`kind="timer"`, `limit` its delay) or event wait (`limit` its timeout).

        Returns the wait's journaled outcome: `{"due", "done": 1}` plus `"id"`/`"data"` for a
        delivered event or `"timeout": 1`; parks the branch until then (see `mrtr._engine.waits`).
        """
        replay = self._replay
        branch = replay.branch()
        if self._probe:
            raise BecomeTask
        waits = self._waits
        if waits is None and not self._dry_run:
            raise needs_task(replay.flow, "sleep" if kind == "timer" else "wait_for_event")
        key = step_key(branch, TIMER if kind == "timer" else f"{EVENT_PREFIX}{name}")
        found, recorded = replay.recorded_step(key, "")
        state = cast(WaitState, recorded)  # what this wait journaled, when `found` and a dict
        if found and isinstance(recorded, dict) and state.get("done"):
            return state
        if waits is None:  # a dry run reached a wait that has not resolved: hold it there
            self.would_run.append(key)
            await replay.park(key, None)
            raise AssertionError("unreachable: a parked branch never resumes")
        if not found or not isinstance(recorded, dict):
            state = {"due": None if limit is None else round(waits.now() + limit, 3)}
            self._journal(key, state)
        due = state["due"]

        def resolve() -> WaitState | None:
            if kind == "event":
                assert name is not None
                event = waits.take_event(name, taken_events(replay.journal.steps))
                if event is not None:
                    arrived: WaitState = {"due": due, "done": 1, "id": event[0], "data": event[1]}
                    return self._journal(key, arrived)
            if due is not None and waits.now() >= due:
                fired: WaitState = {"due": due, "done": 1, "timeout": 1} if kind == "event" else {"due": due, "done": 1}
                return self._journal(key, fired)
            return None

        info: Wait = {"kind": kind, "name": name, "until": due}
        if kind == "event" and _has_callback(replay, f"{CALLBACK_PREFIX}{name}"):
            info["via"] = "callback"  # what an operator filters on: this event comes from a callback URL
        outcome: WaitState = await replay.park_wait(key, info, resolve)
        return outcome

    async def callback_url(self, name: str, ttl: float) -> str:
        """A URL that delivers event `name` to this task: minted once, journaled, replayed."""
        replay = self._replay
        branch = replay.branch()
        if self._probe:
            raise BecomeTask
        if self._waits is None and not self._dry_run:
            raise needs_task(replay.flow, "callback_url")
        key = step_key(branch, f"{CALLBACK_PREFIX}{name}")
        found, state = replay.recorded_step(key, "")
        if found and isinstance(state, dict) and isinstance(state.get("url"), str):
            return str(state["url"])
        if self._waits is None:
            self.would_run.append(key)
            await replay.park(key, None)
            raise AssertionError("unreachable: a parked branch never resumes")
        url = self._waits.callback_url(name, self._waits.now() + ttl)
        self._journal(key, {"url": url})
        return url

    def _journal(self, key: str, state: _State) -> _State:
        """Journal a wait's state; a task writes it with its next checkpoint (before any new step)."""
        self._replay.record_step(key, "", state)
        if self._checkpoint is not None:
            self._checkpoint.after_step()
        return state

    async def continue_as_task(self) -> None:
        self._replay.branch()
        if self._probe:
            raise BecomeTask

    def shed_point(self) -> None:
        """Raise `mrtr._shedding.ShedRound` if this instance is overloaded (see `mrtr._shedding`)."""
        self._replay.branch()
        if self._shed is not None:
            self._shed.check(self._replay)


class LiveDriver:
    """2025-11-25 and earlier: asks are server-to-client requests; steps just run."""

    def __init__(self, wire: Any, flow: str = "flow") -> None:
        self._wire = wire  # the SDK's ServerRequestContext: its session, and the request's id
        self._flow = flow
        self.flow_id = os.urandom(12).hex()
        self._step_counts: dict[str, int] = {}
        self.progress: ProgressSink | None = None  # reports go to the request, as notifications

    def supports(self, capability: Capability) -> bool:
        return supports(self._wire.session.client_capabilities, capability)

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        key = ask.explicit_key or ask.derived_key(1)
        if not self.supports(ask.capability):
            raise missing_capability(ask.capability)
        # A sampling answer may hold a list of blocks (2025-11-25): the array-capable model takes both.
        result_type = {"sample": CreateMessageResultWithTools, "roots": ListRootsResult}.get(ask.kind, ElicitResult)
        metadata = ServerMessageMetadata(related_request_id=self._wire.request_id)
        version = self._wire.session.protocol_version
        reason = "the answer is not a valid elicitation result"
        for _ in range(_LEGACY_REASK_LIMIT):
            logger.debug("flow %s: asking %r over the legacy session", self._flow, key)
            try:
                result = await self._wire.session.send_request(ask.request, result_type, metadata=metadata)
            except ValidationError as exc:  # the SDK checked it against the session's version first
                if ask.kind == "elicit":
                    continue
                raise malformed(ask.kind, exc, None, key, version) from None
            try:
                return key, ask.accept(
                    result.model_dump(mode="json", by_alias=True, exclude_none=True), key=key, version=version
                )
            except BadAnswer as exc:
                reason = str(exc)
                continue
        raise AnswerRejected(key, reason, _LEGACY_REASK_LIMIT)  # as on the modern wire: names the field

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        check_step_name(self._flow, name)
        n = self._step_counts[name] = self._step_counts.get(name, 0) + 1
        key = name if n == 1 else f"{name}#{n}"
        result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
        logger.debug("flow %s: step %r ran (legacy session)", self._flow, key)
        return to_journal(key, result, fn)

    async def inline_step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """A live run asks in place: the function simply runs, in the flow."""
        check_step_name(self._flow, name)
        n = self._step_counts[name] = self._step_counts.get(name, 0) + 1
        key = name if n == 1 else f"{name}#{n}"
        result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
        return to_journal(key, result, fn)

    def patched(self, patch_id: str) -> bool:
        """A live run is always new code running for the first time."""
        return True

    def replaying(self) -> bool:
        """A live run never replays."""
        return False

    async def wait(self, kind: Literal["timer", "event"], name: str | None, limit: float | None) -> WaitState:
        raise needs_task(self._flow, "sleep" if kind == "timer" else "wait_for_event")

    async def callback_url(self, name: str, ttl: float) -> str:
        raise needs_task(self._flow, "callback_url")

    async def continue_as_task(self) -> None:
        """Legacy clients cannot take tasks: the flow simply carries on in this call."""


def _has_callback(replay: Replay, name: str) -> bool:
    """Whether the flow minted a callback URL for event `name` (its journaled `@callback.` entry)."""
    return any(key.rpartition("/")[2].partition("#")[0] == name for key in replay.journal.steps)


__all__ = [
    "BecomeTask",
    "Checkpointer",
    "JournalDriver",
    "LiveDriver",
    "missing_capability",
]
