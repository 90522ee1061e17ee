"""One MRTR request, read once at the edge, and the policies that run in front of the engine.

`Round.read` reads the SDK's request a single time into a small value: the method and its
target, the arguments, the `requestState` and `inputResponses`, who the client is. The
engine and every policy take that value; nothing reads the SDK's request again.

A policy (`RoundPolicy`) wraps a round the way the SDK's server middleware wraps a request:
`await policy(round, call_next)`. `Flows` lends the engine its policies in order,
outermost first — the replay guard (`mrtr.ReplayGuard`: a round runs at most once
fleet-wide), then load shedding (`mrtr.LoadShedder`: an overloaded instance hands the round
back as state only) — and `chain` composes them once, around the engine's own round body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mcp_types import ClientCapabilities, Implementation

from mrtr import _sdk as sdk

if TYPE_CHECKING:
    from mcp.server.request_state import RequestStateSecurity

    from mrtr._engine.drivers import Checkpointer
    from mrtr._engine.journal import Journal
    from mrtr._engine.spec import FlowSpec, ShedCheck, TaskStarter


@dataclass(slots=True)
class Round:
    """One request to a flow, as read at the edge (see the module docstring)."""

    spec: FlowSpec
    request: Any
    """What `ctx.request` gives the flow: the SDK's `Context` (or FastMCP's)."""
    method: str
    target: str
    """The tool or prompt name, or the resource URI: what the sealed state is bound to."""
    arguments: Mapping[str, Any]
    protocol_version: str | None
    capabilities: ClientCapabilities | None
    client_info: Implementation | None
    state: str | None
    """The unsealed `requestState` (the encoded journal), None in a call's first round."""
    answers: Mapping[str, Any]
    """`inputResponses`, already validated by the SDK."""
    journal: Journal | None = None
    """The journal `state` decodes to (set by the engine before the policies run)."""
    probe: bool = False
    """A task-enabled call asking inline first: the round ends at its first side effect."""
    shed: ShedCheck | None = None
    """Where the round may be handed back (set by a load-shedding policy)."""
    wire: Any = None
    """The SDK's plain per-request context (`ServerRequestContext`): session, request id, params."""
    state_security: Callable[[], RequestStateSecurity | None] | None = None
    """The policy that seals this round's state, when the request does not lead to it (FastMCP)."""
    gate: Callable[[], Awaitable[None]] | None = None
    """Awaited before the round's first side effect (a new step, a task started): a policy that
    checks the round concurrently with its run (the replay guard's claim) holds effects here."""
    checkpoint: Checkpointer | None = None
    """Where the round's finished steps are written as they finish (set by a policy that makes a
    call's first round survive its instance: `mrtr._host.identity`); None: they travel only in
    the answer."""

    @classmethod
    def read(
        cls,
        spec: FlowSpec,
        request: Any,
        arguments: Mapping[str, Any],
        wire: Any = None,
        state_security: Callable[[], RequestStateSecurity | None] | None = None,
    ) -> Round:
        """`request` is what `ctx.request` gives the flow; `wire` the SDK's `ServerRequestContext`
        (read from an `MCPServer` `Context` when not given)."""
        if wire is None:
            # The SDK's plain per-request context, read directly: the pydantic `Context`
            # properties cost more per access than the rest of a round's bookkeeping.
            wire = sdk.request_wire(request)
        params: Mapping[str, Any] = wire.params or {}
        session = wire.session
        client = session.client_params
        method = wire.method
        return cls(
            spec=spec,
            request=request,
            method=method,
            target=str(params.get("uri" if method == "resources/read" else "name", "")),
            arguments=arguments,
            protocol_version=wire.protocol_version,
            capabilities=session.client_capabilities,
            client_info=client.client_info if client is not None else None,
            state=params.get("requestState"),
            answers=params.get("inputResponses") or {},
            wire=wire,
            state_security=state_security,
        )


class RoundDropped(BaseException):
    """Raised at a round's gate (`Round.gate`) when the round is not this run's to serve (the
    replay guard gave it to another run, or refused it): the run stops before any side effect,
    its policy answers instead, and the run is not counted as a round (metrics)."""


CallNext = Callable[[Round], Coroutine[Any, Any, Any]]


class RoundPolicy(Protocol):
    """Something an instance does around every MRTR round (replay guard, load shedding)."""

    async def __call__(self, round: Round, call_next: CallNext) -> Any: ...


@dataclass
class Services:
    """What one `Flows` lends the engine: task creation, and the policies every round runs behind."""

    tasks: TaskStarter | None = None
    policies: tuple[RoundPolicy, ...] = ()
    """Outermost first (`mrtr._engine.round`): the replay guard, then load shedding."""
    handler: CallNext | None = field(default=None, repr=False)
    """The engine's round body behind `policies`, composed on first use."""


def chain(policies: Sequence[RoundPolicy], body: CallNext) -> CallNext:
    """`body` behind `policies`, the first outermost; composed once, not per round."""
    handler = body
    for policy in reversed(policies):
        handler = _bind(policy, handler)
    return handler


def _bind(policy: RoundPolicy, call_next: CallNext) -> CallNext:
    async def handle(round: Round) -> Any:
        return await policy(round, call_next)

    return handle


__all__ = ["CallNext", "Round", "RoundDropped", "RoundPolicy", "Services", "chain"]
