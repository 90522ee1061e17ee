"""mrtr's metrics reach the OpenTelemetry global `MeterProvider` an application sets (at any time).

In a fresh process: the global provider can be set once per process, so the in-process
metrics tests (tests/integration/test_metrics.py) hand theirs to mrtr alone instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spawns  # a fresh interpreter

_GLOBAL_PROVIDER = """
import asyncio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import mrtr
from mrtr._telemetry import metrics as engine_metrics
from mrtr.client import FlowClient
from tests.support.flowkit import new_server

server = new_server("global")
flows = mrtr.Flows(server)


@flows.tool()
async def hello(ctx: mrtr.FlowContext) -> str:
    return "hi"


async def call() -> None:
    async with FlowClient(server) as client:
        await client.call_tool("hello", {})


asyncio.run(call())  # before any provider: nothing made, nothing recorded
assert engine_metrics.instruments() is None and engine_metrics._current is None
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
asyncio.run(call())
asyncio.run(call())
data = reader.get_metrics_data()
(rounds,) = [m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics if m.name == "mrtr.rounds"]
print(sum(p.value for p in rounds.data.data_points))
"""


def test_the_global_meter_provider_is_picked_up_when_set(tmp_path: Path) -> None:
    """What applications do: `metrics.set_meter_provider` once, at any time (a fresh process:
    OpenTelemetry's global can be set once per process)."""
    script = tmp_path / "global_provider.py"
    script.write_text(_GLOBAL_PROVIDER)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env=os.environ | {"PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
