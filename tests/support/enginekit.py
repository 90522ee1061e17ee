"""Drive the replay engine directly, round by round: no server, no client, no sealing.

A round here is what an MRTR request does inside the engine: decode the journal that came
back as `requestState`, run the flow once against it with the client's answers
(`mrtr._engine.run.execute`), and, if it settled on asks, close the round and encode the
journal again. Only the engine's stable surfaces are used (`FlowSpec`, `Limits`, `Journal`
and its codec, `execute`, `close_round`), so the unit tests keep working while its
internals are rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mcp_types import ClientCapabilities, CreateMessageResult, ElicitResult, ListRootsResult, Root, TextContent

from mrtr._engine import journal as codec
from mrtr._engine import run as engine
from mrtr._engine.journal import Journal
from mrtr._engine.run import Outcome, RunOptions
from mrtr._engine.spec import FlowSpec, Limits

ALL_CAPABILITIES = ClientCapabilities.model_validate(
    {"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}
)
"""A client that declares everything a flow can ask for."""


def spec_of(fn: Callable[..., Any], *, limits: Limits | None = None, name: str | None = None) -> FlowSpec:
    """A registered flow, as `Flows` would make it, whose context parameter is `ctx`."""
    return FlowSpec(name=name or fn.__name__, fn=fn, ctx_param="ctx", limits=limits or Limits(), audience="unit")


def accept(**content: Any) -> dict[str, Any]:
    """A wire `ElicitResult` accepting a form with `content`."""
    return ElicitResult(action="accept", content=content).model_dump(mode="json", by_alias=True, exclude_none=True)


def refuse(action: str) -> dict[str, Any]:
    return {"action": action}


def sampled(text: str) -> dict[str, Any]:
    result = CreateMessageResult(role="assistant", content=TextContent(type="text", text=text), model="unit-model")
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def roots(*uris: str) -> dict[str, Any]:
    return ListRootsResult(roots=[Root(uri=u) for u in uris]).model_dump(mode="json", by_alias=True, exclude_none=True)


class Rounds:
    """One flow call, driven round by round the way requests would drive it.

    `state` is the encoded journal the last round handed back (`None` before the first
    round, and after the flow ended); `asked` maps each key the last round asked to the
    wire request it would send.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        arguments: Mapping[str, Any] | None = None,
        *,
        limits: Limits | None = None,
        capabilities: ClientCapabilities | None = ALL_CAPABILITIES,
        budget: int | None = None,
    ) -> None:
        self.spec = spec_of(fn, limits=limits)
        self.arguments = dict(arguments or {})
        self.capabilities = capabilities
        self.budget = budget
        self.state: str | None = None
        self.asked: dict[str, dict[str, Any]] = {}
        self.reasked: dict[str, str] = {}
        self.outcomes: list[Outcome] = []

    @property
    def journal(self) -> Journal:
        """The journal as the client holds it now (decoded from `state`)."""
        assert self.state is not None, "no round has parked yet"
        return codec.decode(self.state)

    async def send(self, answers: Mapping[str, Any] | None = None) -> Outcome:
        """One round: the last round's state and `answers` in; the outcome of running the flow out."""
        journal = codec.decode(self.state) if self.state is not None else Journal.start()
        run = RunOptions(budget=self.budget, state_cap=self.budget)
        outcome = await engine.execute(self.spec, journal, dict(answers or {}), self.capabilities, self.arguments, run)
        self.outcomes.append(outcome)
        if outcome.parked:
            replay = outcome.replay
            engine.close_round(self.spec, replay)
            self.asked = {
                key: request.model_dump(mode="json", by_alias=True, exclude_none=True)
                for key, request in engine.wire_asks(replay).items()
            }
            self.reasked = dict(replay.reasked)
            self.state = codec.encode(replay.journal)
        else:
            self.asked, self.reasked, self.state = {}, {}, None
        return outcome

    def only_key(self) -> str:
        """The one key the last round asked."""
        assert len(self.asked) == 1, f"expected one ask, got {sorted(self.asked)}"
        return next(iter(self.asked))

    def key_asking(self, text: str) -> str:
        """The key of the ask whose message (or sampled prompt) contains `text`."""
        found = [key for key, request in self.asked.items() if text in str(request)]
        assert len(found) == 1, f"{len(found)} asks mention {text!r}: {self.asked}"
        return found[0]


def result_of(outcome: Outcome) -> Any:
    """The flow's value; fails with the flow's own exception when it raised, or if it parked."""
    assert not outcome.parked, f"the flow parked on {sorted(outcome.replay.parked)}"
    if outcome.error is not None:
        raise outcome.error
    return outcome.value
