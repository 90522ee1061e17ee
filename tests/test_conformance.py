"""The official MCP conformance suite, run against our fixtures (server) and our client.

Why here and not only in CI scripts: the MRTR scenarios are the outside world's definition of
"does multi-round-trip work"; running them in the ordinary test suite keeps mrtr honest on
every change. Two independent gates guard the server run:

1. the harness's own exit code with `tests/conformance/expected-failures.yml` as baseline
   (fails on a new failure, on any WARNING, and on a stale baseline entry), and
2. our own reading of the `checks.json` files: all 14 MRTR scenarios must have run and every
   one of their checks must be SUCCESS — so a wrong baseline cannot hide an MRTR regression.

Needs `npx` (Node.js; npx itself fetches Node 22 and the suite, ~15 s the first time). Without
it the tests skip on a laptop but fail when `CI` is set, so CI can never go green by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conformance.harness import (
    BASELINE,
    CLIENT_SCENARIO,
    MRTR_SCENARIOS,
    find_npx,
    fixture_server,
    load_checks,
    not_successful,
    run_client_scenario,
    run_server_suite,
)
from tests.conformance.summarize import render

pytestmark = pytest.mark.slow

# A known FlowClient gap (reported to the owner of src/mrtr): see test_client_scenario.
_NO_RESULT_TYPE_SIGNATURE = ("CallToolResult.resultType", "Field required")


@pytest.fixture(scope="module")
def npx() -> str:
    """`npx`, or a skip (laptop) / failure (CI) saying why the suite cannot run."""
    found = find_npx()
    if found is None:
        reason = "npx not found: install Node.js to run the MCP conformance suite (npx then fetches Node 22)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run it, not skip it")
        pytest.skip(reason)
    return found


def test_server_suite_all_2026_07_28(npx: str, tmp_path: Path) -> None:
    with fixture_server(tmp_path / "server.log") as url:
        run = run_server_suite(npx, url, tmp_path / "out", baseline=BASELINE)
    results = load_checks(run.out_dir)
    print(render(results, exit_code=run.returncode, seconds=run.seconds))

    assert run.returncode == 0, f"conformance harness exited {run.returncode}:\n{run.tail()}"
    missing = [name for name in MRTR_SCENARIOS if not results.get(name)]
    assert not missing, f"MRTR scenarios that did not run: {missing}\n{run.tail()}"
    failing = {name: bad for name in MRTR_SCENARIOS if (bad := not_successful(results[name]))}
    assert not failing, f"MRTR checks that are not SUCCESS: {failing}"


def test_client_scenario_request_state(npx: str, tmp_path: Path) -> None:
    run = run_client_scenario(npx, tmp_path / "out")
    checks = load_checks(run.out_dir).get(CLIENT_SCENARIO, [])
    if run.returncode != 0 and all(part in run.output for part in _NO_RESULT_TYPE_SIGNATURE):
        # FlowClient drives rounds through the SDK's ClientSession.call_tool, which validates a
        # 2026-07-28 result against a schema where `resultType` is required; the mock's
        # `test_mrtr_no_result_type` answer (no resultType, which clients MUST treat as
        # complete) raises pydantic.ValidationError, and the client exits 1. Only this exact
        # failure is tolerated; once FlowClient handles it, this branch stops being taken.
        assert not not_successful(checks), f"the harness's own checks failed too: {not_successful(checks)}"
        pytest.xfail("FlowClient rejects a result without resultType instead of treating it as complete")
    assert run.returncode == 0, f"conformance harness exited {run.returncode}:\n{run.tail()}"
    assert checks, f"no checks recorded for {CLIENT_SCENARIO}:\n{run.tail()}"
    assert not not_successful(checks), f"client checks that are not SUCCESS: {not_successful(checks)}"
