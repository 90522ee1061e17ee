"""Run the official MCP conformance suite against our fixtures, and read what it found.

Shared by tests/external/test_conformance.py and tests/external/conformance/summarize.py so both run the suite
the same way: the same pinned suite and Node, the same flags, the same timeouts, the same
parsing of its `checks.json` files.

Why pin both packages: npm's `latest` tag of the suite has no MRTR scenarios, and the suite
needs Node >= 22 (it imports `globSync` from "fs"), which the system Node may not be; `npx -p
node@22.23.3` fetches that Node into the npm cache once (~15 s cold, ~370 MB) and reuses it.
`-y` is always passed because a user's ~/.npmrc may say `yes=false`, which would make npx
wait for a prompt nobody answers.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.external.conformance.server import READY_PREFIX
from tests.support.servers import ServerSpec, spawn_servers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SERVER_SCRIPT = HERE / "server.py"
FASTMCP_SERVER_SCRIPT = HERE / "fastmcp_server.py"
CLIENT_SCRIPT = HERE / "client.py"
BASELINE = HERE / "expected-failures.yml"
RESULTS_MD = HERE / "results.md"

CONFORMANCE_PACKAGE = "@modelcontextprotocol/conformance@0.2.0-alpha.11"
NODE_PACKAGE = "node@22.23.3"
SPEC_VERSION = "2026-07-28"
CLIENT_SCENARIO = "sep-2322-client-request-state"

MRTR_SCENARIOS: tuple[str, ...] = tuple(
    f"input-required-result-{name}"
    for name in (
        "basic-elicitation",
        "basic-sampling",
        "basic-list-roots",
        "request-state",
        "multiple-input-requests",
        "multi-round",
        "missing-input-response",
        "non-tool-request",
        "result-type",
        "unsupported-methods",
        "tampered-state",
        "capability-check",
        "ignore-extra-params",
        "validate-input",
    )
)
"""The 14 MRTR server scenarios of the 2026-07-28 suite (spec/conformance.md §4)."""

TASKS_SCENARIOS: tuple[str, ...] = tuple(
    f"tasks-{name}"
    for name in (
        "lifecycle",
        "capability-negotiation",
        "wire-fields",
        "request-state-removal",
        "mrtr-input",
        "request-headers",
        "dispatch-and-envelope",
        "required-task-error",
        "mrtr-composition",
    )
)
"""The tasks-extension (SEP-2663) server scenarios that grade a server (spec/conformance.md §6)."""

TASKS_ALWAYS_SKIPPED = "tasks-status-notifications"
"""The tenth tasks scenario: the suite itself reports its one check SKIPPED (pending a harness
rewrite), so it is never expected to pass and never baselined (an entry would be flagged stale)."""

TASK_ENVELOPE_SCHEMA_BUG_IN = "@modelcontextprotocol/conformance@0.2.0-alpha.11"
"""The pinned suite version whose `wire-schema-valid` check misjudges every `CreateTaskResult`.

