"""Single-use rounds: a replay guard so each round's `requestState` is consumed at most once.

Without a guard, state is only *authentic* (the SDK seals it, binds it to the request,
principal, audience and a TTL): a client may send one round's state again within its TTL,
and every step after that round runs again (under the same idempotency keys), or answer it
twice with different answers and run both branches. With a guard (on by default wherever
`Flows` has a shared store; `Flows(server, replay_guard=...)` names another ledger) every round
is recorded in a shared ledger (Redis, PostgreSQL or SQLite, the same stores as tasks) before
any step runs (the claim goes out alongside the round's replayed code; see below):

- A round is `(flow_id, rounds)` of the unsealed journal, plus a digest of the state itself
  (a shed round hands out a new state for the same `rounds`: it is a new round).
- The first arrival *claims* it atomically, recording a digest of its `inputResponses` and
  an in-flight lease (on the ledger's clock) that it renews while the round runs.
- Other answers for a claimed round are a fork: -32602, `reason: "request_state_forked"`,
  unless they are a client going "Back" where that is safe (below).
- The same answers again (a client retrying after a lost response) get the stored outcome
  of the first run, so no step runs twice; past `max_outcome_bytes` the outcome is not kept
  and the resend gets -32602, `reason: "request_state_consumed"`.
- The same answers while the first run is still going wait (up to `max_wait`) for its
  outcome, or take the round over once its lease lapsed (the instance died); still busy
  after `max_wait`: -32602, `reason: "request_state_in_flight"` (retry later).
- The ledger unreachable: -32603, `reason: "replay_guard_unavailable"`, `retryable: true`
  (fail closed, the default: no round runs because the guard could not check it). A round whose
  body failed because the store did not answer records no outcome, so its retry runs it then.
  With `on_outage="degrade"` (`Flows(replay_guard_outage="degrade")`) the round runs unguarded
  instead, as it would with no guard: logged once per burst, at WARNING, and once more, with
  the count, when the ledger answers again.
- Entries expire with the flow's deadline or the state's TTL, whichever comes first.

A round with no `requestState` (a flow's first) starts a new flow and is not guarded.

"Back" (a wizard's previous page: an earlier round's `requestState` sent again with other
answers) takes the new answers when nothing would run twice: the round finished, no step
finished in it nor in any round after it on its branch, and none of those rounds is still
running (one that is: the re-answer waits for it, as a resend does) or died unfinished. The
ledger links each round to the round its outcome handed out, and marks every later round of
the branch left behind superseded: their states are refused, -32602, `reason:
"request_state_superseded"`, so the flow still has one branch. A re-answer after a step
finished stays a fork. A ledger without `rewind_round` (`RoundRewinding`), or
`ReplayGuard(back=False)`, refuses every re-answer as a fork.

On the hot path a round costs one ledger round trip, its claim, and the claim goes out while
the round's replayed code runs: only the round's first side effect (a new step, a task started)
waits for it (`Round.gate`). A run whose claim is refused is dropped, whatever it reached. The
round's outcome is recorded after the round answered: at once when a step finished in it, else
with the flow's next claim where the ledger can (`RoundPipelining`: Redis, one script), or on
its own after `HOLD` seconds. A resend arriving before the outcome is recorded waits for it, as
for a round still running; `close()` (and a server's shutdown) writes every outcome held.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from mcp.server.request_state import InvalidRequestState
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, InputRequiredResult

from mrtr._engine.round import RoundDropped
from mrtr._engine.spec import TaskStarted
from mrtr._errors import Cancelled, Declined, FlowError, InputRefused, StoreUnavailable
from mrtr._telemetry import tracing
from mrtr._wire import CreateTaskResult
from mrtr.stores._abilities import can_pipeline_rounds, can_rewind_rounds

if TYPE_CHECKING:
    from mrtr._engine.journal import Journal
    from mrtr._engine.round import CallNext, Round
    from mrtr._engine.spec import FlowSpec
    from mrtr.stores._abilities import RoundLedger
    from mrtr.stores._sealed import RecordSeal

_OUTCOME = "mrtr/round-outcome/v1"

FORKED = "request_state_forked"
CONSUMED = "request_state_consumed"
IN_FLIGHT = "request_state_in_flight"
SUPERSEDED = "request_state_superseded"
UNAVAILABLE = "replay_guard_unavailable"

logger = logging.getLogger("mrtr.guard")

GuardOutage = Literal["fail_closed", "degrade"]
"""What a round does while the replay guard's ledger does not answer (`ReplayGuard(on_outage=...)`)."""
GUARD_OUTAGES: tuple[GuardOutage, ...] = ("fail_closed", "degrade")

