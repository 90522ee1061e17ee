"""`RedisBus`: listen events across a fleet over Redis pub/sub (one channel, `<prefix>bus`).

Each batch of events goes out as one pipeline of `PUBLISH` commands: one round trip, and each
event stays one message (receivers of any mrtr version read it).

Pub/sub keeps no history, and Redis cuts a subscriber whose output buffer overflows, so a
message past `max_inline` (256 KiB by default) is stored under `<prefix>bus:ref:*` for
`ref_ttl` seconds and sent by reference. The subscriber learns of every (re)subscription
from Redis's own `subscribe` confirmation, also when redis-py reconnects by itself, so no
reconnect goes by without a `BusGap`.

On a Redis Cluster (`redis+cluster://...`) classic `PUBLISH` is broadcast to every node over
the cluster bus; the bus uses sharded pub/sub instead (Redis 7: `SPUBLISH`/`SSUBSCRIBE`), over
`shards` channels `{<prefix>bus:NN.j}` whose slots spread over the primaries. Each instance
publishes on one channel, picked by its origin id, so its messages keep their order (receivers
check each sender's sequence numbers); every subscriber subscribes to all the channels, one
connection per primary that serves some of them, and so hears each message exactly once. When
a channel's slot moves (a failover, a resharding) Redis unsubscribes its listeners; the
subscriber then resolves the slot map afresh and resubscribes, which is reported as a `BusGap`
like any reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import zlib
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from mrtr._redisclient import client, is_cluster, shard_tags
from mrtr.buses._base import BrokerBus

DEFAULT_CHANNELS = 16
"""Sharded channels of a bus on a Redis Cluster (`RedisBus(channels=)`): every instance must agree."""


class RedisBus(BrokerBus):
    """A `SubscriptionBus` for every instance that shares this Redis (node or cluster) and `prefix`."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "mrtr:",
        channels: int = DEFAULT_CHANNELS,
        **options: Any,
    ) -> None:
        options.setdefault("max_inline", 256 * 1024)
        super().__init__(**options)
        self.url = url
        self.cluster = is_cluster(url)
        self.channel = f"{prefix}bus"
        self.channels: tuple[str, ...] = (self.channel,)
        if self.cluster:
            self.channels = shard_tags(f"{prefix}bus:", channels)
            self.channel = self.channels[zlib.crc32(self.origin.encode()) % len(self.channels)]
        self._ref_prefix = f"{prefix}bus:ref:"
        self._client: Any = None

    async def _publisher(self) -> Any:
        if self._client is None:
            self._client = client(self.url, socket_connect_timeout=2, socket_timeout=5)
            if self.cluster:
                await self._client.initialize()
        return self._client

    async def _send(self, wire: str) -> None:
        publisher = await self._publisher()
        if self.cluster:
            await publisher.spublish(self.channel, wire)
        else:
            await publisher.publish(self.channel, wire)

    async def _send_batch(self, wires: list[str]) -> None:
        """One round trip for the whole batch: a pipeline of `PUBLISH`es (no transaction, order kept)."""
        if len(wires) == 1:
            await self._send(wires[0])
            return
        async with (await self._publisher()).pipeline(transaction=False) as pipe:
            for wire in wires:
                if self.cluster:
                    pipe.spublish(self.channel, wire)
                else:
                    pipe.publish(self.channel, wire)
            await pipe.execute()

    async def _put_ref(self, text: str) -> str:
        ref = f"{self.origin}:{secrets.token_hex(8)}"
        await (await self._publisher()).set(self._ref_prefix + ref, text, px=int(self.ref_ttl * 1000))
        return ref

    async def _get_ref(self, ref: str) -> str | None:
        value = await (await self._publisher()).get(self._ref_prefix + ref)
        return None if value is None else value.decode() if isinstance(value, bytes) else str(value)

    def _messages(self) -> AsyncIterator[str | None]:
        return self._sharded_messages() if self.cluster else self._plain_messages()

    async def _plain_messages(self) -> AsyncIterator[str | None]:
        client = aioredis.Redis.from_url(self.url, socket_connect_timeout=2, decode_responses=True)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    yield None
                elif message["type"] == "message":
                    yield message["data"]
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves PubSub.aclose unannotated
            await client.aclose()

    async def _sharded_messages(self) -> AsyncIterator[str | None]:
        """Every channel's messages, through one subscription per primary; `None` once all are subscribed.

        Anything that disturbs a subscription (a lost connection, a slot that moved, a resubscription
        redis-py made by itself) ends this generator with an error: the caller resubscribes from a
        fresh slot map and reports the gap.
        """
        cluster: Any = client(self.url, socket_connect_timeout=2, decode_responses=True)
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        pumps: list[asyncio.Task[None]] = []
        try:
            await cluster.initialize()
            by_node: dict[tuple[str, int], list[str]] = {}
            for channel in self.channels:
                node = cluster.get_node_from_key(channel)
                by_node.setdefault((node.host, node.port), []).append(channel)
            loop = asyncio.get_running_loop()
            pumps = [loop.create_task(self._pump(host, port, chans, queue)) for (host, port), chans in by_node.items()]
            waiting = len(by_node)
            while True:
                kind, value = await queue.get()
                if kind == "error":
                    raise value
                if kind == "ready":
                    waiting -= 1
                    if waiting == 0:
                        yield None
                    continue
                yield value
        finally:
            for pump in pumps:
                pump.cancel()
            for pump in pumps:
                with contextlib.suppress(BaseException):
                    await pump
            await cluster.aclose()

    async def _pump(self, host: str, port: int, channels: list[str], queue: asyncio.Queue[tuple[str, Any]]) -> None:
        """One primary's subscription: its channels' messages into `queue`, then an error when it is disturbed."""
        node = aioredis.Redis(host=host, port=port, socket_connect_timeout=2, decode_responses=True)
        pubsub = node.pubsub()
        try:
            for channel in channels:  # one slot per SSUBSCRIBE
                await pubsub.ssubscribe(channel)
            confirmed = 0
            async for message in pubsub.listen():
                kind = message["type"]
                if kind == "smessage":
                    queue.put_nowait(("message", message["data"]))
                elif kind == "ssubscribe":
                    confirmed += 1
                    if confirmed == len(channels):
                        queue.put_nowait(("ready", None))
                    elif confirmed > len(channels):
                        raise ConnectionError(f"resubscribed to {host}:{port} after a reconnect")
                elif kind == "sunsubscribe":
                    raise ConnectionError(f"channel {message['channel']!r} moved away from {host}:{port}")
            raise ConnectionError(f"{host}:{port} ended the subscription")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            queue.put_nowait(("error", exc))
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves PubSub.aclose unannotated
            with contextlib.suppress(Exception):
                await node.aclose()

    async def _reset_publisher(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _close_backend(self) -> None:
        await self._reset_publisher()


__all__ = ["DEFAULT_CHANNELS", "RedisBus"]
