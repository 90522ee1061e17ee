"""A resent first round joins its first copy: round 1 of a call, once fleet-wide, when it can be told apart.

The replay guard (`mrtr._guard`) makes every round that brings `requestState` single-use. A
call's first round brings nothing of the sort, so a balancer that resends it (HAProxy's
`retry-on empty-response` after the instance died mid-round) or a client that retries it used
to start a second flow: every step that had finished ran again. This policy gives round 1 an
identity and claims it in the same shared ledger, as the guard claims rounds:

- **What identifies a call** (first found wins; none: the round runs as before, unjoined):
  1. the caller's idempotency key, `params._meta["mrtr/idempotencyKey"]` (`FlowClient` sends
     one on every call): covers the caller's own resends too;
  2. a request id the balancer stamps once and keeps on its retries, read from the
     `X-Request-ID` header (`Flows(request_id_header=...)`; HAProxy `unique-id-format`, Envoy,
     nginx `$request_id`): a client's own resend is a new request to the balancer, so a new id;
  3. the authenticated principal with the request's body (method, target, arguments, JSON-RPC
     id): one user's resend of the same request.
  The body alone never is: two separate `mcp.Client` sessions send byte-identical first
  calls (JSON-RPC id 2, the same arguments). Every identity also holds the principal (None when
  unauthenticated), the method and the target, so two callers never share one.
- **The first copy** claims the identity (an in-flight lease it renews), runs the round with its
  flow id derived from the identity (a step interrupted by a death keeps its
  `idempotency_key`), and writes its journal to the ledger as steps finish, grouped as a
  task's checkpoints are (`mrtr.tasks._checkpoints`): a finished step is in the store before
  the next step starts and before the round answers. Its answer (value, error, next asks,
  task) is recorded for resends, sealed with the server's key ring.
- **A copy that arrives while the first runs** waits (up to the guard's `max_wait`) for the
  recorded answer and returns it; once the first copy's lease lapses (its instance died) it
  takes the call over from the last checkpoint: finished steps are replayed from the journal,
  never run again. Still running after `max_wait`: -32603, `reason: "request_in_flight"`,
  `retryable: true`.
- **A copy that arrives after**, within the window the identity is kept (the flow's deadline
  or the state's TTL, as the guard keeps rounds; at most `PRINCIPAL_WINDOW`, 60 s, for an
  identity of principal and body alone), gets the recorded answer. After it, the call is new.
  The same identity with another body is refused (-32602, `reason: "request_id_reused"`): a
  key names one call.

While the store does not answer, a first round with an identity follows the guard's
`on_outage` (`Flows(replay_guard_outage=...)`): under `"fail_closed"` it runs until its first
side effect (a new step, a task started) and is refused there, before the effect, with the
store's retryable -32603, so a round that only computes or asks still answers; under
`"degrade"` it runs without joining its resends, logged once per burst.

On only where the replay guard records rounds in a ledger that keeps progress
(`mrtr.stores._abilities.RoundProgress`: Redis, PostgreSQL), i.e. by default wherever a
shared store is configured. Clients before 2026-07-28 run their flows live over a session,
not in rounds, and are not covered (a balancer keeps them on one instance by `Mcp-Session-Id`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mcp.server.request_state import InvalidRequestState
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import JournalFormatError
from mrtr._engine.round import RoundDropped
from mrtr._errors import StoreUnavailable
from mrtr._guard import DegradedRuns, _error_outcome, _replayed, _value_outcome
from mrtr.stores._abilities import has_round_progress
from mrtr.tasks._checkpoints import Checkpoints
from mrtr.tasks._seam import idempotency_key

if TYPE_CHECKING:
    from mrtr._engine.round import CallNext, Round
    from mrtr._engine.spec import FlowSpec
    from mrtr._guard import ReplayGuard

logger = logging.getLogger("mrtr.guard")

DEFAULT_REQUEST_ID_HEADER = "X-Request-ID"
"""Where a balancer's stamped request id is read by default (`Flows(request_id_header=...)`)."""

