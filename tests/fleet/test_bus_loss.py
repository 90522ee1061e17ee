"""Issue 40 on the real brokers: batched publishing, back-pressure before loss, and no silent loss.

- A burst goes out in a few round trips, and every listener elsewhere still gets each event
  once, in order.
- A sequential producer that outruns the sender waits for it instead of losing events.
- Events a sender must drop are counted (`dropped_by`, `mrtr.bus.dropped` by reason, a log
  line naming the cause) and announced: the receivers' listeners get a `BusGap` naming exactly
  the tasks and URIs they were about, then the events that were kept.
- A sender's numbers that skip with no notice (lost in transit) tell every listener that
  anything may be missing; a message sent twice (a round trip retried) is delivered once.
- A listen stream refetches for a gap that concerns it (without ending), ignores one that does
  not, and ends for one that knows nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import SubscriptionFilter, SubscriptionsListenRequestParams
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import mrtr
from mrtr.buses import BrokerBus, BusGap, TaskChanged
from mrtr.metrics import use_meter_provider
from mrtr.tasks._listen import ListenHandler
from tests.fleet.test_buses import buses, until
from tests.support.markers import backends
from tests.support.storekit import POSTGRES_DSN, REDIS_URL

# alone: a sender outrun on purpose (make test runs it with nothing beside it)
pytestmark = [pytest.mark.anyio, pytest.mark.in_process, pytest.mark.alone]  # unless marked otherwise

KINDS = backends("redis", "redis-cluster", "postgres")


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    use_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        yield reader
    finally:
        use_meter_provider(None)


def counted(reader: InMemoryMetricReader, name: str) -> dict[str, int]:
    """The counter `name`'s totals by `mrtr.reason`."""
    data = reader.get_metrics_data()
    totals: dict[str, int] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        totals[str(point.attributes["mrtr.reason"])] = int(point.value)  # type: ignore[index, attr-defined]
    return totals


def task(n: int) -> TaskChanged:
    return TaskChanged(task_id=f"t{n}", task={"taskId": f"t{n}", "status": "working"}, version=n)


