"""The fleet buses on the real brokers: exactly once per listener, large events by reference,
bounded buffers, a broker restart, and the SDK's in-memory bus carrying task notifications.

Each test uses its own Redis prefix / PostgreSQL channel and table; the Redis restart runs on a
private `redis-server` (never the shared one).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

import mrtr
from mrtr.buses import BrokerBus, BusGap, TaskChanged
from tests.support.markers import backends
from tests.support.redis_proc import RedisProcess
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, cluster_url, drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.in_process]  # unless marked otherwise

URLS = {"redis": REDIS_URL, "postgres": POSTGRES_DSN}


async def need(kind: str) -> None:
    if kind == "redis-cluster":
        return  # the session's private cluster: its fixture started it, or skipped/failed already
    problem = await service_problem(kind)
    if problem is not None:
        message = f"{kind} is not reachable: {problem}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@asynccontextmanager
async def buses(
    kind: str, count: int, request: pytest.FixtureRequest | None = None, **options: Any
) -> AsyncIterator[list[BrokerBus]]:
    """`count` started buses of one fleet (one namespace), closed and cleaned up afterwards
    (`"redis-cluster"` needs the test's `request`: the session's private cluster)."""
    await need(kind)
    url = cluster_url(kind, request) or URLS[kind]
    namespace = f"mrtr_bus_{secrets.token_hex(4)}"
    async with AsyncExitStack() as stack:
        opened = [mrtr.open_bus(url, namespace=namespace, **options) for _ in range(count)]
        for bus in opened:
            await stack.enter_async_context(bus)
        try:
            yield opened
        finally:
            if kind == "postgres":
                await drop_namespace("postgres", f"{namespace}_bus")
            else:
                await drop_namespace(kind, namespace, url=url)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", backends("redis", "redis-cluster", "postgres"))
async def test_every_listener_on_every_instance_gets_each_event_exactly_once(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with buses(kind, 3, request) as fleet:
        heard: list[list[Any]] = [[] for _ in range(6)]
        for index, sink in enumerate(heard):
            fleet[index // 2].subscribe(sink.append)  # two listeners per instance
        sent = []
        for n in range(30):
            event = ResourceUpdated(uri=f"res://{n}")
            sent.append(event)
            await fleet[n % 2].publish(event)  # instances 0 and 1 publish, 2 only listens
        await fleet[0].publish(ToolsListChanged())
        sent.append(ToolsListChanged())
        await until(lambda: all(len(sink) >= len(sent) for sink in heard), 10, "every event everywhere")
        await asyncio.sleep(0.2)  # a duplicate would arrive by now
        for sink in heard:
            assert Counter(map(repr, sink)) == Counter(map(repr, sent)), "each event once, none twice"
            from_zero = [e for e in sink if isinstance(e, ResourceUpdated) and int(e.uri[6:]) % 2 == 0]
            assert from_zero == [e for e in sent[:-1] if int(e.uri[6:]) % 2 == 0], "one publisher's order is kept"


@pytest.mark.parametrize("kind", backends("redis", "redis-cluster", "postgres"))
async def test_an_event_too_large_for_the_broker_goes_by_reference(kind: str, request: pytest.FixtureRequest) -> None:
    options = {"max_inline": 2000} if kind != "postgres" else {}  # PostgreSQL's own NOTIFY cap applies
    async with buses(kind, 2, request, **options) as (a, b):
        heard: list[Any] = []
        b.subscribe(heard.append)
        big = {"taskId": "t1", "status": "completed", "result": {"content": [{"type": "text", "text": "é" * 30_000}]}}
        await a.publish(TaskChanged(task_id="t1", task=big, version=7))
        await a.publish(ResourceUpdated(uri="res://after"))
        await until(lambda: len(heard) == 2, 10, "the large event and the one after it")
        assert isinstance(heard[0], TaskChanged) and heard[0].task == big and heard[0].version == 7
        assert heard[1] == ResourceUpdated(uri="res://after")
        if kind == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) as conn:
                rows = await (await conn.execute(f'SELECT count(*) FROM "{a.table}"')).fetchone()  # type: ignore[attr-defined]
            assert rows is not None and rows[0] == 1, "the payload went through the table, the small one did not"


async def test_buffers_are_bounded_while_the_broker_is_unreachable() -> None:
    bus = mrtr.open_bus("redis://127.0.0.1:1/0", max_outbox=5)  # nothing listens on port 1
    heard: list[Any] = []
    bus.subscribe(heard.append)
    started = time.monotonic()
    for n in range(50):
        await bus.publish(ResourceUpdated(uri=f"res://{n}"))
    assert time.monotonic() - started < 1.0, "publishing never waits on the broker"
    assert len(heard) == 50, "local listeners hear everything at once"
    assert not await bus.ready(0.2)  # by now the sender failed, and put back what it was sending
    assert len(bus._outbox) == 5 and bus.dropped == 45, "the outbox keeps the newest events only"
    assert [q.n for q in bus._outbox] == list(range(46, 51)), "the newest, in order"
    assert bus.dropped_by["broker_unreachable"] >= 40, f"the cause is named: {bus.dropped_by}"
    await bus.close()


async def test_a_listen_stream_whose_client_stopped_reading_is_ended_at_its_cap() -> None:
    from types import SimpleNamespace

    from mcp_types import SubscriptionFilter, SubscriptionsListenRequestParams

    from mrtr.tasks._listen import ListenHandler

    class StoppedReading:
        """The ack goes out; then every write hangs, as to a client that no longer reads."""

        sent = 0

        async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
            self.sent += 1
            if self.sent > 1:
                await asyncio.Event().wait()

    bus = InMemorySubscriptionBus()
    handler = ListenHandler(bus, max_buffered_events=3)
    ctx = SimpleNamespace(request_id="listen-1", session=StoppedReading())
    params = SubscriptionsListenRequestParams(notifications=SubscriptionFilter(resource_subscriptions=["res://x"]))
    serving = asyncio.create_task(handler(ctx, params))  # type: ignore[arg-type]
    await until(lambda: ctx.session.sent == 1, 5, "the acknowledgement")
    for _ in range(4):  # one is being written (stuck), three fill the backlog
        await bus.publish(ResourceUpdated(uri="res://x"))
    assert len(handler._streams) == 1
    await bus.publish(ResourceUpdated(uri="res://x"))  # one too many: the stream is ended, publish never blocks
    assert handler._streams == set()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    assert bus._listeners == {}, "the ended stream unsubscribed from the bus"


@pytest.mark.spawns
@pytest.mark.needs_redis
async def test_a_redis_restart_tells_listeners_to_refetch_and_delivery_resumes(tmp_path: Path) -> None:
    if RedisProcess.binary() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with RedisProcess(tmp_path) as redis:
        a, b = mrtr.open_bus(redis.url, max_backoff=0.2), mrtr.open_bus(redis.url, max_backoff=0.2)
        async with a, b:
            heard: list[Any] = []
            b.subscribe(heard.append)
            await a.publish(ResourceUpdated(uri="res://before"))
            await until(lambda: len(heard) == 1, 5, "the first event")
            redis.kill()
            await a.publish(ResourceUpdated(uri="res://during"))  # queued: the broker is gone
            await asyncio.sleep(0.3)
            redis.start()
            await until(lambda: any(isinstance(e, BusGap) for e in heard), 10, "the gap to be reported")
            assert b.gaps == 1
            await until(lambda: not a._outbox, 10, "the queued event to be sent")
            await a.publish(ResourceUpdated(uri="res://after"))  # B re-subscribed before it reported the gap
            await until(lambda: ResourceUpdated(uri="res://after") in heard, 10, "delivery after the restart")
            uris = [e.uri for e in heard if isinstance(e, ResourceUpdated)]
            # "during" reaches B only if B re-subscribed before A's retry sent it (pub/sub keeps no
            # history): that is what the gap tells listeners. Never twice, never out of order.
            assert uris in (["res://before", "res://after"], ["res://before", "res://during", "res://after"])


async def test_flows_publish_task_notifications_on_the_sdks_in_memory_bus() -> None:
    from tests.integration.test_tasks import task_server, tasks_client

    runs: Counter[str] = Counter()
    server = task_server(runs)
    bus = server._subscriptions
    assert isinstance(bus, InMemorySubscriptionBus)
    heard: list[TaskChanged] = []
    bus.subscribe(lambda event: heard.append(event) if isinstance(event, TaskChanged) else None)
    async with tasks_client(server) as client:
        result = await client.call_tool("confirm_delete", {"filename": "a.txt"})
        assert result.content[0].text == "deleted a.txt"
        (task_id,) = {event.task_id for event in heard}
        statuses = [event.task["status"] for event in heard]
        assert statuses[0] == "working" and statuses[-1] == "completed" and "input_required" in statuses
        versions = [event.version for event in heard]
        assert versions == sorted(versions), "each state change once, in commit order"
        from tests.support.flowkit import task_state

        final = await task_state(client.session, task_id)
        final.pop("_meta", None), final.pop("resultType")
        assert heard[-1].task == final, "the notification is the task exactly as tasks/get shows it"
