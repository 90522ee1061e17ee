"""The chaos benchmark, short: mrtr's clients behind HAProxy while instances are SIGKILLed.

`benchmarks/chaos.py` in miniature (100 flows + 10 task flows, at least 3 kills, mrtr's
`FlowClient` only, the servers built by the README's plain fleet recipe: a shared Redis store
and no `subscriptions=`), run once per module with one client per lane and once with one
client shared by all lanes; each test asserts one part of the benchmark's target for both
runs: no flow lost, no wrong value, no task stuck or created twice, every duplicate side
effect explained by a kill of the process that ran the first copy. Plus the duplicate
accounting itself, on records.

Needs HAProxy (installed with apt-get when missing and running as root) and Redis on
127.0.0.1:6379. Missing either fails under `CI=true` and skips with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import redis
from benchmarks.chaos import ModeReport, Options, analyse_duplicates, render, run
from benchmarks.chaos_fleet import HaproxyUnavailable, Kill, find_haproxy
from benchmarks.chaos_load import Job, interleave

# alone: kills on a schedule under load (make test runs it with nothing beside it)
pytestmark = [pytest.mark.in_process, pytest.mark.alone]  # unless marked otherwise

SHORT = Options(
    flows=100,
    tasks=10,
    concurrency=16,
    clients=4,
    kill_interval=(1.0, 2.0),
    min_kills=3,
    duration_cap=40.0,
    modes=("mrtr",),
    buses=("plain",),  # the README's plain fleet recipe: the bus comes from the store
    sharing=("lane", "shared"),
    settle=10.0,
)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the chaos test must run, not skip)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def runs() -> list[ModeReport]:
    """The short chaos runs for the whole module (about 20 s each)."""
    try:
        find_haproxy(install=True)
    except HaproxyUnavailable as exc:
        _unavailable(str(exc))
    try:
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        _unavailable(f"Redis on 127.0.0.1:6379 unreachable: {exc}")
    reports = asyncio.run(run(SHORT))
    for report in reports:
        print(render(report, SHORT))
    assert [(r.bus, r.sharing) for r in reports] == [("plain", "lane"), ("plain", "shared")]
    assert [r.clients for r in reports] == [SHORT.concurrency, 1]
    return reports


@pytest.mark.spawns
@pytest.mark.needs_haproxy
@pytest.mark.needs_redis
def test_the_run_had_its_kills_and_its_load(runs: list[ModeReport]) -> None:
    for chaos in runs:
        assert chaos.kills >= SHORT.min_kills, f"only {chaos.kills} kills: the run proved nothing"
        assert chaos.load.flows_started >= SHORT.flows and chaos.load.tasks_started == SHORT.tasks
        assert chaos.input_rounds >= 2 * SHORT.flows, "the servers saw fewer question rounds than the flows need"
        assert chaos.shed_rounds > 0, "no round was shed: the run did not exercise shedding"
        assert not chaos.restart_failures


@pytest.mark.spawns
@pytest.mark.needs_haproxy
@pytest.mark.needs_redis
def test_no_flow_lost_and_no_wrong_value(runs: list[ModeReport]) -> None:
    for chaos in runs:
        assert chaos.load.lost == 0, (chaos.sharing, chaos.problems())
        assert chaos.load.wrong == 0, (chaos.sharing, chaos.problems())
        assert chaos.load.client_breaks == 0, (chaos.sharing, chaos.load.break_reasons)


@pytest.mark.spawns
@pytest.mark.needs_haproxy
@pytest.mark.needs_redis
def test_every_task_created_once_and_finished(runs: list[ModeReport]) -> None:
    for chaos in runs:
        assert chaos.tasks_in_store == SHORT.tasks, f"{chaos.sharing}: a resent task creation made a second task"
        assert chaos.tasks_stuck == 0, (chaos.sharing, chaos.problems())
        assert len(chaos.load.task_durations) == SHORT.tasks, "every task flow's time was measured"


@pytest.mark.spawns
@pytest.mark.needs_haproxy
@pytest.mark.needs_redis
def test_side_effects_repeat_only_where_a_kill_hit(runs: list[ModeReport]) -> None:
    for chaos in runs:
        assert not chaos.duplicates.unexplained, (chaos.sharing, chaos.problems())
        assert chaos.meets_target()


def _run(key: str, flow: str, step: str, pid: int, start: float, end: float) -> dict[str, Any]:
    return {"key": key, "flow": flow, "step": step, "instance": f"i{pid}", "pid": pid, "start": start, "end": end}


def test_duplicates_are_matched_to_the_kill_of_the_first_runs_process() -> None:
    records = [
        _run("k1", "F1", "charge", pid=10, start=1.0, end=1.1),  # killed at 1.5: its round never answered
        _run("k1", "F1", "charge", pid=11, start=2.0, end=2.1),
        _run("k2", "F2", "charge", pid=11, start=1.0, end=1.1),  # rerun with no kill of pid 11 before it
        _run("k2", "F2", "charge", pid=12, start=3.0, end=3.1),
        _run("k3", "F3", "reserve", pid=10, start=1.2, end=1.3),  # first round resent: a new key
        _run("k4", "F3", "reserve", pid=12, start=2.5, end=2.6),
        _run("k5", "F4", "commit", pid=12, start=1.0, end=1.1),  # ran once: no duplicate
    ]
    kills = [Kill(at=1.5, instance="i10", pid=10), Kill(at=9.0, instance="i11", pid=11)]
    found = analyse_duplicates(records, kills)
    assert (found.same_key, found.same_key_after_kill) == (2, 1)
    assert (found.new_key, found.new_key_after_kill) == (1, 1)
    assert [(d["kind"], d["earlier"]["flow"]) for d in found.unexplained] == [("same key", "F2")]


def test_a_kill_long_after_a_step_does_not_explain_its_rerun() -> None:
    records = [
        _run("k", "F1", "charge", pid=10, start=1.0, end=1.1),
        _run("k", "F1", "charge", pid=11, start=9.0, end=9.1),
    ]
    found = analyse_duplicates(records, [Kill(at=8.0, instance="i10", pid=10)])
    assert found.same_key == 1 and found.same_key_after_kill == 0


def test_task_flows_are_spread_among_the_flows() -> None:
    jobs = interleave(100, 10)
    assert sum(j.kind == "flow" for j in jobs) == 100 and sum(j.kind == "task" for j in jobs) == 10
    task_positions = [i for i, j in enumerate(jobs) if j.kind == "task"]
    assert task_positions[0] < 11 and task_positions[-1] > 95
    assert Job("flow", 3).expected() == (10 + 21) * 2 + 39
