"""Replay testing: does new flow code still replay the journals the old code recorded?

A rolling upgrade runs old and new code side by side, and flows started by the old code
finish on the new. Before deploying, replay journals recorded in production (a task
record's `journal`, or a `requestState` opened with your key) against the new code:

    from mrtr.testing import check_replay, journal_from_state

    report = await check_replay(flows, "deploy", journal_from_state(token, security), {"service": "api"})
    assert report.ok, report.explain()

`run_rounds` drives a flow round by round in-process, as the official client would, answering
its asks from a mapping or a callable, and reports side effects that ran more than once: code
outside `ctx.step` runs again every round.

    effects = Effects()
    send = effects.track(send_email)   # call `send` in the flow instead of `send_email`
    report = await run_rounds(flows, "approve", {"amount": 120}, answers={"Approve?": {"ok": True}}, effects=effects)
    assert report.ok, report.explain()

`replay_export` replays a task exported from production (`mrtr tasks export ID > task.json`)
against the current code, and raises `ReplayDiverged` (an AssertionError) naming the first
journal entry the code parts from (see `mrtr._replay_export`):

    await replay_export(flows, "tests/fixtures/deploy-task.json")

The replay runs no step and asks nothing: it reads the journal as far as it goes and
stops where new work would begin. Divergence is what would go wrong in production: a
step the journal holds that the new code never reaches (its work would be redone or
lost), new steps run while recorded ones are still ahead, or an outright error
(`NondeterminismError`, `FlowDefinitionError`). Questions asked differently are only
reported (`reasked`): a changed question is simply asked again.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mcp import Client
from mcp.server.request_state import RequestStateSecurity
from mcp_types import (
    CallToolResult,
    ClientCapabilities,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitationCapability,
    ElicitResult,
    FormElicitationCapability,
    InputRequest,
    InputRequiredResult,
    InputResponse,
    ListRootsResult,
    Root,
    RootsCapability,
    SamplingCapability,
    TextContent,
    UrlElicitationCapability,
)
from pydantic import BaseModel

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr._engine.run import RunOptions, execute
from mrtr._flows import Flows
from mrtr._replay_export import Divergence, ExportReplay, ReplayDiverged, replay_export
from mrtr._wire import JSONObject

_EVERYTHING = ClientCapabilities(
    elicitation=ElicitationCapability(form=FormElicitationCapability(), url=UrlElicitationCapability()),
    sampling=SamplingCapability(),
    roots=RootsCapability(),
)


@dataclass
class ReplayReport:
    """What replaying one recorded journal against the current code found."""

    flow: str
    divergence: list[str] = field(default_factory=list)
    would_run: list[str] = field(default_factory=list)
    """Steps the new code would run next (new work: fine once the journal is used up)."""
    would_ask: list[str] = field(default_factory=list)
    """Wire keys the new code would ask next."""
    reasked: list[str] = field(default_factory=list)
    """Recorded answers whose question the new code no longer asks (they would be asked again)."""
    finished: bool = False
    """The flow would complete from the journal alone."""

    @property
    def ok(self) -> bool:
        return not self.divergence

    def explain(self) -> str:
        if self.ok:
            return f"flow {self.flow!r} replays its journal"
        return f"flow {self.flow!r} diverges from its journal: " + "; ".join(self.divergence)


def journal_from_state(token: str, security: RequestStateSecurity) -> Journal:
    """Open a sealed `requestState` with your key ring (for debugging and replay tests only)."""
    claims = json.loads(security.codec.unseal(token))
    return journal_codec.decode(claims["s"])


async def check_replay(
    flows: Flows,
    name: str,
    journal: Journal | str,
    arguments: Mapping[str, Any] | None = None,
) -> ReplayReport:
    """Replay `journal` (a `Journal`, or its encoded form as a task record stores it) against flow `name`."""
    spec = flows.specs.get(name)
    if spec is None:
        raise KeyError(f"no flow {name!r} is registered on these Flows (known: {sorted(flows.specs)})")
    recorded = journal_codec.decode(journal) if isinstance(journal, str) else journal
    # Work on a copy: the replay consumes and may prune it.
    copy = journal_codec.decode(journal_codec.encode(recorded))
    outcome = await execute(spec, copy, {}, _EVERYTHING, dict(arguments or {}), RunOptions(dry_run=True))
    replay = outcome.replay
    report = ReplayReport(flow=name, would_run=outcome.would_run, would_ask=list(replay.parked))
    report.reasked = [key for key in recorded.answers if key not in copy.answers]
    if outcome.error is not None:
        report.divergence.append(f"{type(outcome.error).__name__}: {outcome.error}")
    unreached_steps = [entry for entry in replay.unconsumed() if entry.startswith("step ")]
    if unreached_steps:
        where = f" (it would run {', '.join(map(repr, outcome.would_run))} instead)" if outcome.would_run else ""
        report.divergence.append(f"recorded {', '.join(unreached_steps)} never reached{where}")
    report.finished = not outcome.parked and outcome.error is None
    return report


F = TypeVar("F", bound=Callable[..., Any])

Answer = Any
"""What an ask is answered with: an `ElicitResult` / `CreateMessageResult` / `ListRootsResult`; or, for
a form, its content as a dict or a pydantic model (accepted), `"accept"` (its defaults), `"decline"` or
`"cancel"`; `"accept"` for a URL elicitation; a string for sampling (the completion's text); a list of
URIs for roots."""
Answers = Mapping[str, Answer] | Callable[[str, InputRequest], Answer]
"""How `run_rounds` answers asks: a mapping by wire key, message fragment or method, or a callable
`(wire_key, request) -> Answer`."""


class Effects:
    """Counts side effects per round, for `run_rounds`.

    Wrap an effect function with `track` (each call is counted under its name and
    arguments, so sending two different emails is two effects, and sending the same one in
    two rounds is one effect run twice), or call `record(name)` where the effect happens.
    """

    def __init__(self) -> None:
        self.round = 0
        """The round now running (set by `run_rounds`; 0 outside it)."""
        self.runs: list[tuple[str, int]] = []
        """(effect, round) for every run, in order."""

    def record(self, name: str) -> None:
        self.runs.append((name, self.round))

    def track(self, fn: F, *, name: str | None = None) -> F:
        """`fn`, counted on every call (sync or async alike, signature and annotations kept)."""
        label = name or getattr(fn, "__name__", repr(fn))

        def describe(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
            shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            text = f"{label}({', '.join(shown)})"
            return text if len(text) <= 120 else text[:117] + "..."

        if inspect.iscoroutinefunction(fn):

            async def tracked_async(*args: Any, **kwargs: Any) -> Any:
                self.record(describe(args, kwargs))
                return await fn(*args, **kwargs)

            return functools.wraps(fn)(tracked_async)  # type: ignore[return-value]

        def tracked(*args: Any, **kwargs: Any) -> Any:
            self.record(describe(args, kwargs))
            return fn(*args, **kwargs)

        return functools.wraps(fn)(tracked)  # type: ignore[return-value]


EffectSource = Effects | Mapping[str, int] | Callable[[], Mapping[str, int]]
"""An `Effects`; or counts the flow updates (a `collections.Counter`), or a callable returning them
(`lambda: {"emails": len(outbox)}`): what a round adds to a count is that many runs in that round."""


@dataclass
class RoundsReport:
    """What `run_rounds` saw: the call's result, its rounds, and every side effect by round."""

    flow: str
    result: CallToolResult
    rounds: int
    """Requests the call took: the flow's body ran this many times."""
    effects: dict[str, list[int]] = field(default_factory=dict)
    """Every effect seen -> the round of each of its runs (a round repeats if it ran twice there)."""

    @property
    def repeated(self) -> dict[str, list[int]]:
        """The effects that ran more than once, with the rounds they ran in."""
        return {name: rounds for name, rounds in self.effects.items() if len(rounds) > 1}

    @property
    def ok(self) -> bool:
        return not self.repeated

    def explain(self) -> str:
        if self.ok:
            return f"flow {self.flow!r}: {self.rounds} round(s), no side effect ran more than once"
        lines = [f"flow {self.flow!r}: {self.rounds} round(s); side effects that ran more than once:"]
        for name, rounds in self.repeated.items():
            lines.append(f"  {name}: {len(rounds)} times, in rounds {rounds}")
        lines.append("  (code outside ctx.step runs again every round: move each effect into a step)")
        return "\n".join(lines)


class _Counts:
    """Reads an `EffectSource` round by round."""

    def __init__(self, source: EffectSource | None) -> None:
        self.source = source
        self.seen: dict[str, list[int]] = {}
        self._before: Counter[str] = Counter()
        self._recorded = 0

    def _read(self) -> Counter[str]:
        source = self.source
        counts = source() if callable(source) and not isinstance(source, Effects) else source
        return Counter(dict(counts)) if isinstance(counts, Mapping) else Counter()

    def start(self, round: int) -> None:
        if isinstance(self.source, Effects):
            self.source.round = round
        else:
            self._before = self._read()

    def end(self, round: int) -> None:
        if isinstance(self.source, Effects):
            runs = self.source.runs
            for name, ran_in in runs[self._recorded :]:
                self.seen.setdefault(name, []).append(ran_in)
            self._recorded = len(runs)
            self.source.round = 0
        elif self.source is not None:
            added = self._read()
            added.subtract(self._before)
            for name, count in added.items():
                self.seen.setdefault(name, []).extend([round] * max(count, 0))


_ANSWERED_BY_HAND = "mrtr.testing.run_rounds answers every ask itself"


# The callbacks only declare the capabilities: `allow_input_required=True` hands every ask back.
async def _no_elicit(context: Any, params: Any) -> ElicitResult:
    raise RuntimeError(_ANSWERED_BY_HAND)


async def _no_sample(context: Any, params: Any) -> CreateMessageResult:
    raise RuntimeError(_ANSWERED_BY_HAND)


async def _no_roots(context: Any) -> ListRootsResult:
    raise RuntimeError(_ANSWERED_BY_HAND)


async def run_rounds(
    flows: Flows,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    answers: Answers | None = None,
    effects: EffectSource | None = None,
    max_rounds: int = 100,
) -> RoundsReport:
    """Call tool `name` in-process with the official client, one round at a time, until it ends.

    Each round's asks are answered from `answers`: a mapping looked up by the ask's wire key,
    then (for a form or URL elicitation) by a fragment of its message (one fragment must
    match), then by the ask's method (`"sampling/createMessage"`, `"roots/list"`); or a
    callable `(wire_key, request) -> answer` (see `Answer`). An ask with no answer raises
    `LookupError` naming it, an answer the flow does not accept (asked again) `ValueError`.
    A protocol error from the server (`MCPError`) propagates.

    `effects` (see `EffectSource`) is read around every round; the report lists each effect
    with the rounds it ran in, and `report.repeated` those that ran more than once.
    """
    if name not in flows.specs:
        raise KeyError(f"no flow {name!r} is registered on these Flows (known: {sorted(flows.specs)})")
    counts = _Counts(effects)
    client = Client(
        flows.server,
        elicitation_callback=_no_elicit,
        sampling_callback=_no_sample,
        list_roots_callback=_no_roots,
    )
    # Raised outside the client's task group, so a failure is itself, not an exception group.
    failure: Exception | None = None
    report: RoundsReport | None = None
    async with client:
        try:
            report = await _drive(client, name, dict(arguments or {}), answers, counts, max_rounds)
        except Exception as exc:
            failure = exc
    if failure is not None:
        raise failure
    assert report is not None
    return report


async def _drive(
    client: Client, name: str, arguments: JSONObject, answers: Answers | None, counts: _Counts, max_rounds: int
) -> RoundsReport:
    state: str | None = None
    responses: dict[str, InputResponse] | None = None
    for round in range(1, max_rounds + 1):
        counts.start(round)
        try:
            result = await client.session.call_tool(
                name, arguments, input_responses=responses, request_state=state, allow_input_required=True
            )
        finally:
            counts.end(round)
        if isinstance(result, CallToolResult):
            return RoundsReport(flow=name, result=result, rounds=round, effects=counts.seen)
        if not isinstance(result, InputRequiredResult):
            raise TypeError(f"tool {name!r} answered {type(result).__name__}, not a CallToolResult")
        asked = result.input_requests or {}
        for key in asked.keys() & (responses or {}).keys():
            message = getattr(asked[key].params, "message", None)
            raise ValueError(f"the flow asked {key!r} again: it did not accept the answer given ({message!r})")
        state = result.request_state
        responses = {key: _answer(key, request, answers) for key, request in asked.items()}
    raise RuntimeError(f"flow {name!r} still asked for input after {max_rounds} rounds")


def _answer(key: str, request: InputRequest, answers: Answers | None) -> InputResponse:
    method = request.method
    message = getattr(request.params, "message", None)
    answer = answers(key, request) if callable(answers) else _look_up(key, method, message, answers or {})
    if isinstance(answer, ElicitResult | CreateMessageResult | CreateMessageResultWithTools | ListRootsResult):
        return answer
    if method == "elicitation/create":
        if answer == "accept":  # a URL's consent, or a form's defaults
            url = getattr(request.params, "mode", None) == "url"
            return ElicitResult(action="accept", content=None if url else {})
        if answer in ("decline", "cancel"):
            return ElicitResult(action=answer)
        if isinstance(answer, BaseModel):
            return ElicitResult(action="accept", content=answer.model_dump(mode="json"))
        if isinstance(answer, Mapping):
            return ElicitResult(action="accept", content=dict(answer))
    elif method == "sampling/createMessage" and isinstance(answer, str):
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=answer), model="test")
    elif method == "roots/list" and isinstance(answer, list | tuple):
        return ListRootsResult(roots=[Root(uri=uri, name=str(uri).rsplit("/", 1)[-1]) for uri in answer])
    raise TypeError(f"the answer to {key!r} ({method}) cannot be {answer!r}; see mrtr.testing.Answer")


def _look_up(key: str, method: str, message: str | None, answers: Mapping[str, Answer]) -> Answer:
    if key in answers:
        return answers[key]
    if message is not None:
        matches = [fragment for fragment in answers if fragment and fragment in message]
        if len(matches) > 1:
            raise LookupError(f"ask {key!r} ({message!r}) matches several answers: {matches}")
        if matches:
            return answers[matches[0]]
    if method in answers:
        return answers[method]
    what = f"{method} {message!r}" if message is not None else method
    raise LookupError(f"no answer for ask {key!r}: {what} (answer by wire key, message fragment or method)")


__all__ = [
    "Answer",
    "Answers",
    "Divergence",
    "EffectSource",
    "Effects",
    "ExportReplay",
    "ReplayDiverged",
    "ReplayReport",
    "RoundsReport",
    "check_replay",
    "journal_from_state",
    "replay_export",
    "run_rounds",
]


def __dir__() -> list[str]:
    """What testing needs (`__all__`), not this module's own imports and helpers."""
    return sorted(__all__)