HOLD = 0.05
"""Seconds the outcome of a round no step finished in waits for its flow's next claim to carry it."""

_PREPARE_AFTER = 0.002  # seconds after a round answered that its held outcome is made ready to send

_SEND_YIELDS = 1  # loop passes the claim's task gets to put its request on the wire before the run

_PURGE_EVERY = 256  # claims between sweeps of expired rounds (SQL ledgers; Redis expires keys itself)


class DegradedRuns:
    """Rounds run without the ledger's protection while it does not answer (`on_outage="degrade"`),
    told once when a burst of ledger failures starts and once when the ledger answers again.

    `started` and `ended` are the two warnings' texts: `started` gets the store and the first
    flow's name, `ended` the number of rounds that ran meanwhile.
    """

    def __init__(self, started: str, ended: str) -> None:
        self.started = started
        self.ended = ended
        self.count = 0
        """Rounds run unprotected in the current burst."""

    def ran(self, spec: FlowSpec, exc: StoreUnavailable) -> None:
        self.count += 1
        if self.count == 1:
            logger.warning(self.started, exc.store, spec.name)

    def recovered(self) -> None:
        """The ledger answered: end the burst (say so if a round ran unprotected in it)."""
        if self.count:
            logger.warning(self.ended, self.count)
            self.count = 0


