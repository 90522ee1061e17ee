"""The benchmarks still run: a `--quick` pass of each script that has one (numbers are not asserted).

A benchmark that nobody runs rots silently (a changed default or API breaks it, and the next
person to measure finds out). These smoke runs assert only that each script finishes and says
its targets were measured.

The scripts start as the module starts, two at a time, longest first (each test waits for its
own): they are separate processes that assert nothing about time, and one after another they
were the suite's longest file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.support.flowkit import ROOT_DIR

# alone: the benchmark scripts load both cores themselves (make test runs it with nothing beside it)
pytestmark = [pytest.mark.spawns, pytest.mark.alone]


SCRIPTS: dict[str, tuple[str, ...]] = {  # each test's script, longest first
    "test_instructions_quick_counts_the_tool_and_its_floor": ("benchmarks/instructions.py", "--quick"),
    "test_store_outage_quick_loses_no_task_on_either_store": (
        "benchmarks/store_outage.py", "--quick", "--stores", "redis,postgres",
    ),
    "test_fastmcp_tasks_quick_compares_mrtr_with_fastmcp_tasks": ("benchmarks/fastmcp_tasks.py", "--quick"),
    "test_waits_quick_wakes_every_task_on_sqlite": ("benchmarks/waits.py", "--quick", "--stores", "sqlite"),
    "test_fleet_push_quick_drops_nothing_on_redis": ("benchmarks/fleet_push.py", "--quick", "--brokers", "redis"),
    "test_tasks_quick_measures_the_sqlite_store": ("benchmarks/tasks.py", "--quick", "--stores", "sqlite"),
    "test_rounds_quick_measures_every_variant": ("benchmarks/rounds.py", "--quick"),
    "test_wizard_quick_measures_resolve_mrtr_and_the_guard": ("benchmarks/wizard.py", "--quick"),
    "test_redis_cluster_quick_measures_one_node_and_a_cluster": ("benchmarks/redis_cluster.py", "--quick"),
    "test_console_quick_serves_every_page_from_sqlite": ("benchmarks/console.py", "--quick", "--stores", "sqlite"),
    "test_sealing_quick_measures_the_sqlite_store": ("benchmarks/sealing.py", "--quick", "--stores", "sqlite"),
    "test_sampling_quick_measures_the_tool_loop_next_to_a_plain_sample": ("benchmarks/sampling.py", "--quick"),
    "test_first_rounds_quick_measures_redis_and_postgres": ("benchmarks/first_rounds.py", "--quick"),
    "test_task_floor_quick_counts_mrtr_and_the_floor": ("benchmarks/task_floor.py", "--quick"),
}  # fmt: skip

_started: dict[tuple[str, ...], Future[subprocess.CompletedProcess[str]]] = {}


def _script(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT_DIR, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module", autouse=True)
def _scripts_two_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Start the scripts of this module's selected tests, two at a time, longest first."""
    selected = {item.name for item in request.session.items if item.module is request.module}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, args in SCRIPTS.items():
            if name in selected:
                _started[args] = pool.submit(_script, args)
        try:
            yield
        finally:
            _started.clear()


def _run(*args: str) -> str:
    started = _started.get(args)
    run = started.result() if started is not None else _script(args)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_rounds_quick_measures_every_variant() -> None:
    out = _run("benchmarks/rounds.py", "--quick")
    assert "(c)/(b) in-process" in out and "Long loops" in out


def test_tasks_quick_measures_the_sqlite_store() -> None:
    out = _run("benchmarks/tasks.py", "--quick", "--stores", "sqlite")
    assert "FAILED" not in out and "sqlite" in out


def test_waits_quick_wakes_every_task_on_sqlite() -> None:
    out = _run("benchmarks/waits.py", "--quick", "--stores", "sqlite")
    assert "woke 100;" in out and "(3) event -> resumed" in out and "(n=10)" in out, out


def test_console_quick_serves_every_page_from_sqlite() -> None:
    out = _run("benchmarks/console.py", "--quick", "--stores", "sqlite")
    assert "(2) status + tool filter" in out and "(5) one task's page" in out and "p50" in out, out


@pytest.mark.needs_redis
def test_wizard_quick_measures_resolve_mrtr_and_the_guard() -> None:
    out = _run("benchmarks/wizard.py", "--quick")
    measured = {line.split()[0] for line in out.splitlines() if " p50 " in line}
    assert measured == {"resolve", "mrtr", "roundtrip", "guard"}, out
    assert "guard/resolve = " in out and "roundtrip/resolve = " in out and "guard/roundtrip = " in out, out


@pytest.mark.needs_redis
def test_fleet_push_quick_drops_nothing_on_redis() -> None:
    out = _run("benchmarks/fleet_push.py", "--quick", "--brokers", "redis")
    assert "FAILED" not in out and "(2) cross-instance latency" in out, out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("10 ", "100 "))]
    assert len(rows) == 2 and all(row[-2] == "0" for row in rows), f"events dropped at a steady rate: {out}"


