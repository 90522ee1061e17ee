"""Drivers: how a `FlowContext` is served in each protocol era.

`JournalDriver` (2026-07-28) answers from the journal, parks unanswered asks, journals
steps, and — while a task-enabled call is still deciding — hands over to a durable task
at the first side effect. `LiveDriver` (2025-11-25 and earlier) sends asks as ordinary
server-to-client requests and just runs steps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
)

from mrtr._engine import tracing
from mrtr._engine.asks import Ask, BadAnswer, Capability, required_capability, supports
from mrtr._engine.branches import outside_branch
from mrtr._engine.replay import Replay, check_step_name, step_key
from mrtr._engine.spec import ShedCheck
from mrtr._engine.steps import StepInfo, arg_digest, call_step, to_journal

logger = logging.getLogger("mrtr.drivers")

_LEGACY_REASK_LIMIT = 3


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
    ) -> None:
        self._shed = shed
        self._step_limit = step_limit
        self.steps_started = 0
        self._replay = replay
        self._probe = probe
        self._checkpoint = checkpoint
        self._dry_run = dry_run
        self.would_run: list[str] = []
        self.flow_id = replay.journal.flow_id

    def supports(self, capability: Capability) -> bool:
        return supports(self._replay.capabilities, capability)

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        replay = self._replay
        key = replay.key_for(replay.branch(), ask)
        answer = replay.answer_for(key, ask)
        if answer is not None:
            return key, answer
        if not supports(replay.capabilities, ask.capability):
            raise missing_capability(ask.capability)
        return key, await replay.park(key, ask)

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        replay = self._replay
        branch = replay.branch()
        check_step_name(replay.flow, name)
        if self._probe:
            raise BecomeTask
        key = step_key(branch, name)
        digest = arg_digest(args, kwargs)
        found, value = replay.recorded_step(key, digest)
        if found:
            logger.debug("flow %s: step %r replayed from the journal", replay.flow, key)
            return value
        if self._dry_run or (self._step_limit is not None and self.steps_started >= self._step_limit):
            self.would_run.append(key)
            await replay.park(key, None)
        self.shed_point()  # an overloaded instance may end the round here, before new work
        self.steps_started += 1
        replay.step_started()
        try:
            with outside_branch(), tracing.step_span(key, f"{self.flow_id}:{key}"):
                if self._checkpoint is not None:
                    await self._checkpoint.durable()  # every finished step is stored before this one runs
                result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
                value = to_journal(key, result, fn)
                replay.record_step(key, digest, value)
                if self._checkpoint is not None:
                    self._checkpoint.after_step()
        finally:
            replay.step_ended()
        logger.debug("flow %s: step %r ran and was journaled", replay.flow, key)
        return value

    def patched(self, patch_id: str) -> bool:
        replay = self._replay
        return replay.patched(replay.branch(), patch_id)

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

    def supports(self, capability: Capability) -> bool:
        return supports(self._wire.session.client_capabilities, capability)

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        key = ask.explicit_key or ask.derived_key(1)
        if not self.supports(ask.capability):
            raise missing_capability(ask.capability)
        result_type = {"sample": CreateMessageResult, "roots": ListRootsResult}.get(ask.kind, ElicitResult)
        metadata = ServerMessageMetadata(related_request_id=self._wire.request_id)
        for _ in range(_LEGACY_REASK_LIMIT):
            logger.debug("flow %s: asking %r over the legacy session", self._flow, key)
            result = await self._wire.session.send_request(ask.request, result_type, metadata=metadata)
            try:
                return key, ask.accept(result.model_dump(mode="json", by_alias=True, exclude_none=True))
            except BadAnswer:
                continue
        raise MCPError(code=INVALID_PARAMS, message=f"The client answered {_LEGACY_REASK_LIMIT} times off-schema")

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        check_step_name(self._flow, name)
        n = self._step_counts[name] = self._step_counts.get(name, 0) + 1
        key = name if n == 1 else f"{name}#{n}"
        result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
        logger.debug("flow %s: step %r ran (legacy session)", self._flow, key)
        return to_journal(key, result, fn)

    def patched(self, patch_id: str) -> bool:
        """A live run is always new code running for the first time."""
        return True

    async def continue_as_task(self) -> None:
        """Legacy clients cannot take tasks: the flow simply carries on in this call."""


__all__ = [
    "BecomeTask",
    "Checkpointer",
    "JournalDriver",
    "LiveDriver",
    "missing_capability",
]