class ReplayGuard:
    """Enforces single-use rounds against a shared `RoundLedger` (`mrtr.stores._abilities`: the SQLite,
    Redis and PostgreSQL stores are ledgers).

    Args:
        ledger: Where rounds are recorded; share it across the fleet.
        lease: Seconds a round may run without its instance renewing the claim before a
            resend of the same round may take it over.
        max_wait: Seconds a resend waits for the first run of its round to finish.
        max_outcome_bytes: Largest outcome kept for resends (JSON bytes).
        state_ttl: Seconds a round's state is accepted at all (the SDK's
            `RequestStateSecurity.ttl`); `Flows` fills it in from the server.
        on_outage: While the ledger does not answer, `"fail_closed"` (the default) refuses each
            round with the retryable -32603; `"degrade"` runs it unguarded (see the module docstring).
        back: Whether a client may re-answer an earlier round when no step finished since
            ("Back", see the module docstring); False refuses every re-answer as a fork.

    The outcome kept for resends is the flow's answer (its result, its next asks): with
    `seal` set (`Flows` gives the server's key ring unless `seal_at_rest=False`), it is
    stored sealed, bound to its round, so the ledger holds no plain answer either.
    """

    def __init__(
        self,
        ledger: RoundLedger,
        *,
        lease: float = 10.0,
        max_wait: float = 30.0,
        max_outcome_bytes: int = 64 * 1024,
        state_ttl: float | None = None,
        on_outage: GuardOutage = "fail_closed",
        back: bool = True,
    ) -> None:
        if lease <= 0 or max_wait < 0:
            raise ValueError("lease must be positive and max_wait not negative")
        if on_outage not in GUARD_OUTAGES:
            raise ValueError(f"on_outage={on_outage!r}: use one of {list(GUARD_OUTAGES)}")
        self.on_outage = on_outage
        self._unguarded = DegradedRuns(
            "replay guard: its ledger (%s) does not answer; rounds run unguarded until it does "
            "(replay_guard_outage='degrade': a resent round may run its steps again) — first: flow %s",
            "replay guard: its ledger answers again; %d round(s) ran unguarded meanwhile",
        )
        self.ledger = ledger
        self.lease = lease
        self.max_wait = max_wait
        self.max_outcome_bytes = max_outcome_bytes
        self.state_ttl = state_ttl
        self.seal: RecordSeal | None = None
        """Seals the outcomes kept for resends (`mrtr.stores.RecordSeal`); None: kept as plain JSON."""
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._claims = 0
        self.back = back and can_rewind_rounds(ledger)
        self._rewinds = can_rewind_rounds(ledger)
        self._writes: set[asyncio.Task[None]] = set()
        self._pipelines = can_pipeline_rounds(ledger)
        self._held: dict[str, _Held] = {}
        """flow id -> the outcome of its last round, held for its next claim to carry."""

    async def __call__(self, round: Round, call_next: CallNext) -> Any:
        """The round policy (`mrtr._engine.round`): a round that brings state runs at most once."""
        if not round.state:  # a call's first round: nothing to replay
            return await call_next(round)
        assert round.journal is not None
        return await self.guarded(round.spec, round.journal, round.state, round.answers, call_next(round), round)

    async def guarded(
        self,
        spec: FlowSpec,
        journal: Journal,
        state: str,
        answers: Mapping[str, Any],
        body: Coroutine[Any, Any, Any],
        round: Round | None = None,
    ) -> Any:
        """Run `body` (one round of `spec`) at most once fleet-wide; see the module docstring.

        With `round` (the request `body` serves), the claim goes out while `body` runs: the
        engine holds the round's first side effect (`Round.gate`) until the claim is this
        run's, and a run whose claim is refused is dropped, whatever it reached. Without it,
        the claim is settled before `body` starts.
        """
        round_id = f"{journal.flow_id}:{journal.rounds}:{_digest(state)[:22]}"
        steps = len(journal.steps)
        claim = asyncio.get_running_loop().create_task(
            self._claim(spec, journal, round_id, _digest(_canonical(answers)))
        )
        renewing: list[asyncio.Task[None] | asyncio.TimerHandle] = []
        claim.add_done_callback(lambda done: self._start_renewing(done, round_id, renewing))
        if round is not None:
            round.gate = lambda: self._hold(claim)
            # Let the claim go out before the run starts: a round's run rarely yields before
            # its end, and a task that never ran would send its request only after it.
            for _ in range(_SEND_YIELDS):
                await asyncio.sleep(0)
        else:
            await asyncio.wait([claim])
        error: BaseException | None = None
        try:
            try:
                value = await body
            except asyncio.CancelledError:
                claim.cancel()
                raise  # this instance is going away mid-round: the lease lapses, a resend takes over
            except BaseException as exc:
                error = exc
            try:
                outcome = await claim  # a refusal raises here: whatever the run reached is dropped
            except StoreUnavailable as exc:
                if self.on_outage != "degrade":
                    raise
                self._unguarded.ran(spec, exc)  # the run went on unguarded (`_hold`): its own outcome stands
                if error is not None:
                    raise error from None
                return value
        finally:
            for task in renewing:
                task.cancel()
        self._unguarded.recovered()
        if outcome is not None:
            return _replayed(spec, outcome)
        if error is not None:
            if not isinstance(error, StoreUnavailable):
                # (a store that did not answer is not an outcome: the retry it asks for takes
                # the round over once the lease lapses)
                failed = _error_outcome(spec, error)
                self._record(round_id, lambda: failed, None, len(journal.steps) > steps)
            raise error
        next_round = None
        if type(value) is InputRequiredResult and value.request_state:
            next_round = f"{journal.flow_id}:{journal.rounds}:{_digest(value.request_state)[:22]}"
        stepped = len(journal.steps) > steps or isinstance(value, TaskStarted)
        self._record(round_id, lambda: _value_outcome(value), next_round, stepped)
        return value

    async def _hold(self, claim: asyncio.Task[dict[str, Any] | None]) -> None:
        """`Round.gate`: wait for the round's claim; only a run that holds it goes on to a side effect
        (or any run, unguarded, while the ledger does not answer under `on_outage="degrade"`)."""
        try:
            outcome = await asyncio.shield(claim)
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            if self.on_outage == "degrade":
                return
            raise RoundDropped from exc
        except BaseException as exc:
            raise RoundDropped from exc
        if outcome is not None:
            raise RoundDropped

    def _start_renewing(
        self, claim: asyncio.Task[Any], round_id: str, renewing: list[asyncio.Task[None] | asyncio.TimerHandle]
    ) -> None:
        """Once the round is this run's, renew its lease while the run goes on (most rounds end first)."""
        if claim.cancelled() or claim.exception() is not None or claim.result() is not None:
            return
        loop = asyncio.get_running_loop()

        def renew() -> None:
            renewing.append(loop.create_task(self._renew(round_id)))

        renewing.append(loop.call_later(self.lease / 3, renew))

    def _record(
        self, round_id: str, outcome: Callable[[], dict[str, Any]], next_round: str | None, stepped: bool
    ) -> None:
        """Record a round's outcome off the hot path: the round answers without waiting for it.

        The outcome of a round no step finished in, that hands out a next round, is held for
        the flow's next claim to carry (`HOLD`); any other is written at once.
        """
        loop = asyncio.get_running_loop()
        if self._pipelines and not stepped and next_round is not None:
            flow = round_id.partition(":")[0]
            earlier = self._held.pop(flow, None)
            if earlier is not None:
                earlier.timer.cancel()
                self._write(earlier.round_id, earlier.outcome, earlier.next_round, False)
            held = _Held(round_id, outcome, next_round, loop.call_later(HOLD, self._release, flow))
            self._held[flow] = held
            # once the answer is on its way (not before it: the response is written by this loop
            # too), so that the flow's next claim finds it ready
            loop.call_later(_PREPARE_AFTER, self._prepare, held)
            return
        self._write(round_id, outcome, next_round, stepped)

    def _prepare(self, held: _Held) -> None:
        if held.text is None:
            held.text = self._outcome_text(held.round_id, held.outcome())

    def _write(
        self, round_id: str, outcome: Callable[[], dict[str, Any]], next_round: str | None, stepped: bool
    ) -> None:
        write = asyncio.get_running_loop().create_task(self._finish(round_id, outcome, next_round, stepped))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    def _release(self, flow: str) -> None:
        """`HOLD` passed and no claim of the flow carried its held outcome: write it on its own."""
        held = self._held.pop(flow, None)
        if held is not None:
            self._write(held.round_id, held.outcome, held.next_round, False)

    async def _claim(self, spec: FlowSpec, journal: Journal, round_id: str, digest: str) -> dict[str, Any] | None:
        now = time.time()
        expires_at = journal.started_at + spec.limits.deadline
        if self.state_ttl is not None:
            expires_at = min(expires_at, now + self.state_ttl)
        expires_at = max(expires_at, now + self.lease)
        self._claims += 1
        if self._claims % _PURGE_EVERY == 0:
            await self.ledger.purge_rounds()
        give_up = time.monotonic() + self.max_wait
        delay = 0.02
        held = self._held.pop(journal.flow_id, None)
        for _ in range(10_000):  # bounded by `max_wait` in practice
            try:
                if held is not None:  # the flow's last outcome rides with this claim: one round trip
                    held.timer.cancel()
                    verdict, stored = await self._finish_and_claim(held, round_id, digest, expires_at)
                    held = None
                else:
                    verdict, stored = await self.ledger.claim_round(
                        round_id, digest, self.owner, self.lease, expires_at
                    )
                if verdict == "forked" and self.back:
                    verdict, stored = await self._go_back(round_id, digest, expires_at)
            except StoreUnavailable as exc:  # fail closed, precisely: no round runs unguarded
                raise StoreUnavailable(exc.store, exc.detail, reason=UNAVAILABLE, flow=spec.name) from exc
            except Exception as exc:  # a ledger of another kind: fail closed all the same
                logger.exception("replay guard: claiming round %s failed", round_id)
                raise StoreUnavailable(
                    type(self.ledger).__name__, str(exc), reason=UNAVAILABLE, flow=spec.name
                ) from exc
            if verdict == "claimed":
                return None
            if verdict == "forked":
                raise _refused(spec, FORKED, "this round was already answered differently; the flow cannot fork")
            if verdict == "superseded":
                raise _refused(
                    spec, SUPERSEDED, "an earlier round of this flow was answered again since; continue from there"
                )
            if verdict == "done":
                return self._open(round_id, stored) if stored else {"k": "consumed"}
            if verdict == "busy":
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.25)
        raise _refused(spec, IN_FLIGHT, "this round is still being served by another request; retry shortly")

    async def _finish_and_claim(
        self, held: _Held, round_id: str, digest: str, expires_at: float
    ) -> tuple[str, str | None]:
        ledger = self.ledger
        assert can_pipeline_rounds(ledger)
        self._prepare(held)
        assert held.text is not None
        text = held.text
        return await ledger.finish_and_claim(
            held.round_id, text, held.next_round, False, round_id, digest, self.owner, self.lease, expires_at
        )

    async def _go_back(self, round_id: str, digest: str, expires_at: float) -> tuple[str, str | None]:
        """Other answers for a claimed round: "Back", where no step finished since (module docstring)."""
        ledger = self.ledger
        assert can_rewind_rounds(ledger)
        verdict, _ = await ledger.rewind_round(round_id, digest, self.owner, self.lease, expires_at)
        if verdict == "claimed":
            logger.info("replay guard: round %s answered again (Back); the rounds after it are superseded", round_id)
        if verdict in ("same", "retry"):
            return "retry", None  # claim it as usual on the next pass
        return verdict, None

    async def _renew(self, round_id: str) -> None:
        interval = self.lease / 3
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.ledger.renew_round(round_id, self.owner, self.lease):
                    return
            except StoreUnavailable:
                continue  # logged once per burst by the store; the next beat tries again

    async def _finish(
        self, round_id: str, outcome: Callable[[], dict[str, Any]], next_round: str | None = None, stepped: bool = False
    ) -> None:
        text = self._outcome_text(round_id, outcome())
        ledger = self.ledger
        try:
            if self._rewinds:
                assert can_rewind_rounds(ledger)
                await ledger.finish_round_linked(round_id, self.owner, text, next_round, stepped)
            else:
                await ledger.finish_round(round_id, self.owner, text)
        except StoreUnavailable:
            pass  # the round ran: answer it (logged once per burst by the store); a resend waits out the lease
        except Exception:
            # The round ran: answer it. A resend takes the round over once the lease lapses.
            logger.exception("replay guard: recording the outcome of round %s failed", round_id)

    def _outcome_text(self, round_id: str, outcome: dict[str, Any]) -> str:
        """An outcome as the ledger keeps it: JSON, sealed with `seal` where one is set."""
        text = json.dumps(outcome, separators=(",", ":"))
        if len(text.encode()) > self.max_outcome_bytes:
            text = '{"k":"consumed"}'
        codec = None if self.seal is None else self.seal.codec
        if codec is not None:
            text = codec.seal(json.dumps({"k": _OUTCOME, "r": round_id, "o": text}, separators=(",", ":")).encode())
        return text

    def _open(self, round_id: str, stored: str) -> dict[str, Any]:
        """A stored outcome: plain JSON as before sealing, or sealed; one no key opens counts as not kept."""
        if stored.startswith("{"):
            outcome: dict[str, Any] = json.loads(stored)
            return outcome
        codec = None if self.seal is None else self.seal.codec
        try:
            if codec is None:
                raise InvalidRequestState("no key ring")
            sealed = json.loads(codec.unseal(stored))
            if not isinstance(sealed, dict) or sealed.get("k") != _OUTCOME or sealed.get("r") != round_id:
                raise InvalidRequestState("not this round's outcome")
            opened: dict[str, Any] = json.loads(sealed["o"])
            return opened
        except (InvalidRequestState, ValueError, KeyError, TypeError):
            logger.warning("replay guard: the kept outcome of round %s does not open; its resend is refused", round_id)
            return {"k": "consumed"}

    async def drain(self) -> None:
        """Write the outcomes held and wait for those still being recorded (a round answers first)."""
        for flow in list(self._held):
            held = self._held.pop(flow)
            held.timer.cancel()
            self._write(held.round_id, held.outcome, held.next_round, False)
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        await self.ledger.close()