It validates a `tools/call` result against the core `CallToolResult` schema unless its
`resultType` is `input_required`; a `CreateTaskResult` (`resultType: "task"`, defined by the
tasks extension, not the core schema) has no `content`, so any correct task creation fails
the check. Upstream: modelcontextprotocol/conformance issue #424, fixed by PR #468, released
in 0.2.0-alpha.12 (verified 2026-11-22: there, all 44 checks of the nine scenarios against
our fixtures are SUCCESS). Adding `content: []` to make the old check pass would tell clients
that do not read `resultType` that the call completed with nothing, so mrtr does not.
"""

_TASK_ENVELOPE_SCHEMA_ERROR = "CallToolResult: must have required property 'content' (result of 'tools/call')"

SUITE_TIMEOUT = 180.0
"""Seconds for one `npx ... conformance` run: a cold npm download is ~15 s, a warm run < 10 s."""

# Result directories are `[server-]<scenario>-<ISO timestamp with ':' and '.' as '-'>`.
_RESULT_DIR = re.compile(r"^(?:server-)?(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")


def find_npx() -> str | None:
    """The `npx` executable, or None when Node tooling is not installed."""
    return shutil.which("npx")


TASKS_FIXED_PACKAGE = "@modelcontextprotocol/conformance@0.2.0-alpha.12"
"""The first suite release whose `wire-schema-valid` accepts a `CreateTaskResult`: the tasks
scenarios also run under it, strictly (nothing excused), so they are proven with an empty baseline."""


def conformance_command(npx: str, *args: str, package: str = CONFORMANCE_PACKAGE) -> list[str]:
    """`npx -y -p node@… -p @modelcontextprotocol/conformance@… conformance ARGS`."""
    return [npx, "-y", "-p", NODE_PACKAGE, "-p", package, "conformance", *args]


@dataclass
class SuiteRun:
    """One finished harness invocation: its exit code, its output, and where it wrote results."""

    command: list[str]
    returncode: int
    output: str
    out_dir: Path
    seconds: float

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def run_conformance(
    npx: str,
    args: Sequence[str],
    out_dir: Path,
    *,
    timeout: float = SUITE_TIMEOUT,
    package: str = CONFORMANCE_PACKAGE,
) -> SuiteRun:
    """Run the harness with `-o out_dir`; stdout and stderr are merged (the summary is on stdout).

    Raises:
        subprocess.TimeoutExpired: The harness did not finish within `timeout` (it is killed).
    """
    command = conformance_command(npx, *args, "-o", str(out_dir), package=package)
    started = time.monotonic()
    completed = subprocess.run(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return SuiteRun(command, completed.returncode, completed.stdout, out_dir, time.monotonic() - started)


def run_server_suite(npx: str, url: str, out_dir: Path, *, baseline: Path | None = BASELINE) -> SuiteRun:
    """`--suite all --spec-version 2026-07-28` against `url`, with our baseline unless told otherwise."""
    args = ["server", "--url", url, "--suite", "all", "--spec-version", SPEC_VERSION]
    if baseline is not None:
        args += ["--expected-failures", str(baseline)]
    return run_conformance(npx, args, out_dir)


def run_tasks_suite(npx: str, url: str, out_dir: Path, *, package: str = CONFORMANCE_PACKAGE) -> SuiteRun:
    """`--suite pending` against `url`: the one harness run that covers every tasks scenario.

    Why this suite: `--scenario` takes one name (given twice, the last wins) and the tasks
    scenarios are extension-tagged, so `--spec-version` never selects them. `pending` is the
    ten tasks scenarios plus four others, which run at their own spec versions; one of them,
    `server-sse-polling`, is a 2025-11-25 stateful scenario that this stateless 2026-07-28
    fixture server does not serve. So no baseline is passed and the exit code is no verdict
    on tasks: callers read the `tasks-*` checks (see `tasks_failures`). One sequential run
    (~12 s) beats nine `--scenario` runs in parallel (~20 s on two cores).
    """
    return run_conformance(npx, ["server", "--url", url, "--suite", "pending"], out_dir, package=package)


SCENARIO_WORKERS = 2
"""Harness runs at once in `run_scenarios`: one `--scenario` run is ~0.7 s, mostly Node start-up."""


def run_scenarios(npx: str, url: str, scenarios: Sequence[str], out_dir: Path) -> list[SuiteRun]:
    """One `--scenario NAME --spec-version 2026-07-28` run per name against `url`, all writing under `out_dir`.

    Why one run each: `--scenario` takes one name (given twice, the last wins) and no suite is
    "the MRTR scenarios" alone; `--suite all` would also run every non-MRTR scenario, whose
    fixtures a server with only the MRTR flows (fastmcp_server.py) does not have. No baseline:
    callers require each run's exit code 0 and every check SUCCESS. Runs are independent (each
    its own client and flows), so they go `SCENARIO_WORKERS` at a time; results come back in
    the order of `scenarios`.
    """

    def one(scenario: str) -> SuiteRun:
        args = ["server", "--url", url, "--scenario", scenario, "--spec-version", SPEC_VERSION]
        return run_conformance(npx, args, out_dir)

    with ThreadPoolExecutor(max_workers=SCENARIO_WORKERS) as pool:
        return list(pool.map(one, scenarios))


def is_task_envelope_schema_bug(check: Mapping[str, Any]) -> bool:
    """Whether `check` fails only because of the harness bug in `TASK_ENVELOPE_SCHEMA_BUG_IN`.

    True only for a `wire-schema-valid` FAILURE, under that suite version, every one of whose
    violations is a `tools/call` response with `resultType: "task"` lacking `content` and
    nothing else. Any other schema violation (a malformed `tasks/get` result, a bad field
    on the created task) still counts; once the pin moves past the bug nothing is excused.
    """
    if CONFORMANCE_PACKAGE != TASK_ENVELOPE_SCHEMA_BUG_IN:
        return False
    if check.get("id") != "wire-schema-valid" or check.get("status") != "FAILURE":
        return False
    violations = (check.get("details") or {}).get("violations") or []
    return bool(violations) and all(_is_task_envelope_violation(v) for v in violations)


def _is_task_envelope_violation(violation: Mapping[str, Any]) -> bool:
    message = violation.get("message")
    result = message.get("result") if isinstance(message, dict) else None
    return (
        violation.get("origin") == "implementation"
        and violation.get("context") == "response to 'tools/call'"
        and isinstance(result, dict)
        and result.get("resultType") == "task"
        and violation.get("errors") == [_TASK_ENVELOPE_SCHEMA_ERROR]
    )


def tasks_failures(
    results: Mapping[str, Sequence[Mapping[str, Any]]], *, excuse_envelope_bug: bool = True
) -> dict[str, list[str]]:
    """Scenario -> what is wrong, for every tasks scenario that did not run or did not pass.

    A graded scenario passes when every check is SUCCESS (the task-envelope harness bug
    aside); SKIPPED or INFO do not count as passing there. `TASKS_ALWAYS_SKIPPED` may be
    SKIPPED, but any check the suite starts grading in it must be SUCCESS.
    """
    failures: dict[str, list[str]] = {}
    for name in TASKS_SCENARIOS:
        checks = results.get(name)
        if not checks:
            failures[name] = ["did not run"]
        elif bad := not_successful([c for c in checks if not (excuse_envelope_bug and is_task_envelope_schema_bug(c))]):
            failures[name] = bad
    graded = [check for check in results.get(TASKS_ALWAYS_SKIPPED, []) if check.get("status") != "SKIPPED"]
    if bad := not_successful(graded):
        failures[TASKS_ALWAYS_SKIPPED] = bad
    return failures


def run_client_scenario(npx: str, out_dir: Path, scenario: str = CLIENT_SCENARIO) -> SuiteRun:
    """Run `tests/external/conformance/client.py` (this interpreter) under the harness's mock server."""
    command = shlex.join([sys.executable, str(CLIENT_SCRIPT)])
    return run_conformance(npx, ["client", "--command", command, "--scenario", scenario], out_dir)


