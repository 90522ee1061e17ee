"""Load shedding: an overloaded instance hands a flow's progress back to the client.

An MRTR round can end with an `InputRequiredResult` that carries `requestState` and no
`inputRequests` (SEP-2322, seeds 001/004): the client retries at once, and any instance
carries on from the journal. mrtr uses that to shed load:

- The signal: rounds in flight on this instance (`max_inflight_rounds`), the event loop's
  lag (`max_loop_lag`, seconds a 50 ms timer fires late, sampled while rounds arrive), and/or
  your own `shed_when()` callable. In-flight rounds is the default recommendation: it is
  exact, costs two integer operations per round and reacts within the round; loop lag
  catches CPU-bound overload that a round count misses but lags behind it by a sample.
- The shed points: before a flow runs a new (unjournaled) step, and `await
  ctx.checkpoint()`. An overloaded instance ends the round there with a state-only result;
  the journal holds every finished step and every answer, so nothing is redone.
- Progress first: a round is shed only after it made progress (a new step finished or a new
  answer journaled) and while no other step of it is running, so each shed moves the flow
  forward (no livelock, even with a replay guard) and no running step's result is lost.
- Shed rounds do not count toward `max_rounds` (the journal's round counter is unchanged).
- Legacy clients (<= 2025-11-25) and durable tasks are never shed: the former cannot
  resend a round, the latter already survive their worker.
- Only to clients that resend: some hosts show a state-only result as an error and never
  resend it (claude.ai's connector, `clientInfo` `Anthropic/ClaudeAI`:
  https://github.com/anthropics/claude-ai-mcp/issues/1027), so a round is shed only when the
  request declares a client known to resend it at once (`shed_clients`, by default
  `resends_state_only`: the `mrtr/shedding` capability extension, which mrtr's `FlowClient`
  and CLI declare, or the official Python SDK's default `clientInfo` name `mcp`, which
  `mcp.Client` and FastMCP's client send). For any other client an over-signal round runs
  on, on this instance, and is counted in `kept`: the user gets the answer a little later
  instead of an error (an overload error would fail the call in those hosts just the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mcp_types import ClientCapabilities, Implementation, InputRequiredResult

from mrtr._engine.sealing import state_within_cap
from mrtr._telemetry import tracing
from mrtr._wire import SHEDDING_EXTENSION

if TYPE_CHECKING:
    from mrtr._engine.journal import Journal
    from mrtr._engine.round import CallNext, Round

logger = logging.getLogger("mrtr.shedding")

RESENDING_CLIENTS = frozenset({"mcp"})
"""`clientInfo` names of clients known to resend state-only results: the official Python SDK's
default (`mcp.Client`, and FastMCP's client, which drives rounds with it)."""

ShedClients = Callable[[Implementation | None, ClientCapabilities | None], bool]
"""Whether a request's client (its `clientInfo`, its capabilities) may be shed to."""


def resends_state_only(client_info: Implementation | None, capabilities: ClientCapabilities | None) -> bool:
    """The default `shed_clients`: the client declares `mrtr/shedding`, or is a known resender."""
    if capabilities is not None and SHEDDING_EXTENSION in (capabilities.extensions or {}):
        return True
    return client_info is not None and client_info.name in RESENDING_CLIENTS


_LAG_INTERVAL = 0.05
_LAG_IDLE = 5.0  # the lag sampler stops this long after the last round, and restarts with the next


class ShedRound(BaseException):
    """Raised at a shed point of an overloaded instance; the engine answers with the journal.

    A BaseException so that a flow's `except Exception` cannot swallow it.
    """


class LoadShedder:
    """The load signal and shedding policy of one server instance (shared by its flows).

    Args:
        max_inflight_rounds: Shed while more MRTR rounds than this run on this instance.
        max_loop_lag: Shed while the event loop runs timers more than this many seconds late.
        shed_when: Shed while this returns True (your own signal: queue depth, memory...).
        shed_clients: Which clients may be shed to (see the module docstring); by default
            `resends_state_only`.
    """

    def __init__(
        self,
        *,
        max_inflight_rounds: int | None = None,
        max_loop_lag: float | None = None,
        shed_when: Callable[[], bool] | None = None,
        shed_clients: ShedClients | None = None,
    ) -> None:
        if max_inflight_rounds is not None and max_inflight_rounds < 1:
            raise ValueError("max_inflight_rounds must be at least 1")
        if max_loop_lag is not None and not max_loop_lag > 0:
            raise ValueError("max_loop_lag must be a positive number of seconds")
        self.max_inflight_rounds = max_inflight_rounds
        self.max_loop_lag = max_loop_lag
        self.shed_when = shed_when
        self.shed_clients = shed_clients or resends_state_only
        self.inflight = 0
        self.shed = 0
        """Rounds this instance has shed so far."""
        self.kept = 0
        """Rounds that ran on although they would have been shed: their client does not resend."""
        self.lag = 0.0
        """The event loop's latest measured lag, seconds (sampled only with `max_loop_lag`)."""
        self._last_round = 0.0
        self._sampler: asyncio.Task[None] | None = None

    @classmethod
    def from_options(
        cls,
        max_inflight_rounds: int | None,
        max_loop_lag: float | None,
        shed_when: Callable[[], bool] | None,
        shed_clients: ShedClients | None = None,
    ) -> LoadShedder | None:
        if max_inflight_rounds is None and max_loop_lag is None and shed_when is None:
            return None
        return cls(
            max_inflight_rounds=max_inflight_rounds,
            max_loop_lag=max_loop_lag,
            shed_when=shed_when,
            shed_clients=shed_clients,
        )

    def overloaded(self) -> bool:
        if self.max_inflight_rounds is not None and self.inflight > self.max_inflight_rounds:
            return True
        if self.max_loop_lag is not None and self.lag > self.max_loop_lag:
            return True
        return self.shed_when is not None and bool(self.shed_when())

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """Count one MRTR round as in flight on this instance."""
        self.inflight += 1
        if self.max_loop_lag is not None:
            self._last_round = time.monotonic()
            if self._sampler is None or self._sampler.done():
                self._sampler = asyncio.get_running_loop().create_task(self._sample_lag())
        try:
            yield
        finally:
            self.inflight -= 1

    async def __call__(self, round: Round, call_next: CallNext) -> Any:
        """The round policy (`mrtr._engine.round`): count the round in flight, give it a shed
        point, and answer a shed round with its state only."""
        assert round.journal is not None
        with self.round():
            round.shed = self.point(round.journal, round.client_info, round.capabilities)
            try:
                return await call_next(round)
            except ShedRound:
                self.shed += 1
                tracing.shed(round.spec.name, "overloaded")
                return shed_result(round)

    def point(
        self,
        journal: Journal,
        client_info: Implementation | None = None,
        capabilities: ClientCapabilities | None = None,
    ) -> ShedPoint:
        """A shed point for one round, remembering how far the journal was when it began,
        and whether the round's client may be shed to."""
        return ShedPoint(self, journal, self._sheds_to(client_info, capabilities))

    def _sheds_to(self, client_info: Implementation | None, capabilities: ClientCapabilities | None) -> bool:
        try:
            return bool(self.shed_clients(client_info, capabilities))
        except Exception:  # a faulty policy must not fail the round: run it on
            logger.exception("shed_clients raised; this round is not shed")
            return False

    async def _sample_lag(self) -> None:
        while time.monotonic() - self._last_round < _LAG_IDLE:
            start = time.monotonic()
            await asyncio.sleep(_LAG_INTERVAL)
            # Halve the remembered lag per sample (~50 ms): one stall sheds for a few samples, not one.
            self.lag = max(time.monotonic() - start - _LAG_INTERVAL, self.lag / 2, 0.0)
        self.lag = 0.0


class ShedPoint:
    """Decides, at a step boundary of one round, whether to end the round now."""

    def __init__(self, shedder: LoadShedder, journal: Journal, resends: bool = True) -> None:
        self._shedder = shedder
        self._start = _progress(journal)
        self._resends = resends
        self._tripped = False
        self._kept = False

    def check(self, replay: Any) -> None:
        """Raise `ShedRound` if the instance is overloaded and shedding here loses nothing.

        Once a round sheds, every later shed point of it sheds too: a sibling branch of a
        `gather` that outlives the shed must not start a step the journal will never see.
        """
        if self._tripped:
            raise ShedRound
        if not self._shedder.overloaded() or _progress(replay.journal) <= self._start:
            return
        if replay.running_steps:  # another branch's step is running: its result would be lost
            return
        if not self._resends:  # the client would show a state-only result as an error: run on
            if not self._kept:
                self._kept = True
                self._shedder.kept += 1
            return
        self._tripped = True
        raise ShedRound


def _progress(journal: Journal) -> int:
    return len(journal.steps) + len(journal.answers)


def shed_result(round: Round) -> InputRequiredResult:
    """The state-only `InputRequiredResult` a shed round ends with: the journal, no asks.

    `rounds` is not incremented (a shed is not a round of client input), and `pending`
    keeps the questions the client was last asked, so their answers stay acceptable.
    """
    assert round.journal is not None
    return InputRequiredResult(request_state=state_within_cap(round.journal, round))


__all__ = [
    "RESENDING_CLIENTS",
    "SHEDDING_EXTENSION",
    "LoadShedder",
    "ShedClients",
    "ShedPoint",
    "ShedRound",
    "resends_state_only",
    "shed_result",
]
