"""The store fault proxy itself (tests/support/storeproxy.py), against a private `redis-server`.

The fleet tests trust it to cut, pause and slow a store connection; these tests show that
each fault does what it says to a real Redis client, and that it ends cleanly.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.redis_proc import RedisProcess
from tests.support.storeproxy import StoreProxy

pytestmark = [pytest.mark.spawns, pytest.mark.needs_redis]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    if RedisProcess.binary() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with RedisProcess(tmp_path) as server:
        yield server


def _client(proxy: StoreProxy, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),  # see each fault as it is, not through redis-py's own retries
    )


def test_forwards_then_cut_refuses_and_restore_heals(private_redis: RedisProcess) -> None:
    with StoreProxy(private_redis.port) as proxy:
        client = _client(proxy)
        assert client.set("k", "v") and client.get("k") == b"v"
        proxy.cut()
        assert proxy.stats.dropped >= 1 and proxy.connections == 0
        with pytest.raises(redis.ConnectionError):
            client.get("k")
        proxy.restore()
        assert client.get("k") == b"v", "a new connection after restore() reaches the store"
        assert proxy.stats.refused >= 1


def test_delay_adds_latency_to_each_reply_without_serialising_them(private_redis: RedisProcess) -> None:
    with StoreProxy(private_redis.port) as proxy:
        client = _client(proxy)
        client.ping()
        started = time.monotonic()
        client.ping()
        fast = time.monotonic() - started
        proxy.delay(0.2)
        started = time.monotonic()
        client.ping()
        slow = time.monotonic() - started
        assert slow >= 0.2 > fast
        # four clients at once: each waits its own 0.2 s, not 0.8 s in a row
        clients = [_client(proxy) for _ in range(4)]
        for c in clients:
            c.ping()
        started = time.monotonic()
        threads = [threading.Thread(target=c.ping) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert time.monotonic() - started < 0.7
        proxy.delay(0)
        started = time.monotonic()
        client.ping()
        assert time.monotonic() - started < 0.2


def test_pause_holds_bytes_and_resume_delivers_them(private_redis: RedisProcess) -> None:
    with StoreProxy(private_redis.port) as proxy:
        client = _client(proxy, timeout=5.0)
        client.ping()
        proxy.pause()
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(client.incr("n")))
        reader.start()
        reader.join(timeout=0.5)
        assert reader.is_alive() and not got, "no reply while paused"
        proxy.resume()
        reader.join(timeout=3)
        assert got == [1]
        with pytest.raises(redis.TimeoutError):
            proxy.pause()
            _client(proxy, timeout=0.3).incr("n")
        proxy.resume()
