"""`RedisBus`: listen events across a fleet over Redis pub/sub (one channel, `<prefix>bus`).

Each batch of events goes out as one pipeline of `PUBLISH` commands: one round trip, and each
event stays one message (receivers of any mrtr version read it).

Pub/sub keeps no history, and Redis cuts a subscriber whose output buffer overflows, so a
message past `max_inline` (256 KiB by default) is stored under `<prefix>bus:ref:*` for
`ref_ttl` seconds and sent by reference. The subscriber learns of every (re)subscription
from Redis's own `subscribe` confirmation, also when redis-py reconnects by itself, so no
reconnect goes by without a `BusGap`.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from mrtr.buses._base import BrokerBus


class RedisBus(BrokerBus):
    """A `SubscriptionBus` for every instance that shares this Redis and `prefix`."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "mrtr:", **options: Any) -> None:
        options.setdefault("max_inline", 256 * 1024)
        super().__init__(**options)
        self.url = url
        self.channel = f"{prefix}bus"
        self._ref_prefix = f"{prefix}bus:ref:"
        self._client: aioredis.Redis | None = None

    def _publisher(self) -> aioredis.Redis:
        if self._client is None:
            self._client = aioredis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=5)
        return self._client

    async def _send(self, wire: str) -> None:
        await self._publisher().publish(self.channel, wire)

    async def _send_batch(self, wires: list[str]) -> None:
        """One round trip for the whole batch: a pipeline of `PUBLISH`es (no transaction, order kept)."""
        if len(wires) == 1:
            await self._send(wires[0])
            return
        async with self._publisher().pipeline(transaction=False) as pipe:
            for wire in wires:
                pipe.publish(self.channel, wire)
            await pipe.execute()

    async def _put_ref(self, text: str) -> str:
        ref = f"{self.origin}:{secrets.token_hex(8)}"
        await self._publisher().set(self._ref_prefix + ref, text, px=int(self.ref_ttl * 1000))
        return ref

    async def _get_ref(self, ref: str) -> str | None:
        value = await self._publisher().get(self._ref_prefix + ref)
        return None if value is None else value.decode() if isinstance(value, bytes) else str(value)

    async def _messages(self) -> AsyncIterator[str | None]:
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

    async def _reset_publisher(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _close_backend(self) -> None:
        await self._reset_publisher()


__all__ = ["RedisBus"]
