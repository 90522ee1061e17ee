"""When the store falters (issue 37): the README's fleet recipe while its shared store goes away.

Two instances of `tests/support/store_server.py` behind HAProxy share a key and a PRIVATE store
(a `redis-server` with AOF on, or a PostgreSQL cluster, started for the test on free ports);
each instance reaches the store through its own `tests/support/storeproxy.py`. `FlowClient`s
run durable tasks through HAProxy while, halfway through, one fault lasts a few seconds:

- the store is SIGKILLed and started again on the same data (`outage`);
- one instance's route to the store is cut: connections dropped, new ones refused (`cut`);
- every reply of the store comes 200 ms late, for the whole run (`slow`).

Each run is `benchmarks/store_outage.py` in miniature; its report is asserted here. Side effects
are counted in a file outside the store, so they survive it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from benchmarks.chaos_fleet import HaproxyUnavailable, find_haproxy
from benchmarks.store_outage import Options, Report, render, run_one

from tests.support.markers import backends
from tests.support.pg_proc import PostgresProcess
from tests.support.redis_proc import RedisProcess

# alone: faults timed in seconds (make test runs it with nothing beside it)
pytestmark = [pytest.mark.spawns, pytest.mark.needs_haproxy, pytest.mark.alone]

OPTIONS = Options(tasks=16, concurrency=8, outage=5.0, task_seconds=0.3, lease=2.0, asks=4)
RESYNC = 10.0
"""Seconds a task follower's quiet listen stream waits before it checks with `tasks/get`."""
LOOSE = 1.0
"""Seconds: a bound on probe medians that only a stalled instance misses (not a timing target)."""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the store fault tests must run, not skip)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def haproxy() -> str:
    try:
        return find_haproxy(install=True)
    except HaproxyUnavailable as exc:
        _unavailable(str(exc))
        raise


def _needs(kind: str) -> None:
    if kind == "redis" and RedisProcess.binary() is None:
        _unavailable("redis-server is not installed")
    if kind == "postgres" and (reason := PostgresProcess.available()) is not None:
        _unavailable(reason)


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mrtr-store-faults-") as path:
        yield Path(path)


def _run(kind: str, fault: str, haproxy: str, workdir: Path) -> Report:
    _needs(kind)
    report = anyio.run(run_one, kind, fault, OPTIONS, haproxy, workdir)
    print(render(report))
    return report


def _common(report: Report) -> None:
    """What every fault must leave behind: every task done once, right, by instances still alive."""
    text = render(report)
    assert report.tasks_ok == OPTIONS.tasks, text
    assert report.tasks_lost == 0 and report.tasks_wrong == 0, text
    assert not report.client_errors, f"FlowClient should have retried these: {text}"
    assert not report.new_key, f"a task or step ran under a second idempotency key: {text}"
    assert report.asks_ok == OPTIONS.asks, f"an inline flow with a question failed: {text}"
    assert report.restarts == 0, f"a server process died: {text}"
    assert report.server_tracebacks == 0, f"a store failure was logged with a traceback: {text}"
    bad = {e for e in report.raw_errors if "Internal server error" in e or "HTTP 5" in e or "transport" in e}
    assert not bad, f"a call needing the store got no retryable answer: {text}"


def _retryable(report: Report, store: str) -> list[str]:
    return [e for e in report.raw_errors if "-32603" in e and store in e and "retry" in e]


def _no_storm(report: Report) -> None:
    text = render(report)
    health, quick = report.health.p50(True), report.quick.p50(True)
    assert health is not None and health < LOOSE, f"/healthz slowed while the store was down: {text}"
    assert quick is not None and quick < LOOSE, f"an inline flow slowed while the store was down: {text}"
    assert report.quick.failures_during == 0 and report.health.failures_during == 0, text


@pytest.mark.parametrize("kind", backends("redis", "postgres"))
def test_store_down_then_back_loses_nothing(kind: str, haproxy: str, workdir: Path) -> None:
    """SIGKILL the store for 5 s mid-batch, start it again on its data: no process restarted."""
    report = _run(kind, "outage", haproxy, workdir)
    _common(report)
    _no_storm(report)
    # a step whose checkpoint was lost may run again, under its own key: at most once per lane
    reruns = sum(count - 1 for count in report.same_key.values())
    assert reruns <= OPTIONS.concurrency, render(report)
    assert report.recovery(), "no task was still running when the store came back: the fault hit nothing"
    if kind == "redis":  # PostgreSQL's pool may hold a call until the server is back instead
        assert _retryable(report, "redis"), f"no call saw the retryable store error: {render(report)}"


@pytest.mark.parametrize("kind", backends("redis", "postgres"))
def test_an_instance_cut_off_from_the_store_refuses_and_the_other_carries_on(
    kind: str, haproxy: str, workdir: Path
) -> None:
    report = _run(kind, "cut", haproxy, workdir)
    _common(report)
    _no_storm(report)
    store = "redis" if kind == "redis" else "postgresql"
    assert _retryable(report, store), f"the cut-off instance did not refuse with a retryable error: {render(report)}"
    assert any("Unknown or expired task" in e for e in report.raw_errors), "the other instance should answer"
    start, end = report.fault_window
    finished = {r["instance"] for r in report.steps if r["step"] == "finish" and start + 1.0 < r["end"] < end}
    assert "s2" in finished, f"the instance that still reaches the store finished no task during the cut: {finished}"


@pytest.mark.parametrize("kind", backends("redis", "postgres"))
def test_a_slow_store_completes_everything_and_expires_no_live_lease(kind: str, haproxy: str, workdir: Path) -> None:
    """Every store reply 200 ms late: slower, but no lease runs out under its live worker."""
    report = _run(kind, "slow", haproxy, workdir)
    _common(report)
    assert not report.same_key, f"a step ran twice: a lease expired under a live worker: {render(report)}"
    assert not report.raw_errors or all("Unknown or expired task" in e for e in report.raw_errors), render(report)
    # Followed by polls (`--poll`), each task takes 2-4 s under this slow store. Issue 37 measured
    # half the calls at ~15 s when following by listening: a follower that waits as long as a client
    # resync (10 s) for news of its task is not slowed by the store alone.
    slowest = max(report.durations)
    assert slowest < RESYNC, f"a task waited {slowest:.1f} s for news of itself: {render(report)}"
