"""Drivers: how a `FlowContext` is served in each protocol era.

`JournalDriver` (2026-07-28) answers from the journal, parks unanswered asks, journals
steps, and — while a task-enabled call is still deciding — hands over to a durable task
at the first side effect. `LiveDriver` (2025-11-25 and earlier) sends asks as ordinary
server-to-client requests and just runs steps.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
)

from mrtr.asks import Ask, BadAnswer, Capability, required_capability, supports
from mrtr.context import StepInfo, arg_digest, call_step, to_journal
from mrtr.replay import Replay, numbered
from mrtr.shedding import ShedPoint  # issue 11

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


class JournalDriver:
    """2026-07-28: asks and steps are served from, and recorded into, the journal.

    Args:
        probe: The call may become a task; stop (raise `BecomeTask`) at the first step or
            `continue_as_task()`, so every side effect happens inside the durable task.
        checkpoint: Awaited after each finished step (durable tasks persist the journal
            there, so a worker that dies after a step never repeats it).
    """

    def __init__(
        self,
        replay: Replay,
        *,
        probe: bool = False,
        checkpoint: Callable[[], Awaitable[None]] | None = None,
        shed: ShedPoint | None = None,  # issue 11: load shedding (mrtr.shedding)
    ) -> None:
        self._shed = shed  # issue 11
        self._replay = replay
        self._probe = probe
        self._checkpoint = checkpoint
        self.flow_id = replay.journal.flow_id

    def supports(self, capability: Capability) -> bool:
        return supports(self._replay.capabilities, capability)

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        replay = self._replay
        key = replay.key_for(ask)
        answer = replay.answer_for(key, ask)
        if answer is not None:
            return key, answer
        if not supports(replay.capabilities, ask.capability):
            raise missing_capability(ask.capability)
        return key, await replay.park(key, ask)

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._probe:
            raise BecomeTask
        replay = self._replay
        key = replay.step_key(name)
        digest = arg_digest(args, kwargs)
        found, value = replay.recorded_step(key, digest)
        if found:
            return value
        self.shed_point()  # issue 11: an overloaded instance ends the round before a new step
        replay.step_started()
        try:
            result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
            value = to_journal(key, result)
        except BaseException:
            replay.step_finished(None, digest, None)
            raise
        replay.step_finished(key, digest, value)
        if self._checkpoint is not None:
            await self._checkpoint()
        return value

    async def continue_as_task(self) -> None:
        if self._probe:
            raise BecomeTask

    def shed_point(self) -> None:  # issue 11: raises mrtr.shedding.ShedRound when overloaded
        if self._shed is not None:
            self._shed.check(self._replay)


class LiveDriver:
    """2025-11-25 and earlier: asks are server-to-client requests; steps just run."""

    def __init__(self, request: Context[Any, Any]) -> None:
        self._request = request
        self.flow_id = os.urandom(12).hex()
        self._step_counts: dict[str, int] = {}

    def supports(self, capability: Capability) -> bool:
        return supports(self._request.client_capabilities, capability)

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        key = ask.explicit_key or ask.derived_key(1)
        if not self.supports(ask.capability):
            raise missing_capability(ask.capability)
        result_type = {"sample": CreateMessageResult, "roots": ListRootsResult}.get(ask.kind, ElicitResult)
        metadata = ServerMessageMetadata(related_request_id=self._request.request_context.request_id)
        for _ in range(_LEGACY_REASK_LIMIT):
            result = await self._request.session.send_request(ask.request, result_type, metadata=metadata)
            try:
                return key, ask.accept(result.model_dump(mode="json", by_alias=True, exclude_none=True))
            except BadAnswer:
                continue
        raise MCPError(code=INVALID_PARAMS, message=f"The client answered {_LEGACY_REASK_LIMIT} times off-schema")

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = numbered(self._step_counts, name)
        result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
        return to_journal(key, result)

    async def continue_as_task(self) -> None:
        """Legacy clients cannot take tasks: the flow simply carries on in this call."""
