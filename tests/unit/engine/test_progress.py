"""`ThrottledStatus`: a task run's progress reports, written as the latest status at most once per interval."""

from __future__ import annotations

import asyncio

import pytest

from mrtr._engine.progress import ThrottledStatus

pytestmark = pytest.mark.anyio


async def test_the_first_report_is_written_at_once_then_the_latest_once_per_interval() -> None:
    written: list[str] = []

    async def write(message: str) -> None:
        written.append(message)

    status = ThrottledStatus(write, interval=0.05)
    status.report(1, 1000, None)
    await asyncio.sleep(0)  # the writer starts
    assert written == ["1 of 1000"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(2, 1001):  # a thousand reports over ~0.2 s
        status.report(n, 1000, None)
        if n % 50 == 0:
            await asyncio.sleep(0.01)
    elapsed = loop.time() - started
    await asyncio.sleep(0.1)  # the last interval ends: the latest is written
    assert written[-1] == "1000 of 1000"
    assert len(written) <= 2 + elapsed / 0.05, (len(written), elapsed)
    assert len(written) == len(set(written)), "never the same message twice"
    await status.close()


async def test_a_failed_write_is_dropped_and_close_stops_writing() -> None:
    calls: list[str] = []

    async def failing(message: str) -> None:
        calls.append(message)
        raise RuntimeError("store down")

    status = ThrottledStatus(failing, interval=0.01)
    status.report(1, None, "one")
    await asyncio.sleep(0.02)
    status.report(2, None, "two")  # a new writer: the failure did not stop the next report
    await asyncio.sleep(0.02)
    assert calls == ["one", "two"]
    await status.close()
    status.report(3, None, "three")
    await asyncio.sleep(0.02)
    assert calls == ["one", "two"], "nothing after close"
