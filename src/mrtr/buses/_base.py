"""`BrokerBus`: the SDK's `SubscriptionBus` over a broker every instance of a fleet shares.

The SDK serves `subscriptions/listen` from a bus of typed events; its default one lives in a
single process, so an event raised on instance A never reaches a stream held by instance B.
A broker bus does what the SDK's protocol docstring asks of a multi-replica bus:

- `publish` hands the event to this instance's listeners at once (as the in-memory bus does)
  and queues it for the broker; a background sender writes the queue out. Publishing never
  waits on the broker, so a slow or restarting broker never stalls a request.
- a background subscriber hands every event that arrives from the broker to this instance's
  listeners, except those this instance sent itself (already delivered): every listener on
  every instance sees each event exactly once while the broker is up.
- a message too large for the broker inline (PostgreSQL `NOTIFY` caps payloads at 8,000
  bytes) is stored beside it and sent by reference; receivers fetch it. Nothing is dropped
  for its size.
- buffers are bounded: the outbox keeps the newest `max_outbox` events while the broker is
  unreachable (older ones are dropped and counted in `dropped`); each listen stream bounds
  its own backlog (the listen handler's `max_buffered_events`).
- after losing the broker the subscriber reconnects with bounded, jittered backoff, and then
  tells its listeners `BusGap`: events published meanwhile may be lost (pub/sub keeps no
  history), so mrtr's listen handler ends its streams and clients re-listen and refetch.

Backends (`RedisBus`, `PostgresBus`) only move text: `_send`, `_put_ref`/`_get_ref`, and
`_messages` (one subscription's messages, `None` each time it is (re)established).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from mrtr._backoff import equal_jitter
from mrtr.buses._events import BusGap, dumps, event_body, event_from_body

logger = logging.getLogger("mrtr.buses")

Listener = Callable[[Any], None]
_CLOSE_WAIT = 2.0  # seconds closing may wait for the background tasks, then for the connections


class BrokerBus:
    """Fan-out across instances through a broker (see the module docstring).

    Args:
        max_inline: Largest message (UTF-8 bytes) the broker carries inline; larger ones go by reference.
        max_outbox: Events kept for the broker while it is unreachable (newest win).
        ref_ttl: Seconds a by-reference payload stays fetchable.
        max_backoff: Cap on the wait between reconnect attempts, in seconds.
    """

    def __init__(
        self, *, max_inline: int, max_outbox: int = 1024, ref_ttl: float = 300.0, max_backoff: float = 2.0
    ) -> None:
        self.origin = secrets.token_hex(8)
        """This bus instance's id on the broker: its own messages come back and are skipped."""
        self.max_inline = max_inline
        self.max_outbox = max_outbox
        self.ref_ttl = ref_ttl
        self.max_backoff = max_backoff
        self.dropped = 0
        """Events dropped from a full outbox (the broker was unreachable for a while)."""
        self.gaps = 0
        """Reconnects after which listeners were told `BusGap`."""
        self._seq = itertools.count(1)
        self._listeners: dict[object, Listener] = {}
        self._outbox: deque[str] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._closed = False

    # -- the SDK's SubscriptionBus protocol ---------------------------------------------

    async def publish(self, event: Any) -> None:
        """Deliver `event` to this instance's listeners now, and to every other instance's via the broker."""
        self._deliver(event)
        body = event_body(event)
        if body is not None and not self._closed:
            self._ensure_running()
            self._enqueue(body)
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
        try:
            await asyncio.wait_for(self._close_backend(), _CLOSE_WAIT)
        except Exception as exc:  # TimeoutError included: the process is leaving the broker anyway
            logger.warning("bus: closing the broker connections failed (%s)", exc)

    async def __aenter__(self) -> BrokerBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- backend seam --------------------------------------------------------------------

    async def _send(self, wire: str) -> None:
        raise NotImplementedError

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
            self._wake, self._ready = asyncio.Event(), asyncio.Event()
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

    def _enqueue(self, body: dict[str, Any]) -> None:
        text = dumps({"o": self.origin, "n": next(self._seq), **body})
        if len(self._outbox) >= self.max_outbox:
            self._outbox.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("bus outbox full (broker unreachable?): %d events dropped so far", self.dropped)
        self._outbox.append(text)
        self._wake.set()

    def _backoff(self, failures: int) -> float:
        return equal_jitter(failures, 0.05, self.max_backoff)

    async def _send_forever(self) -> None:
        failures = 0
        while True:
            if not self._outbox:
                self._wake.clear()
                await self._wake.wait()
                continue
            text = self._outbox[0]
            try:
                wire = text
                if len(text.encode()) > self.max_inline:
                    wire = dumps({"o": self.origin, "r": await self._put_ref(text)})
                await self._send(wire)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    logger.warning("bus: cannot publish to the broker (%s); retrying", exc)
                await self._reset_publisher()
                await asyncio.sleep(self._backoff(failures))
                continue
            failures = 0
            if self._outbox and self._outbox[0] is text:  # unless a full outbox dropped it meanwhile
                self._outbox.popleft()

    async def _listen_forever(self) -> None:
        subscribed_before = False
        failures = 0
        while True:
            try:
                async for raw in self._messages():
                    if raw is None:  # (re)subscribed
                        if subscribed_before:
                            self.gaps += 1
                            logger.warning("bus: broker subscription re-established; listeners refetch")
                            self._deliver(BusGap())
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

    async def _receive(self, raw: str) -> None:
        try:
            message = json.loads(raw)
            if not isinstance(message, dict) or message.get("o") == self.origin:
                return  # not ours to read, or delivered here already when it was published
            if "r" in message:
                text = await self._get_ref(str(message["r"]))
                if text is None:
                    logger.warning("bus: a by-reference event expired before it was fetched")
                    return
                message = json.loads(text)
            event = event_from_body(message)
        except (ValueError, TypeError) as exc:
            logger.warning("bus: ignored a message that is not an event (%s)", exc)
            return
        if event is None:
            logger.debug("bus: ignored an event of a kind this version does not know: %r", raw[:80])
            return
        self._deliver(event)


__all__ = ["BrokerBus", "Listener"]
