"""The background builds a session starts: only the venvs its selected tests will use (nothing is built here)."""

from __future__ import annotations

from benchmarks.fastmcp_tasks import ensure_venv

from tests.external.interop import peers
from tests.support import prefetch


def test_a_session_without_foreign_clients_builds_nothing() -> None:
    selected = ["tests/unit/engine/test_journal.py::test_x", "tests/fleet/test_benchmarks_run.py::test_rounds_quick"]
    assert prefetch._builders(selected) == []
    assert prefetch.start(selected) is None


def test_the_interop_cells_build_their_venvs_and_the_benchmark_its_own() -> None:
    fastmcp_cell = "tests/external/test_interop.py::test_fastmcp_client[http-legacy-keep]"
    benchmark = "tests/fleet/test_benchmarks_run.py::test_fastmcp_tasks_quick_compares_mrtr_with_fastmcp_tasks"
    assert prefetch._builders([fastmcp_cell]) == [peers.ensure_fastmcp, peers.ensure_fastagent]
    assert prefetch._builders([benchmark]) == [ensure_venv]
    typescript_only = "tests/external/test_interop.py::test_typescript_sdk_client[http-legacy-keep]"
    assert prefetch._builders([typescript_only]) == []  # npx runs are never started early