def load_checks(out_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Scenario name -> its checks, from the `checks.json` files the harness wrote under `out_dir`.

    If `out_dir` holds several runs of a scenario, the latest one counts (timestamps sort).
    """
    results: dict[str, list[dict[str, Any]]] = {}
    for checks_file in sorted(out_dir.glob("*/checks.json")):
        match = _RESULT_DIR.match(checks_file.parent.name)
        scenario = match["scenario"] if match else checks_file.parent.name
        results[scenario] = json.loads(checks_file.read_text())
    return results


def not_successful(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """`id: STATUS (message)` for every check that is not SUCCESS."""
    return [
        f"{check.get('id')}: {check.get('status')} ({check.get('errorMessage') or 'no message'})"
        for check in checks
        if check.get("status") != "SUCCESS"
    ]


@contextmanager
def fixture_server(workdir: Path, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run tests/external/conformance/server.py on a free 127.0.0.1 port; yields its URL, always stops it.

    Its log is `workdir / "server-conformance.log"`. `env` adds to its environment (e.g.
    `MRTR_CONFORMANCE_TEMPORAL`, to run its tasks on Temporal).
    """
    spec = ServerSpec("conformance", dict(env or {}), script=SERVER_SCRIPT, ready_prefix=READY_PREFIX)
    with spawn_servers([spec], workdir) as servers:
        yield servers["conformance"].url


@contextmanager
def fastmcp_fixture_server(workdir: Path) -> Iterator[str]:
    """Run tests/external/conformance/fastmcp_server.py (the MRTR fixtures on FastMCP) like `fixture_server`.

    Its log is `workdir / "server-conformance-fastmcp.log"`.
    """
    from tests.external.conformance.fastmcp_server import READY_PREFIX as FASTMCP_READY_PREFIX  # needs fastmcp

    spec = ServerSpec("conformance-fastmcp", {}, script=FASTMCP_SERVER_SCRIPT, ready_prefix=FASTMCP_READY_PREFIX)
    with spawn_servers([spec], workdir) as servers:
        yield servers["conformance-fastmcp"].url
