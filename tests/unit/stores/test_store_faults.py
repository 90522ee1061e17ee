"""A store that does not answer is a retryable `StoreUnavailable`, logged once per burst.

Real drivers against a port nothing listens on (no mock): the error names the store, comes
within the store's timeouts, keeps the driver's error as its cause, and `FlowClient`'s
`resending` resends it until the store is back.
"""

from __future__ import annotations

import logging
import time

import pytest
from mcp.shared.exceptions import MCPError

from mrtr import StoreUnavailable
from mrtr.client import RetryPolicy
from mrtr.client._transport import resending, retryable_error
from mrtr.stores._faults import Burst
from tests.support.redis_proc import free_port

pytestmark = pytest.mark.anyio


async def test_redis_down_is_store_unavailable_at_once() -> None:
    from mrtr.stores import RedisStore

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.load("t", time.time())
    await store.close()
    assert time.monotonic() - started < 3
    assert caught.value.error.data == {"reason": "store_unavailable", "store": "redis", "retryable": True}
    assert "redis" in caught.value.error.message and "retry" in caught.value.error.message
    assert type(caught.value.__cause__).__name__ == "ConnectionError"


async def test_postgres_down_is_store_unavailable_within_its_pool_timeout() -> None:
    from mrtr.stores import PostgresStore

    store = PostgresStore(f"postgresql://postgres@127.0.0.1:{free_port()}/test", timeout=1.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.load("t", time.time())
    await store.close()
    assert time.monotonic() - started < 5
    assert caught.value.store == "postgresql"


def test_a_burst_of_failures_is_one_line_then_one_on_recovery(caplog: pytest.LogCaptureFixture) -> None:
    burst = Burst("redis", settle=0.2)
    with caplog.at_level(logging.INFO, logger="mrtr.store"):
        for _ in range(50):
            burst.failure(ConnectionError("refused"))
            burst.success()  # a call that got through while the store went down: the same burst
        time.sleep(0.25)
        burst.success()
        burst.success()
    lines = [r.getMessage() for r in caplog.records if r.name == "mrtr.store"]
    assert len(lines) == 2, lines
    assert "unavailable" in lines[0] and not caplog.records[0].exc_info
    assert "answers again" in lines[1] and "50 calls failed" in lines[1]


async def test_resending_rides_out_retryable_store_errors_only() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 12:  # more than `attempts`: store_patience keeps it going
            raise StoreUnavailable("redis")
        return "ok"

    policy = RetryPolicy(attempts=2, initial_delay=0.001, max_delay=0.01, store_patience=10.0)
    assert await resending(policy, flaky) == "ok"
    assert calls == 12

    async def broken() -> str:
        raise MCPError(code=-32603, message="Internal server error")

    with pytest.raises(MCPError):
        await resending(policy, broken)
    assert not retryable_error(MCPError(code=-32603, message="x", data={"retryable": "yes"}))
    assert retryable_error(MCPError.from_error_data(StoreUnavailable("sqlite").error))


async def test_store_patience_is_bounded() -> None:
    async def down() -> str:
        raise StoreUnavailable("postgresql")

    policy = RetryPolicy(attempts=1, initial_delay=0.05, max_delay=0.1, store_patience=0.5)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await resending(policy, down)
    assert time.monotonic() - started < 1.5


def test_flowclient_waits_out_a_store_outage_of_at_least_a_minute_by_default() -> None:
    """Issue 46: a 45 s store restart must not reach `FlowClient`'s caller (30 s did)."""
    assert RetryPolicy().store_patience >= 60.0


async def test_store_patience_never_runs_past_the_callers_own_deadline() -> None:
    """Under `anyio.fail_after(...)`, the store's error comes before the deadline, not a cancellation after it."""
    import anyio

    sent = 0

    async def down() -> str:
        nonlocal sent
        sent += 1
        raise StoreUnavailable("redis")

    policy = RetryPolicy(attempts=1, initial_delay=0.1, max_delay=0.2)  # the default 60 s of patience
    started = time.monotonic()
    with anyio.fail_after(1.0), pytest.raises(StoreUnavailable):  # not TimeoutError: the scope never fires
        await resending(policy, down)
    assert time.monotonic() - started < 1.0
    assert sent >= 3, "it retried within the deadline"


async def test_a_store_that_accepts_and_never_answers_is_store_unavailable_not_a_hang() -> None:
    """A paused connection (a route that black-holes replies): the reply timeout turns it into the
    retryable error; and any call still unanswered at the boundary's own bound fails the same way."""
    import asyncio

    from mrtr.stores import RedisStore
    from mrtr.stores._faults import store_boundary

    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.load("t", time.time())
    assert time.monotonic() - started < 3
    assert caught.value.store == "redis"
    await store.close()
    server.close()

    @store_boundary("redis", lambda exc: False, timeout=0.2)
    class Stalled:
        async def load(self) -> None:
            await asyncio.sleep(60)

    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="retry"):
        await Stalled().load()
    assert time.monotonic() - started < 1