async def raw_publish(kind: str, bus: BrokerBus, text: str) -> None:
    """Put `text` on the bus's channel as another sender would (the broker's own client)."""
    if kind == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            await client.publish(bus.channel, text)  # type: ignore[attr-defined]
        finally:
            await client.aclose()
    elif kind == "redis-cluster":  # sharded pub/sub, on the channel the bus itself sends on
        from mrtr._redisclient import client as redis_client

        cluster: Any = redis_client(bus.url)  # type: ignore[attr-defined]
        try:
            await cluster.initialize()
            await cluster.spublish(bus.channel, text)  # type: ignore[attr-defined]
        finally:
            await cluster.aclose()
    else:
        import psycopg

        async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as conn:
            await conn.execute("SELECT pg_notify(%s, %s)", (bus.channel, text))  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_burst_goes_out_in_a_few_round_trips_and_arrives_once_in_order(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with buses(kind, 2, request=request) as (a, b):
        heard: list[Any] = []
        b.subscribe(heard.append)
        await asyncio.gather(*(a.publish(task(n)) for n in range(2000)))  # all queued before the sender runs
        await until(lambda: len(heard) >= 2000, 20, "the whole burst on B")
        await asyncio.sleep(0.2)  # a duplicate would arrive by now
        assert [e.task_id for e in heard] == [f"t{n}" for n in range(2000)], "each once, in publishing order"
        assert a.dropped == 0 and a.sent == 2000
        assert a.batches <= 2000 // a.max_batch + 2, f"one round trip per batch, not per event: {a.stats()}"
        assert b.gaps == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_producer_faster_than_the_sender_is_held_back_instead_of_losing_events(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with buses(kind, 2, max_outbox=8, request=request) as (a, b):
        heard: list[Any] = []
        b.subscribe(heard.append)
        for n in range(600):  # one at a time, as fast as the loop allows: the sender cannot keep 8 or fewer
            await a.publish(task(n))
        await until(lambda: len(heard) >= 600, 20, "every event on B")
        assert a.dropped == 0, a.stats()
        assert a.waited > 0, f"the producer never waited: this test proved nothing: {a.stats()}"
        assert [e.task_id for e in heard] == [f"t{n}" for n in range(600)]


@pytest.mark.parametrize("kind", KINDS)
async def test_dropped_events_are_counted_logged_and_announced_to_the_listeners_they_concern(
    kind: str, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    async with buses(kind, 2, request=request, max_outbox=3, max_publish_wait=0) as (a, b):
        heard: list[Any] = []
        b.subscribe(heard.append)
        events = [task(n) for n in range(100)] + [ResourceUpdated(uri="res://late")]
        with caplog.at_level(logging.WARNING, logger="mrtr.buses"):
            # 101 queued in one pass of the loop, the broker up: the outbox keeps the newest 3.
            await asyncio.gather(*(a.publish(event) for event in events))
            await until(lambda: len(heard) >= 4, 10, "the notice and the three events kept")
        await asyncio.sleep(0.2)
        gap, *kept = heard
        assert isinstance(gap, BusGap) and gap.known and gap.reason == "dropped"
        assert gap.task_ids == {f"t{n}" for n in range(98)} and not gap.uris, "exactly what was dropped"
        assert [getattr(e, "task_id", getattr(e, "uri", None)) for e in kept] == ["t98", "t99", "res://late"]
        assert a.dropped == 98 and a.dropped_by == {"broker_unreachable": 0, "publisher_behind": 98}
        assert counted(reader, "mrtr.bus.dropped") == {"publisher_behind": 98}
        assert b.gaps_by == {"resubscribed": 0, "dropped": 1, "lost": 0}
        assert counted(reader, "mrtr.bus.gaps") == {"dropped": 1}
        said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert any("the publisher is behind while the broker answers" in line for line in said), said
        assert not any("unreachable" in line for line in said), "the broker is not blamed"


async def test_a_broker_that_cannot_be_reached_is_named_as_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    bus = mrtr.open_bus("redis://127.0.0.1:1/0", max_outbox=5, max_outbox_age=60)  # nothing listens on port 1
    with caplog.at_level(logging.WARNING, logger="mrtr.buses"):
        await bus.publish(ResourceUpdated(uri="res://first"))
        await until(lambda: bus._failures > 0, 5, "the first failed round trip")
        for n in range(20):
            await bus.publish(ResourceUpdated(uri=f"res://{n}"))
    assert bus.dropped_by == {"broker_unreachable": 16, "publisher_behind": 0}
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert said and "the broker is unreachable" in said[0] and "ConnectionError" in said[0], said
    await bus.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_numbers_skipped_without_a_notice_tell_every_listener_and_repeats_are_dropped(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with buses(kind, 1, request=request) as (b,):
        heard: list[Any] = []
        b.subscribe(heard.append)

        def wire(n: int, uri: str) -> str:
            return json.dumps({"o": "elsewhere", "n": n, "e": "resource", "uri": uri})

        for text in (wire(1, "res://1"), wire(2, "res://2"), wire(2, "res://2"), wire(5, "res://5")):
            await raw_publish(kind, b, text)
        await until(lambda: len(heard) >= 4, 10, "three events and a gap")
        await asyncio.sleep(0.2)
        assert heard[:2] == [ResourceUpdated(uri="res://1"), ResourceUpdated(uri="res://2")], "the repeat once"
        assert heard[2] == BusGap(reason="lost") and not heard[2].known, "3 and 4 never came: anything may be missing"
        assert heard[3:] == [ResourceUpdated(uri="res://5")]
        assert b.gaps_by["lost"] == 1


class Session:
    """What a listen stream writes, in order (the wire's notifications as dicts)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        self.sent.append(notification.model_dump(by_alias=True, exclude_none=True))


async def test_a_listen_stream_refetches_for_a_gap_that_concerns_it_and_ends_for_one_that_knows_nothing() -> None:
    bus = InMemorySubscriptionBus()
    handler = ListenHandler(bus)
    ctx = SimpleNamespace(request_id="listen-1", session=Session())
    wanted = SubscriptionFilter(resource_subscriptions=["res://x"], tools_list_changed=True)
    serving = asyncio.create_task(handler(ctx, SubscriptionsListenRequestParams(notifications=wanted)))  # type: ignore[arg-type]
    await until(lambda: len(ctx.session.sent) == 1, 5, "the acknowledgement")

    def methods() -> list[str]:
        return [frame["method"] for frame in ctx.session.sent[1:]]

    await bus.publish(BusGap(known=True, uris=frozenset({"res://other"}), task_ids=frozenset({"t1"})))
    await bus.publish(BusGap(known=True, uris=frozenset({"res://x", "res://other"})))
    await bus.publish(BusGap(known=True, lists=frozenset({"tools", "prompts"})))
    await until(lambda: len(methods()) == 2, 5, "the two refetch signals")
    assert methods() == ["notifications/resources/updated", "notifications/tools/list_changed"]
    assert ctx.session.sent[1]["params"]["uri"] == "res://x", "only what the stream asked for"
    assert not serving.done(), "a gap that names what was lost does not end the stream"
    await bus.publish(BusGap())
    with pytest.raises(Exception, match="re-listen"):
        await asyncio.wait_for(serving, 5)


@pytest.mark.needs_redis
async def test_more_losses_than_a_notice_can_name_tell_every_listener() -> None:
    async with buses("redis", 2, max_outbox=3, max_publish_wait=0) as (a, b):
        heard: list[Any] = []
        b.subscribe(heard.append)
        await asyncio.gather(*(a.publish(task(n)) for n in range(400)))  # 397 dropped, more than 256 named
        await until(lambda: len(heard) >= 4, 10, "the notice and the three events kept")
        gap, *kept = heard
        assert gap == BusGap(reason="dropped") and not gap.known, "too many to name: anything may be missing"
        assert [e.task_id for e in kept] == ["t397", "t398", "t399"]
