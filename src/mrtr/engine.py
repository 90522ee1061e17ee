"""Run one request of a flow: pick the era, replay against the journal, shape the result.

request -> `run_flow` -> (`JournalDriver` + `Replay`) -> flow function -> result, or an
`InputRequiredResult` whose `requestState` is the encoded journal (the SDK's
`RequestStateBoundary` seals it on the way out and verifies it on the way back in).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateMessageResult,
    ElicitResult,
    InputRequiredResult,
    ListRootsResult,
)
from mcp_types.version import is_version_at_least

from mrtr import journal as journal_codec
from mrtr.asks import Ask, BadAnswer, Capability, required_capability, supports
from mrtr.context import FlowContext, StepInfo, arg_digest, call_step, to_journal
from mrtr.errors import FlowError, FlowExpired, StateTooLarge, TooManyRounds
from mrtr.journal import Journal, JournalFormatError
from mrtr.replay import Replay

_STATELESS_VERSION = "2026-07-28"
_LEGACY_REASK_LIMIT = 3


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


async def run_flow(spec: FlowSpec, request: Context[Any, Any], arguments: Mapping[str, Any]) -> Any:
    """Run one request of `spec`; returns the flow's value or an `InputRequiredResult`."""
    version = request.protocol_version
    if version is None or not is_version_at_least(version, _STATELESS_VERSION):
        return await _call(spec, FlowContext(LiveDriver(request), request), arguments)
    try:
        return await _run_round(spec, request, arguments)
    except FlowError as exc:
        code = INVALID_PARAMS if isinstance(exc, FlowExpired | TooManyRounds) else INTERNAL_ERROR
        raise MCPError(code=code, message=str(exc), data={"reason": exc.reason, "flow": spec.name}) from exc


async def _call(spec: FlowSpec, ctx: FlowContext, arguments: Mapping[str, Any]) -> Any:
    kwargs = dict(arguments)
    if spec.ctx_param is not None:
        kwargs[spec.ctx_param] = ctx
    return await spec.fn(**kwargs)


async def _run_round(spec: FlowSpec, request: Context[Any, Any], arguments: Mapping[str, Any]) -> Any:
    journal = _load_journal(spec, request.request_state)
    answers = {
        key: value.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key, value in (request.input_responses or {}).items()
    }
    replay = Replay(journal, answers, request.client_capabilities)
    flow = asyncio.get_running_loop().create_task(_call(spec, FlowContext(JournalDriver(replay), request), arguments))
    replay.flow_task = flow
    try:
        await asyncio.wait({flow})
    finally:
        if not flow.done():  # this request itself was cancelled
            flow.cancel()
            await asyncio.wait({flow})
        replay.close()
    if flow.cancelled() and replay.settled:
        return _input_required(spec, request, replay)
    return flow.result()  # the flow's value, or the error it ended with


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
    journal.pending = {key: ask.digest for key, ask in replay.parked.items()}
    state = journal_codec.encode(journal)
    sealed = sealed_size(state, request, spec.audience)
    if sealed > spec.limits.max_state_bytes:
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


# -- drivers -------------------------------------------------------------------------------


def _missing_capability(capability: Capability) -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"This call needs the client capability {capability!r}, which the request did not declare",
        data={"requiredCapabilities": required_capability(capability)},
    )


class JournalDriver:
    """2026-07-28: asks and steps are served from, and recorded into, the journal."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay
        self.flow_id = replay.journal.flow_id

    def supports(self, capability: Capability) -> bool:
        return supports(self._replay.capabilities, capability)

    async def ask(self, ask: Ask) -> Any:
        replay = self._replay
        key = replay.key_for(ask)
        answer = replay.answer_for(key, ask)
        if answer is not None:
            return answer
        if not supports(replay.capabilities, ask.capability):
            raise _missing_capability(ask.capability)
        return await replay.park(key, ask)

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        replay = self._replay
        key = replay.step_key(name)
        digest = arg_digest(args, kwargs)
        found, value = replay.recorded_step(key, digest)
        if found:
            return value
        replay.step_started()
        try:
            result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
        except BaseException:
            replay.step_finished(None, digest, None)
            raise
        value = to_journal(key, result)
        replay.step_finished(key, digest, value)
        return value


class LiveDriver:
    """2025-11-25 and earlier: asks are server-to-client requests; steps just run."""

    def __init__(self, request: Context[Any, Any]) -> None:
        self._request = request
        self.flow_id = os.urandom(12).hex()
        self._step_counts: dict[str, int] = {}

    def supports(self, capability: Capability) -> bool:
        return supports(self._request.client_capabilities, capability)

    async def ask(self, ask: Ask) -> Any:
        if not self.supports(ask.capability):
            raise _missing_capability(ask.capability)
        result_type = {"sample": CreateMessageResult, "roots": ListRootsResult}.get(ask.kind, ElicitResult)
        metadata = ServerMessageMetadata(related_request_id=self._request.request_context.request_id)
        for _ in range(_LEGACY_REASK_LIMIT):
            result = await self._request.session.send_request(ask.request, result_type, metadata=metadata)
            try:
                return ask.accept(result.model_dump(mode="json", by_alias=True, exclude_none=True))
            except BadAnswer:
                continue
        raise MCPError(code=INVALID_PARAMS, message=f"The client answered {_LEGACY_REASK_LIMIT} times off-schema")

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        n = self._step_counts.get(name, 0) + 1
        self._step_counts[name] = n
        key = name if n == 1 else f"{name}#{n}"
        result = await call_step(StepInfo(key, self.flow_id, f"{self.flow_id}:{key}"), fn, args, kwargs)
        return to_journal(key, result)
