"""`benchmarks/fastmcp.py` runs: FastMCP's guard pattern vs an `mrtr.fastmcp` flow, in miniature.

A few cycles on every transport (in-process, fastmcp's in-memory client, an HTTP server
subprocess); each call checks its own result, so a broken variant fails the run. Then a short
profile pass. No timing is asserted: that is the benchmark's job.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from benchmarks.fastmcp import engine_timers, main, parse_args, profile_inprocess

# alone: a benchmark in miniature (make test runs it with nothing beside it)
pytestmark = pytest.mark.alone


@pytest.mark.spawns
def test_the_fastmcp_benchmark_runs_on_every_transport(capsys: pytest.CaptureFixture[str]) -> None:
    found = asyncio.run(main(parse_args(["--n", "5", "--warmup", "2"])))
    assert [name for name, _ratio, _ci in found] == ["in-process", "in-memory fastmcp.Client", "HTTP"]
    for _name, ratio, (low, high) in found:
        assert math.isfinite(ratio) and ratio > 0 and 0 < low <= high
    engine_timers(5)
    profile_inprocess(5, top=3)
    out = capsys.readouterr().out
    assert "requestState as sealed on the wire" in out and "TARGET" in out
    assert "largest growth in cumulative time" in out and "run_request round 1" in out
