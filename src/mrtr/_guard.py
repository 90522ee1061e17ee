"""Single-use rounds: a replay guard so each round's `requestState` is consumed at most once.

Without a guard, state is only *authentic* (the SDK seals it, binds it to the request,
principal, audience and a TTL): a client may send one round's state again within its TTL,
and every step after that round runs again (under the same idempotency keys), or answer it
twice with different answers and run both branches. With a guard (on by default wherever
`Flows` has a shared store; `Flows(server, replay_guard=...)` names another ledger) every round
is recorded in a shared ledger (Redis, PostgreSQL or SQLite, the same stores as tasks) before
any flow code runs:

- A round is `(flow_id, rounds)` of the unsealed journal, plus a digest of the state itself
  (a shed round hands out a new state for the same `rounds`: it is a new round).
- The first arrival *claims* it atomically, recording a digest of its `inputResponses` and
  an in-flight lease (on the ledger's clock) that it renews while the round runs.
- Other answers for a claimed round are a fork: -32602, `reason: "request_state_forked"`.
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
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal

from mcp.server.request_state import InvalidRequestState
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, InputRequiredResult

from mrtr._engine.spec import TaskStarted
from mrtr._errors import Cancelled, Declined, FlowError, InputRefused, StoreUnavailable
from mrtr._telemetry import tracing
from mrtr._wire import CreateTaskResult

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
UNAVAILABLE = "replay_guard_unavailable"

logger = logging.getLogger("mrtr.guard")

GuardOutage = Literal["fail_closed", "degrade"]
"""What a round does while the replay guard's ledger does not answer (`ReplayGuard(on_outage=...)`)."""
GUARD_OUTAGES: tuple[GuardOutage, ...] = ("fail_closed", "degrade")

_PURGE_EVERY = 256  # claims between sweeps of expired rounds (SQL ledgers; Redis expires keys itself)


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
    ) -> None:
        if lease <= 0 or max_wait < 0:
            raise ValueError("lease must be positive and max_wait not negative")
        if on_outage not in GUARD_OUTAGES:
            raise ValueError(f"on_outage={on_outage!r}: use one of {list(GUARD_OUTAGES)}")
        self.on_outage = on_outage
        self._unguarded = 0
        """Rounds run unguarded in the current burst of ledger failures (`on_outage="degrade"`)."""
        self.ledger = ledger
        self.lease = lease
        self.max_wait = max_wait
        self.max_outcome_bytes = max_outcome_bytes
        self.state_ttl = state_ttl
        self.seal: RecordSeal | None = None
        """Seals the outcomes kept for resends (`mrtr.stores.RecordSeal`); None: kept as plain JSON."""
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._claims = 0

    async def __call__(self, round: Round, call_next: CallNext) -> Any:
        """The round policy (`mrtr._engine.round`): a round that brings state runs at most once."""
        if not round.state:  # a call's first round: nothing to replay
            return await call_next(round)
        assert round.journal is not None
        return await self.guarded(round.spec, round.journal, round.state, round.answers, call_next(round))

    async def guarded(
        self,
        spec: FlowSpec,
        journal: Journal,
        state: str,
        answers: Mapping[str, Any],
        body: Coroutine[Any, Any, Any],
    ) -> Any:
        """Run `body` (one round of `spec`) at most once fleet-wide; see the module docstring."""
        round_id = f"{journal.flow_id}:{journal.rounds}:{_digest(state)[:22]}"
        try:
            outcome = await self._claim(spec, journal, round_id, _digest(_canonical(answers)))
        except StoreUnavailable as exc:
            if self.on_outage != "degrade":
                body.close()
                raise
            self._degrade(spec, exc)
            return await body
        except BaseException:
            body.close()
            raise
        if self._unguarded:
            self._recovered()
        if outcome is not None:
            body.close()
            return _replayed(spec, outcome)
        renewing = asyncio.get_running_loop().create_task(self._renew(round_id))
        try:
            value = await body
        except asyncio.CancelledError:
            raise  # this instance is going away mid-round: the lease lapses, a resend takes over
        except StoreUnavailable:
            raise  # not an outcome: the retry it asks for takes the round over once the lease lapses
        except BaseException as exc:
            await self._finish(round_id, _error_outcome(spec, exc))
            raise
        finally:
            renewing.cancel()
        await self._finish(round_id, _value_outcome(value))
        return value

    def _degrade(self, spec: FlowSpec, exc: StoreUnavailable) -> None:
        """A round runs unguarded (`on_outage="degrade"`): said once per burst of ledger failures."""
        self._unguarded += 1
        if self._unguarded == 1:
            logger.warning(
                "replay guard: its ledger (%s) does not answer; rounds run unguarded until it does "
                "(replay_guard_outage='degrade': a resent round may run its steps again) — first: flow %s",
                exc.store,
                spec.name,
            )

    def _recovered(self) -> None:
        logger.warning("replay guard: its ledger answers again; %d round(s) ran unguarded meanwhile", self._unguarded)
        self._unguarded = 0

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
        for _ in range(10_000):  # bounded by `max_wait` in practice
            try:
                verdict, stored = await self.ledger.claim_round(round_id, digest, self.owner, self.lease, expires_at)
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
            if verdict == "done":
                return self._open(round_id, stored) if stored else {"k": "consumed"}
            if verdict == "busy":
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.25)
        raise _refused(spec, IN_FLIGHT, "this round is still being served by another request; retry shortly")

    async def _renew(self, round_id: str) -> None:
        interval = self.lease / 3
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.ledger.renew_round(round_id, self.owner, self.lease):
                    return
            except StoreUnavailable:
                continue  # logged once per burst by the store; the next beat tries again

    async def _finish(self, round_id: str, outcome: dict[str, Any]) -> None:
        text = json.dumps(outcome, separators=(",", ":"))
        if len(text.encode()) > self.max_outcome_bytes:
            text = '{"k":"consumed"}'
        codec = None if self.seal is None else self.seal.codec
        if codec is not None:
            text = codec.seal(json.dumps({"k": _OUTCOME, "r": round_id, "o": text}, separators=(",", ":")).encode())
        try:
            await self.ledger.finish_round(round_id, self.owner, text)
        except StoreUnavailable:
            pass  # the round ran: answer it (logged once per burst by the store); a resend waits out the lease
        except Exception:
            # The round ran: answer it. A resend takes the round over once the lease lapses.
            logger.exception("replay guard: recording the outcome of round %s failed", round_id)

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

    async def close(self) -> None:
        await self.ledger.close()


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
    "IN_FLIGHT",
    "UNAVAILABLE",
    "GuardOutage",
    "ReplayGuard",
    "open_guard",
]
