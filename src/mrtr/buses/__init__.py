"""Listen events across a fleet: the SDK's `SubscriptionBus` over Redis or PostgreSQL.

    server = MCPServer("app", subscriptions=mrtr.open_bus("redis://cache:6379/0"))
    ...                                  # ctx.notify_resource_updated(uri) on any instance
    # reaches every `subscriptions/listen` stream that asked for `uri`, on every instance.

`base` holds what both share (local fan-out, outbox, reconnects, by-reference payloads),
`events` the wire form of events (mrtr adds `TaskChanged` and `BusGap`), `redis` and
`postgres` the brokers. Their drivers load only when a bus of that kind is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mrtr.buses._base import BrokerBus
from mrtr.buses._events import BusGap, TaskChanged

if TYPE_CHECKING:  # imported lazily below; named here for type checkers and the API reference
    from mrtr.buses._postgres import PostgresBus
    from mrtr.buses._redis import RedisBus


def open_bus(url: str, *, namespace: str | None = None, **options: Any) -> BrokerBus:
    """A fleet bus from a URL, the same URLs as `mrtr.open_store`.

    `redis://...` / `rediss://...` (Redis pub/sub on `<namespace>:bus`, default `mrtr:bus`),
    `redis+cluster://host:port[,...]` (sharded pub/sub on a Redis Cluster, see `RedisBus`) or
    `postgresql://...` / `postgres://...` (`LISTEN`/`NOTIFY` on `<namespace>_bus`, default
    `mrtr_bus`, which is also the table of by-reference payloads). `options` go to the bus
    (`max_outbox`, `max_outbox_age`, `max_publish_wait`, `max_batch`, `max_inline`, `ref_ttl`,
    `max_backoff`). A SQLite store is one machine:
    its servers need no fleet bus (the SDK's in-memory default serves them).
    """
    if url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
        from mrtr.buses._redis import RedisBus

        return RedisBus(url, prefix=f"{namespace}:" if namespace else "mrtr:", **options)
    if url.startswith(("postgresql://", "postgres://")):
        from mrtr.buses._postgres import PostgresBus

        return PostgresBus(url, table=f"{namespace}_bus" if namespace else "mrtr_bus", **options)
    raise ValueError(
        f"unknown bus URL {url!r}: expected redis://..., redis+cluster://... or postgresql://... "
        "(one machine needs no fleet bus: leave MCPServer's default in-memory bus)"
    )


def __getattr__(name: str) -> Any:
    if name == "RedisBus":
        from mrtr.buses._redis import RedisBus

        return RedisBus
    if name == "PostgresBus":
        from mrtr.buses._postgres import PostgresBus

        return PostgresBus
    raise AttributeError(name)


__all__ = ["BrokerBus", "BusGap", "PostgresBus", "RedisBus", "TaskChanged", "open_bus"]