@pytest.mark.needs_redis
def test_redis_cluster_quick_measures_one_node_and_a_cluster() -> None:
    """Starts its own redis-server and 3-primary cluster (never the shared Redis)."""
    out = _run("benchmarks/redis_cluster.py", "--quick")
    assert "targets measured" in out and "| one node |" in out and "| 3-primary cluster |" in out, out
    primaries = [line for line in out.splitlines() if line.strip().startswith("primary :")]
    assert len(primaries) == 3, out  # every primary serves some of the shards: no one slot holds the fleet


@pytest.mark.needs_redis
@pytest.mark.needs_postgres
def test_first_rounds_quick_measures_redis_and_postgres() -> None:
    out = _run("benchmarks/first_rounds.py", "--quick")
    assert "redis: +" in out and "postgres: +" in out and "per step" in out, out


def test_sealing_quick_measures_the_sqlite_store() -> None:
    out = _run("benchmarks/sealing.py", "--quick", "--stores", "sqlite")
    assert "cpu only: seal" in out and "sqlite" in out and "per state change" in out, out


def test_sampling_quick_measures_the_tool_loop_next_to_a_plain_sample() -> None:
    out = _run("benchmarks/sampling.py", "--quick")
    assert "3 tools           3" in out and "3 turns           5" in out and "plain             2" in out, out


@pytest.mark.needs_redis
def test_fastmcp_tasks_quick_compares_mrtr_with_fastmcp_tasks() -> None:
    """Builds fastmcp-tasks' venv on first use (benchmarks/.venv-fastmcp-tasks); if it cannot, the script
    measures mrtr's FlowClient alone and says why, and under CI=true it exits 1 (this test then fails)."""
    out = _run("benchmarks/fastmcp_tasks.py", "--quick")
    assert "FAILED" not in out and "cleanup: deleted" in out, out
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  (")}
    assert {"(1) one-step task, p50", "(2) task with one answer, p50", "(3) throughput, tasks/s"} <= rows.keys(), out
    assert "mrtr, FlowClient" in out and "floor, FlowClient" in out, out
    # the floor is measured in every run: mrtr/fc's cell of every figure carries its ratio to it
    assert all(len(re.findall(r"floor \d+\.\d\dx", row)) == 1 for row in rows.values()), out
    if "SKIPPED" in out:
        reason = next(line for line in out.splitlines() if "SKIPPED" in line)
        pytest.skip(f"mrtr and the floor measured alone; {reason}")
    # fastmcp-tasks is the baseline: the cells of both mrtr variants and the floor carry their ratio to it
    assert all(len(re.findall(r"\(\d+\.\d\dx", row)) == 3 for row in rows.values()), out


@pytest.mark.needs_redis
def test_task_floor_quick_counts_mrtr_and_the_floor() -> None:
    """Starts its own redis-server on a free port (never the shared Redis); both servers run in the script."""
    out = _run("benchmarks/task_floor.py", "--quick")
    rows = {line[:34].strip(): line[34:].split() for line in out.splitlines() if line[:34].strip()}
    for row in ("HTTP exchanges", "Redis round trips", "Redis commands run (scripts' too)", "AEAD seals"):
        assert len(rows.get(row, ())) == 4, out  # mrtr and the floor, for each of the two tasks
    floor_trips = [float(cell) for cell in rows["Redis round trips"][1::2]]
    # the floor's writes and reads as written down (a new pooled connection's handshake may add one)
    assert 4 <= floor_trips[0] < 5 and 7 <= floor_trips[1] < 8, out
    assert float(rows["AEAD seals"][0]) > 0, f"mrtr measured without sealing at rest: {out}"
    assert "Redis round trip (PING)" in out and "FAILED" not in out, out


@pytest.mark.needs_haproxy
@pytest.mark.needs_redis
@pytest.mark.needs_postgres
def test_store_outage_quick_loses_no_task_on_either_store() -> None:
    """A 3 s outage in the middle of 20 tasks, on a private Redis and a private PostgreSQL."""
    out = _run("benchmarks/store_outage.py", "--quick", "--stores", "redis,postgres")
    assert "| redis | outage 3 s | 20/20 |" in out and "| postgres | outage 3 s | 20/20 |" in out, out
    assert "FAILED" not in out, out


def test_instructions_quick_counts_the_tool_and_its_floor() -> None:
    """Needs valgrind (callgrind): off CI the test skips without it; under CI=true it fails."""
    if shutil.which("valgrind") is None and not os.environ.get("CI"):
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    out = _run("benchmarks/instructions.py", "--quick")
    assert "(c) over (d), instructions per call" in out and "no loop" in out, out