@dataclass(slots=True)
class _Held:
    """The outcome of a flow's last round, held for the flow's next claim to carry (`HOLD`)."""

    round_id: str
    outcome: Callable[[], dict[str, Any]]
    next_round: str | None
    timer: asyncio.TimerHandle
    text: str | None = None
    """The outcome as the ledger keeps it, made once the round has answered."""


def open_guard(url: str, *, namespace: str | None = None, **options: Any) -> ReplayGuard:
    """A `ReplayGuard` on the store at `url` (same URLs as `mrtr.open_store`)."""
    from mrtr.stores import open_store
    from mrtr.stores._abilities import is_round_ledger

    store = open_store(url, namespace=namespace)
    if not is_round_ledger(store):  # every store `open_store` opens is one
        raise ValueError(f"a {type(store).__name__} cannot record rounds")
    return ReplayGuard(store, **options)


# -- outcomes ---------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _canonical(answers: Mapping[str, Any]) -> str:
    return json.dumps(answers, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def _refused(spec: FlowSpec, reason: str, message: str) -> MCPError:
    tracing.replay_refused(spec.name, reason)
    return MCPError(code=INVALID_PARAMS, message=message, data={"reason": reason, "flow": spec.name})


def _value_outcome(value: Any) -> dict[str, Any]:
    if isinstance(value, TaskStarted):
        return {"k": "task", "r": value.result.wire()}  # as sent: the format kept rounds have always had
    if isinstance(value, InputRequiredResult):
        return {"k": "ir", "r": value.model_dump(mode="json", by_alias=True, exclude_none=True)}
    try:
        import pydantic_core

        return {"k": "v", "v": pydantic_core.to_jsonable_python(value)}
    except Exception:
        return {"k": "consumed"}


def _error_outcome(spec: FlowSpec, exc: BaseException) -> dict[str, Any]:
    from mrtr._engine.run import as_protocol_error

    if isinstance(exc, FlowError):
        exc = as_protocol_error(spec, exc)
    if isinstance(exc, MCPError):
        return {"k": "e", "e": exc.error.model_dump(mode="json", exclude_none=True)}
    if isinstance(exc, InputRefused):
        return {"k": "refused", "a": exc.action, "q": exc.question, "key": exc.key}
    return {"k": "x", "m": str(exc)}


def _replayed(spec: FlowSpec, outcome: dict[str, Any]) -> Any:
    """The first run's outcome, given again to an identical resend of its round."""
    from mrtr._engine.steps import return_adapter

    kind = outcome.get("k")
    if kind == "ir":
        return InputRequiredResult.model_validate(outcome["r"])
    if kind == "v":
        adapter = return_adapter(spec.fn)
        return outcome["v"] if adapter is None else adapter.validate_python(outcome["v"])
    if kind == "task":
        return TaskStarted(CreateTaskResult.model_validate(outcome["r"]))
    if kind == "e":
        error = outcome["e"]
        raise MCPError(code=error["code"], message=error["message"], data=error.get("data"))
    if kind == "refused":
        refused = Declined if outcome["a"] == Declined.action else Cancelled
        raise refused(outcome["q"], key=outcome["key"])
    if kind == "x":
        raise RuntimeError(outcome["m"])
    raise _refused(spec, CONSUMED, "this round's state was already used and its outcome is not kept")


__all__ = [
    "CONSUMED",
    "FORKED",
    "GUARD_OUTAGES",
    "GuardOutage",
    "IN_FLIGHT",
    "SUPERSEDED",
    "UNAVAILABLE",
    "ReplayGuard",
    "open_guard",
]
