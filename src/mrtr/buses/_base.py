"""`BrokerBus`: the SDK's `SubscriptionBus` over a broker every instance of a fleet shares.

The SDK serves `subscriptions/listen` from a bus of typed events; its default one lives in a
single process, so an event raised on instance A never reaches a stream held by instance B.
A broker bus does what the SDK's protocol docstring asks of a multi-replica bus:

- `publish` hands the event to this instance's listeners at once (as the in-memory bus does)
  and queues it for the broker; a background sender writes the queue out in batches: every
  event queued since the last round trip goes in the next one (a Redis pipeline, one
  PostgreSQL statement), so a busy event loop that wakes the sender rarely still keeps up.
- a background subscriber hands every event that arrives from the broker to this instance's
  listeners, except those this instance sent itself (already delivered): every listener on
  every instance sees each event exactly once while the broker is up.
- a message too large for the broker inline (PostgreSQL `NOTIFY` caps payloads at 8,000
  bytes) is stored beside it and sent by reference; receivers fetch it. Nothing is dropped
  for its size.
- the outbox is bounded in count (`max_outbox`) and in age (`max_outbox_age`): a burst is
  absorbed, a real outage is still bounded. Before it drops anything while the broker
  answers, `publish` waits (at most `max_publish_wait`) for the sender to catch up: the
  producers of events slow down before any event is lost. Each listen stream bounds its own
  backlog (the listen handler's `max_buffered_events`).
- no loss is silent. Every message carries its sender's sequence number. Events dropped from
  the outbox are counted (`dropped`, the `mrtr.bus.dropped` metric, by reason:
  `broker_unreachable` or `publisher_behind`, also named in the log) and the sender's next
  message is a *loss notice* naming the tasks, URIs and lists they were about: receivers
  raise a `BusGap` that says so, and only the listen streams watching one of them refetch.
  A gap in a sender's numbers that no notice explains (lost in transit) raises a `BusGap`
  that knows nothing, as a reconnect does: streams end, clients re-listen and refetch.
- after losing the broker the subscriber reconnects with bounded, jittered backoff, and then
  tells its listeners `BusGap`: events published meanwhile may be lost (pub/sub keeps no
  history), so mrtr's listen handler ends its streams and clients re-listen and refetch.

Backends (`RedisBus`, `PostgresBus`) only move text: `_send_batch` (or `_send`),
`_put_ref`/`_get_ref`, and `_messages` (one subscription's messages, `None` each time it is
(re)established).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from mrtr._backoff import equal_jitter
from mrtr._telemetry import metrics
from mrtr.buses._events import BusGap, dumps, event_body, event_from_body, gap_from_notice, lost_key

logger = logging.getLogger("mrtr.buses")

Listener = Callable[[Any], None]
_CLOSE_WAIT = 2.0  # seconds closing may wait for the background tasks, then for the connections
_MAX_LOST = 256  # distinct things one loss notice names; past that it says "everything"
_MAX_ORIGINS = 4096  # senders whose last sequence number a receiver remembers
_LOG_EVERY = 10.0  # seconds between two warnings about the same kind of trouble

BROKER_UNREACHABLE = "broker_unreachable"
PUBLISHER_BEHIND = "publisher_behind"


@dataclass(slots=True)
class _Queued:
    n: int
    text: str
    key: tuple[str, str]
    at: float


class BrokerBus:
    """Fan-out across instances through a broker (see the module docstring).

    Args:
        max_inline: Largest message (UTF-8 bytes) the broker carries inline; larger ones go by reference.
        max_outbox: Most events queued for the broker; past it the oldest are dropped (and announced).
        max_outbox_age: Seconds an event may wait for the broker; older ones are dropped (and announced).
            A listener refetching is told the state of now, which beats hearing of one that old.
        max_publish_wait: Most seconds `publish` waits for room while the outbox is past half its
            bounds and the broker answers (back-pressure before loss); 0 never waits.
        max_batch: Most events in one round trip to the broker.
        ref_ttl: Seconds a by-reference payload stays fetchable.
        max_backoff: Cap on the wait between reconnect attempts, in seconds.
    """

    channel: str
    """Where this instance publishes on the broker (a Redis channel, a PostgreSQL `NOTIFY` channel), for logs."""

    def __init__(
        self,
        *,
        max_inline: int,
        max_outbox: int = 10_000,
        max_outbox_age: float = 5.0,
        max_publish_wait: float = 1.0,
        max_batch: int = 256,
        ref_ttl: float = 300.0,
        max_backoff: float = 2.0,
    ) -> None:
        if max_outbox < 1 or max_batch < 1:
            raise ValueError("max_outbox and max_batch must be at least 1")
        self.origin = secrets.token_hex(8)
        """This bus instance's id on the broker: its own messages come back and are skipped."""
        self.max_inline = max_inline
        self.max_outbox = max_outbox
        self.max_outbox_age = max_outbox_age
        self.max_publish_wait = max_publish_wait
        self.max_batch = max_batch
        self.ref_ttl = ref_ttl
        self.max_backoff = max_backoff
        self.published = 0
        """Events queued for the broker."""
        self.sent = 0
        """Events the broker accepted."""
        self.batches = 0
        """Round trips that carried them."""
        self.dropped = 0
        """Events dropped from the outbox (`dropped_by` splits them by reason)."""
        self.dropped_by: dict[str, int] = {BROKER_UNREACHABLE: 0, PUBLISHER_BEHIND: 0}
        self.waited = 0
        """Publishes that waited for room (back-pressure)."""
        self.gaps = 0
        """Times this instance's listeners were told `BusGap` (`gaps_by` splits them by reason)."""
        self.gaps_by: dict[str, int] = {"resubscribed": 0, "dropped": 0, "lost": 0}
        self._seq = itertools.count(1)
        self._listeners: dict[object, Listener] = {}
        self._outbox: deque[_Queued] = deque()
        self._lost: dict[tuple[str, str], None] = {}  # what dropped events were about (an ordered set)
        self._lost_all = False
        self._lost_upto = 0  # the newest sequence number dropped and not yet announced
        self._failures = 0  # consecutive failed round trips to the broker
        self._last_error = ""
        self._last_trip = (0.0, 0)  # seconds and events of the last successful round trip
        self._logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}
        self._last_seq: dict[str, int] = {}  # sender origin -> the newest sequence number received
        self._lags: deque[float] = deque(maxlen=10_000)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._ready = asyncio.Event()
        self._closed = False

    # -- the SDK's SubscriptionBus protocol ---------------------------------------------

    async def publish(self, event: Any) -> None:
        """Deliver `event` to this instance's listeners now, and to every other instance's via the broker.

        Returns at once, unless the sender is behind while the broker answers: then it waits
        (at most `max_publish_wait`) for room, so the producers slow down before events drop.
        """
        self._deliver(event)
        body = event_body(event)
        if body is not None and not self._closed:
            self._ensure_running()
            self._enqueue(body)
            if self.max_publish_wait > 0 and self._behind():
                self.waited += 1
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), self.max_publish_wait)
        await asyncio.sleep(0)  # as the SDK's bus: let listen streams drain between bursts

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Register `listener` (called on the event loop, must not raise); returns an idempotent unsubscribe."""
        self._ensure_running()
        token = object()
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, timeout: float = 10.0) -> None:
        """Connect now and wait until the broker subscription is live (else `TimeoutError`).

        Optional: the bus also starts on first use. Starting it with the app means the first
        listen stream never waits for the subscription.
        """
        self._closed = False
        self._ensure_running()
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def ready(self, timeout: float) -> bool:
        """Whether the broker subscription is live, waiting up to `timeout` seconds for it."""
        self._ensure_running()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self._ready.is_set()

    async def close(self) -> None:
        """Stop sending and listening (queued events are not flushed) and close the connections.

        Bounded (`_CLOSE_WAIT` per part): a connection to a broker that stopped answering must
        not hold up an instance's shutdown.
        """
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_WAIT)
        self._room.set()  # nobody waits for a sender that is gone
        try:
            await asyncio.wait_for(self._close_backend(), _CLOSE_WAIT)
        except Exception as exc:  # TimeoutError included: the process is leaving the broker anyway
            logger.warning("bus: closing the broker connections failed (%s)", exc)

    async def __aenter__(self) -> BrokerBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> dict[str, Any]:
        """Counters and the outbox's state now, for operators and tests (the metrics say the same)."""
        oldest = time.monotonic() - self._outbox[0].at if self._outbox else 0.0
        return {
            "published": self.published,
            "sent": self.sent,
            "batches": self.batches,
            "waited": self.waited,
            "dropped": self.dropped,
            "dropped_by": dict(self.dropped_by),
            "gaps": self.gaps,
            "gaps_by": dict(self.gaps_by),
            "queued": len(self._outbox),
            "oldest_queued": oldest,
            "listeners": len(self._listeners),
        }

    # -- backend seam --------------------------------------------------------------------

    async def _send(self, wire: str) -> None:
        raise NotImplementedError

    async def _send_batch(self, wires: list[str]) -> None:
        """Send `wires` in this order; backends override it with one round trip for all."""
        for wire in wires:
            await self._send(wire)

    async def _put_ref(self, text: str) -> str:
        raise NotImplementedError

    async def _get_ref(self, ref: str) -> str | None:
        raise NotImplementedError

    def _messages(self) -> AsyncIterator[str | None]:
        raise NotImplementedError

    async def _reset_publisher(self) -> None:
        """Drop the publishing connection after a failure, so the next send reconnects."""

    async def _close_backend(self) -> None:
        """Close every connection."""

    # -- machinery -----------------------------------------------------------------------

    def _ensure_running(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on a loop yet: started at the first use that is
        if self._closed:
            return
        if self._loop is not loop:  # first use, or a new event loop (tests): start afresh on this one
            self._loop = loop
            self._wake, self._room, self._ready = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self._tasks = []
        if not self._tasks or any(task.done() for task in self._tasks):
            for task in self._tasks:
                task.cancel()
            self._tasks = [loop.create_task(self._send_forever()), loop.create_task(self._listen_forever())]
            if self._outbox:
                self._wake.set()

    def _deliver(self, event: Any) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # fan-out boundary: one bad listener must not starve the others
                logger.exception("subscription listener raised; continuing")

    # -- sending -------------------------------------------------------------------------

    def _enqueue(self, body: dict[str, Any]) -> None:
        n = next(self._seq)
        now = time.monotonic()
        stamped = {"o": self.origin, "n": n, "t": round(time.time(), 6), **body}  # "t": receivers measure the lag
        self._outbox.append(_Queued(n, dumps(stamped), lost_key(body), now))
        self.published += 1
        self._trim(now)
        self._wake.set()

    def _behind(self) -> bool:
        """Past half of either bound while the broker answers: time for back-pressure."""
        if self._failures or not self._outbox:
            return False  # a broker that failed the last round trip is not waited for: requests must not stall
        age = time.monotonic() - self._outbox[0].at
        return len(self._outbox) * 2 >= self.max_outbox or age * 2 >= self.max_outbox_age

    def _trim(self, now: float) -> None:
        """Drop the oldest events past either bound, and any older than one dropped already."""
        outbox = self._outbox
        while outbox and (
            len(outbox) > self.max_outbox
            or now - outbox[0].at > self.max_outbox_age
            or outbox[0].n < self._lost_upto  # requeued after a failed send, older than a dropped one
        ):
            self._drop(outbox.popleft())

    def _drop(self, queued: _Queued) -> None:
        reason = BROKER_UNREACHABLE if self._failures else PUBLISHER_BEHIND
        self.dropped += 1
        self.dropped_by[reason] += 1
        self._lost_upto = max(self._lost_upto, queued.n)
        if self._lost_all or len(self._lost) >= _MAX_LOST:
            self._lost_all = True
        else:
            self._lost[queued.key] = None
        metrics.bus_dropped(reason)
        if self._should_log(reason):
            count = self._unlogged.pop(reason, 0)
            bound = f"{self.max_outbox} events or {self.max_outbox_age:g} s"
            if reason == BROKER_UNREACHABLE:
                logger.warning(
                    "bus: dropped %d events (%d in all): the broker is unreachable (%s), so the outbox went past "
                    "its bound (%s); listeners on other instances are told to refetch",
                    count,
                    self.dropped,
                    self._last_error,
                    bound,
                )
            else:
                seconds, events = self._last_trip
                logger.warning(
                    "bus: dropped %d events (%d in all): the publisher is behind while the broker answers (%d "
                    "queued past the bound of %s; its last round trip took %.1f ms for %d events); listeners on "
                    "other instances are told to refetch",
                    count,
                    self.dropped,
                    len(self._outbox) + 1,
                    bound,
                    seconds * 1e3,
                    events,
                )

    def _should_log(self, kind: str) -> bool:
        """Rate-limits warnings: each kind at most once per `_LOG_EVERY` (the rest are counted)."""
        self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(kind, -math.inf) < _LOG_EVERY:
            return False
        self._logged[kind] = now
        return True

    def _notice(self) -> str | None:
        """The loss notice owed before the next events (None if nothing was dropped since the last one)."""
        if not self._lost_upto or (not self._lost and not self._lost_all):
            return None
        lost: Any = "*"
        if not self._lost_all:
            grouped: dict[str, list[str]] = {"t": [], "u": [], "l": []}
            for kind, name in self._lost:
                grouped[kind].append(name)
            lost = {kind: names for kind, names in grouped.items() if names}
        # Numbered as the newest dropped event: receivers know it explains the numbers skipped.
        return dumps({"o": self.origin, "n": self._lost_upto, "lost": lost})

    def _backoff(self, failures: int) -> float:
        return equal_jitter(failures, 0.05, self.max_backoff)

    async def _send_forever(self) -> None:
        while True:
            self._trim(time.monotonic())
            notice = self._notice()
            if not self._outbox and notice is None:
                self._room.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            announced = self._lost_upto
            batch = [self._outbox.popleft() for _ in range(min(self.max_batch, len(self._outbox)))]
            wires = [notice] if notice is not None else []
            wires += [queued.text for queued in batch]
            started = time.monotonic()
            try:
                await self._send_batch([await self._inline(wire) for wire in wires])
            except asyncio.CancelledError:
                self._outbox.extendleft(reversed(batch))
                raise
            except Exception as exc:
                self._failures += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
                self._outbox.extendleft(reversed(batch))  # in order, at the front: sent again, or dropped
                self._trim(time.monotonic())
                self._room.set()  # back-pressure cannot help while the broker is away
                if self._failures == 1 or self._failures % 50 == 0:
                    logger.warning("bus: cannot publish to the broker (%s); retrying", exc)
                await self._reset_publisher()
                await asyncio.sleep(self._backoff(self._failures))
                continue
            self._failures = 0
            self._last_trip = (time.monotonic() - started, len(wires))
            self.sent += len(batch)
            self.batches += 1
            if notice is not None and self._lost_upto == announced:
                self._lost.clear()  # announced; anything dropped meanwhile is announced next time
                self._lost_all = False
            if not self._behind():
                self._room.set()

    async def _inline(self, wire: str) -> str:
        """`wire`, or a reference to it stored beside the broker when it is too large to go inline."""
        if len(wire.encode()) <= self.max_inline:
            return wire
        head = json.loads(wire)
        return dumps({"o": self.origin, "n": head.get("n"), "r": await self._put_ref(wire)})

    # -- receiving -----------------------------------------------------------------------

    async def _listen_forever(self) -> None:
        subscribed_before = False
        failures = 0
        while True:
            try:
                async for raw in self._messages():
                    if raw is None:  # (re)subscribed
                        self._last_seq.clear()  # numbers start afresh: the gap is reported below
                        if subscribed_before:
                            logger.warning("bus: broker subscription re-established; listeners refetch")
                            self._gap(BusGap())
                        subscribed_before = True
                        failures = 0
                        self._ready.set()
                        continue
                    await self._receive(raw)
                raise ConnectionError("the broker ended the subscription")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._ready.clear()
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    logger.warning("bus: lost the broker subscription (%s); reconnecting", exc)
            await asyncio.sleep(self._backoff(failures))

    def _gap(self, gap: BusGap) -> None:
        self.gaps += 1
        self.gaps_by[gap.reason] = self.gaps_by.get(gap.reason, 0) + 1
        metrics.bus_gap(gap.reason)
        self._deliver(gap)

    async def _receive(self, raw: str) -> None:
        try:
            message = json.loads(raw)
            if not isinstance(message, dict) or message.get("o") == self.origin:
                return  # not ours to read, or delivered here already when it was published
            origin, n = message.get("o"), message.get("n")
            if isinstance(origin, str) and isinstance(n, int) and n <= self._last_seq.get(origin, 0):
                return  # sent again after a round trip that failed half-way: delivered already
            if "r" in message:
                text = await self._get_ref(str(message["r"]))
                if text is None:
                    logger.warning("bus: a by-reference event expired before it was fetched")
                    return
                message = json.loads(text)
            if isinstance(origin, str) and isinstance(n, int):
                self._check_sequence(origin, n, notice="lost" in message)
            if "lost" in message:
                if self._should_log("notice"):
                    logger.warning(
                        "bus: instance %s dropped events before the broker had them; the listeners they concern "
                        "refetch (%d such notices in the last %g s)",
                        origin,
                        self._unlogged.pop("notice", 0),
                        _LOG_EVERY,
                    )
                self._gap(gap_from_notice(message["lost"]))
                return
            event = event_from_body(message)
        except (ValueError, TypeError) as exc:
            logger.warning("bus: ignored a message that is not an event (%s)", exc)
            return
        if event is None:
            logger.debug("bus: ignored an event of a kind this version does not know: %r", raw[:80])
            return
        sent_at = message.get("t")
        if isinstance(sent_at, float | int):
            lag = max(time.time() - sent_at, 0.0)
            self._lags.append(lag)
            metrics.bus_lag(lag)
        self._deliver(event)

    def drain_lags(self) -> list[float]:
        """Seconds from `publish` on another instance to delivery here, of the events received since
        the last call (at most the last 10,000). Wall clocks: exact on one host; across hosts
        the clocks' skew is in it."""
        lags = list(self._lags)
        self._lags.clear()
        return lags

    def _check_sequence(self, origin: str, n: int, *, notice: bool) -> None:
        """Remember `origin`'s newest number; numbers skipped that no loss notice explains were lost."""
        last = self._last_seq.pop(origin, None)
        self._last_seq[origin] = n  # re-inserted: the dict is kept in order of recent use
        if len(self._last_seq) > _MAX_ORIGINS:
            del self._last_seq[next(iter(self._last_seq))]
        if last is not None and n > last + 1 and not notice:
            if self._should_log("lost"):
                logger.warning(
                    "bus: %d events from instance %s never arrived (lost in transit); every listener here refetches",
                    n - last - 1,
                    origin,
                )
            self._gap(BusGap(reason="lost"))


__all__ = ["BROKER_UNREACHABLE", "PUBLISHER_BEHIND", "BrokerBus", "Listener"]
