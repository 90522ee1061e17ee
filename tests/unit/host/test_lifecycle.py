"""The core's `running()`: the worker starts on the first lifespan in and stops on the last one out."""

from __future__ import annotations

from typing import Any

import pytest

from mrtr._host.core import HostCore
from mrtr._host.options import HostOptions
from mrtr.stores import SQLiteStore
from tests.support.hostkit import observe_engine
from tests.unit.host.fakehost import shared_host

pytestmark = pytest.mark.anyio


async def test_the_hook_the_host_was_given_starts_and_stops_the_worker(tmp_path: Any) -> None:
    host = shared_host()
    core = HostCore(host, HostOptions(store=SQLiteStore(tmp_path / "t.db")))
    events = observe_engine(core.engine())
    ((_extension, _listen, running),) = host.installed
    async with running():
        assert events == ["start"]
    assert events == ["start", "close"]


async def test_nested_entries_start_once_and_stop_once_and_a_new_serving_starts_again(tmp_path: Any) -> None:
    core = HostCore(shared_host(), HostOptions(store=SQLiteStore(tmp_path / "t.db")))
    events = observe_engine(core.engine())
    async with core.running():
        async with core.running():
            pass
        assert events == ["start"]
    assert events == ["start", "close"]
    async with core.running():
        assert events == ["start", "close", "start"]
    assert events == ["start", "close", "start", "close"]


async def test_a_failed_serving_still_stops_the_worker(tmp_path: Any) -> None:
    core = HostCore(shared_host(), HostOptions(store=SQLiteStore(tmp_path / "t.db")))
    events = observe_engine(core.engine())
    with pytest.raises(RuntimeError):
        async with core.running():
            raise RuntimeError("the server failed")
    assert events == ["start", "close"]


async def test_without_an_engine_running_is_a_no_op() -> None:
    core = HostCore(shared_host(), HostOptions())
    async with core.running():
        assert not core.has_engine