IN_FLIGHT = "request_in_flight"
REUSED = "request_id_reused"
TAKEN_OVER = "request_taken_over"

PRINCIPAL_WINDOW = 60.0
"""Seconds a first round identified by principal and body alone is kept: a balancer's resend
comes within it; the same user's same request (same JSON-RPC id: a fresh session's first
call) made again later is a new call."""

_OUTCOME = "mrtr/call-outcome/v1"
_PROGRESS = "mrtr/call-progress/v1"
_MAX_STAMP = 200

PrincipalOf = Callable[[Any], str | None]


class FirstRounds:
    """The round policy that makes a call's first round run once fleet-wide (see the module docstring).

    Args:
        guard: The replay guard whose ledger, lease, wait and key ring it shares.
        header: The request-id header a balancer stamps (None: not read).
        principal_of: Who sent a request (`HostCore.bind_principal()`), from the SDK's request context.
    """

    def __init__(self, guard: ReplayGuard, header: str | None, principal_of: PrincipalOf) -> None:
        ledger = guard.ledger
        if not has_round_progress(ledger):
            raise TypeError(f"a {type(ledger).__name__} keeps no round progress")
        self.guard = guard
        self.ledger: Any = ledger
        self.header = header.lower() if header else None
        self.principal_of = principal_of
        self._unjoined = DegradedRuns(
            "first rounds: the store (%s) does not answer; first rounds run without joining their resends "
            "until it does (replay_guard_outage='degrade') — first: flow %s",
            "first rounds: the store answers again; %d first round(s) ran unjoined",
        )

    @staticmethod
    def available(guard: ReplayGuard | None) -> bool:
        """Whether `guard`'s ledger can keep a first round's progress (Redis, PostgreSQL)."""
        return guard is not None and has_round_progress(guard.ledger)

    async def __call__(self, round: Round, call_next: CallNext) -> Any:
        """The round policy (`mrtr._engine.round`): a first round with an identity runs once."""
        if round.state or round.wire is None:
            return await call_next(round)
        found = self.identity(round)
        if found is None:
            return await call_next(round)
        return await self.joined(round, found[0], found[1], call_next)

    # -- identity ----------------------------------------------------------------------------

    def identity(self, round: Round) -> tuple[str, str] | None:
        """`(kind, call id)` of this first round, or None when nothing tells a resend from a new call."""
        wire = round.wire
        principal = self.principal_of(wire)
        scope = [principal or "", round.method, round.target]
        key = idempotency_key(wire)  # -32602 for a malformed one
        if key is not None:
            return "key", _call_id("key", *scope, key)
        if self.header is not None:
            headers = getattr(getattr(wire, "request", None), "headers", None)
            stamp = headers.get(self.header) if headers is not None else None
            if isinstance(stamp, str) and 0 < len(stamp) <= _MAX_STAMP and stamp.isprintable():
                return "stamp", _call_id("stamp", *scope, stamp)
        if principal is not None:
            return "principal", _call_id("principal", *scope, json.dumps(wire.request_id), _body_digest(round))
        return None

    # -- the call, once ------------------------------------------------------------------------

    async def joined(self, round: Round, kind: str, call_id: str, call_next: CallNext) -> Any:
        spec = round.spec
        assert round.journal is not None
        round_id = f"{call_id}:r1"  # the call id first: its hash tag on a Redis Cluster, so calls spread over slots
        try:
            outcome, progress = await self._claim(spec, round_id, _body_digest(round), kind)
        except StoreUnavailable as exc:
            if self.guard.on_outage != "degrade":
                return await self._until_an_effect(round, call_next, exc)
            self._unjoined.ran(spec, exc)
            return await call_next(round)
        self._unjoined.recovered()
        if outcome is not None:
            logger.debug("flow %s: a resent first round (%s) got its first copy's answer", spec.name, kind)
            return _replayed(spec, outcome)
        journal = self._resume(spec, round_id, progress)
        if journal is None:
            round.journal.flow_id = _flow_id(call_id)  # a step cut short by a death keeps its key
        else:
            logger.info(
                "flow %s: a resent first round (%s) resumes its first copy's %d step(s)",
                spec.name,
                kind,
                len(journal.steps),
            )
            round.journal = journal
        current = round.journal
        seal = self._seal_text

        async def write() -> None:
            progress = seal(_PROGRESS, round_id, journal_codec.encode(current))
            try:
                saved = await self.ledger.save_round_progress(round_id, self.guard.owner, progress)
            except StoreUnavailable as exc:
                if self.guard.on_outage != "degrade":
                    raise  # the step fails retryable: its resend resumes from the last checkpoint
                self._unjoined.ran(spec, exc)
                return  # the round runs on; a resend after a death would redo this step
            if not saved:
                raise MCPError(
                    code=INTERNAL_ERROR,
                    message="this call was taken over by another request after its lease lapsed; retry it",
                    data={"reason": TAKEN_OVER, "flow": spec.name, "retryable": True},
                )

        checkpoints = Checkpoints(write)
        round.checkpoint = checkpoints
        renewing = asyncio.get_running_loop().create_task(self._renew(round_id))
        try:
            value = await call_next(round)
        except asyncio.CancelledError:
            checkpoints.abandon()
            raise  # the instance is going away: the lease lapses, a resend takes over
        except StoreUnavailable:
            checkpoints.abandon()
            raise  # not an outcome: the retry it asks for takes the call over once the lease lapses
        except BaseException as exc:
            checkpoints.abandon()
            await self._finish(round_id, _error_outcome(spec, exc))
            raise
        finally:
            renewing.cancel()
        checkpoints.abandon()  # the answer carries the journal from here on
        await self._finish(round_id, _value_outcome(value))
        return value

    @staticmethod
    async def _until_an_effect(round: Round, call_next: CallNext, unavailable: StoreUnavailable) -> Any:
        """Fail closed, but only where it matters: the store could not be asked, so the round runs
        until its first side effect (a new step, a task started: `Round.gate`) and is refused
        there with the store's retryable error, before the effect. A round that reaches none (it
        only computes, or asks the client) answers: its resend could not run anything twice."""

        async def closed() -> None:
            raise RoundDropped

        round.gate = closed
        try:
            return await call_next(round)
        except RoundDropped:
            raise unavailable from None

    async def _claim(
        self, spec: FlowSpec, round_id: str, digest: str, kind: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        """`(outcome, None)` for a call already answered; `(None, checkpoint)` once this copy holds it.

        The first attempt reads the checkpoint beside the claim, in parallel (one round trip's
        wait, not two, for the common call that is claimed at once); a claim won after waiting
        reads it again, since the first copy may have checkpointed more meanwhile.
        """
        guard = self.guard
        now = time.time()
        expires_at = now + spec.limits.deadline
        if guard.state_ttl is not None:
            expires_at = min(expires_at, now + guard.state_ttl)
        if kind == "principal":  # one user may mean the same request twice: join only a prompt resend
            expires_at = min(expires_at, now + PRINCIPAL_WINDOW)
        expires_at = max(expires_at, now + guard.lease)
        give_up = time.monotonic() + guard.max_wait
        delay = 0.02
        for attempt in range(10_000):  # bounded by `max_wait` in practice
            claim = self.ledger.claim_round(round_id, digest, guard.owner, guard.lease, expires_at)
            if attempt == 0:
                (verdict, stored), progress = await asyncio.gather(claim, self.ledger.round_progress(round_id))
            else:
                verdict, stored = await claim
            if verdict == "claimed":
                return None, (progress if attempt == 0 else await self.ledger.round_progress(round_id))
            if verdict == "forked":
                what = "idempotency key" if kind == "key" else "request id"
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=f"this {what} was already used for a call with another body",
                    data={"reason": REUSED, "flow": spec.name},
                )
            if verdict == "done":
                return (self._open(round_id, stored) if stored else {"k": "consumed"}), None
            if verdict == "busy":
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.25)
        raise MCPError(
            code=INTERNAL_ERROR,
            message="this call is still being served by another copy of the request; retry shortly",
            data={"reason": IN_FLIGHT, "flow": spec.name, "retryable": True},
        )

    def _resume(self, spec: FlowSpec, round_id: str, stored: str | None) -> journal_codec.Journal | None:
        """The journal a dead first copy checkpointed (None: it finished no step, or it does not open)."""
        if stored is None:
            return None
        try:
            return journal_codec.decode(self._open_text(_PROGRESS, round_id, stored))
        except (InvalidRequestState, JournalFormatError, ValueError, KeyError, TypeError):
            logger.warning("flow %s: the checkpoint of first round %s does not open; it runs anew", spec.name, round_id)
            return None

    async def _renew(self, round_id: str) -> None:
        guard = self.guard
        while True:
            await asyncio.sleep(guard.lease / 3)
            try:
                if not await self.ledger.renew_round(round_id, guard.owner, guard.lease):
                    return
            except StoreUnavailable:
                continue  # logged once per burst by the store; the next beat tries again

    async def _finish(self, round_id: str, outcome: dict[str, Any]) -> None:
        text = json.dumps(outcome, separators=(",", ":"))
        if len(text.encode()) > self.guard.max_outcome_bytes:
            text = '{"k":"consumed"}'
        try:
            await self.ledger.finish_round(round_id, self.guard.owner, self._seal_text(_OUTCOME, round_id, text))
        except StoreUnavailable:
            pass  # the call ran: answer it; a resend waits out the lease, then resumes from the checkpoint
        except Exception:
            logger.exception("first rounds: recording the outcome of %s failed", round_id)

    def _open(self, round_id: str, stored: str) -> dict[str, Any]:
        try:
            opened: dict[str, Any] = json.loads(self._open_text(_OUTCOME, round_id, stored))
            return opened
        except (InvalidRequestState, ValueError, KeyError, TypeError):
            logger.warning("first rounds: the kept answer of %s does not open; its resend is refused", round_id)
            return {"k": "consumed"}

    def _seal_text(self, kind: str, round_id: str, text: str) -> str:
        """`text` sealed with the server's key ring, bound to its round and kind (as it is without one)."""
        seal = self.guard.seal
        codec = None if seal is None else seal.codec
        if codec is None:
            return text
        return codec.seal(json.dumps({"k": kind, "r": round_id, "o": text}, separators=(",", ":")).encode())

    def _open_text(self, kind: str, round_id: str, stored: str) -> str:
        seal = self.guard.seal
        codec = None if seal is None else seal.codec
        if codec is None:
            return stored  # kept in plain text (`seal_at_rest=False`)
        sealed = json.loads(codec.unseal(stored))
        if not isinstance(sealed, dict) or sealed.get("k") != kind or sealed.get("r") != round_id:
            raise InvalidRequestState("not this call's record")
        text: str = sealed["o"]
        return text


def _call_id(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:44]


def _flow_id(call_id: str) -> str:
    """The flow id of a joined call: derived from its identity (12 bytes, as a random one)."""
    raw = hashlib.sha256(f"mrtr/flow\0{call_id}".encode()).digest()[:12]
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _body_digest(round: Round) -> str:
    body = json.dumps(
        [round.method, round.target, round.arguments],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=str,
    )
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["DEFAULT_REQUEST_ID_HEADER", "IN_FLIGHT", "PRINCIPAL_WINDOW", "REUSED", "TAKEN_OVER", "FirstRounds"]
