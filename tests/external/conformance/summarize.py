"""Summarize a conformance run as a Markdown table (scenario -> checks passed/total).

Usage:
    python tests/external/conformance/summarize.py --run    # start the fixtures, run both suites, write results.md
    python tests/external/conformance/summarize.py OUT_DIR [--tasks-dir DIR]   # summarize existing `-o` runs
    ... [--output PATH | --output -]    # default tests/external/conformance/results.md; '-' = stdout only

`--run` runs the suite twice against one fixture server: `--suite all --spec-version
2026-07-28` (MRTR and core) and `--suite pending` (of which only the `tasks-*` scenarios are
read: the tasks extension's scenarios are selected by no spec version).

Why: the suite's own summary scrolls by on a terminal; the project README wants a stable,
reviewable record of what passes. The tables are built only from the `checks.json` files the
harness writes, MRTR scenarios first, then tasks, so they say exactly what the suite recorded.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tests.external.conformance` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.external.conformance.harness import (
    CONFORMANCE_PACKAGE,
    MRTR_SCENARIOS,
    NODE_PACKAGE,
    RESULTS_MD,
    SPEC_VERSION,
    TASKS_ALWAYS_SKIPPED,
    TASKS_SCENARIOS,
    find_npx,
    fixture_server,
    is_task_envelope_schema_bug,
    load_checks,
    run_server_suite,
    run_tasks_suite,
    tasks_failures,
)

_FAILING = ("FAILURE", "WARNING")
_TASK_NAMES = (*TASKS_SCENARIOS, TASKS_ALWAYS_SKIPPED)


def _failing(check: Mapping[str, Any]) -> bool:
    """FAILURE or WARNING, unless it is the pinned suite's task-envelope schema bug."""
    return check.get("status") in _FAILING and not is_task_envelope_schema_bug(check)


def _note(check: Mapping[str, Any]) -> str:
    note = f"{check.get('status')} `{check.get('id')}`"
    return f"{note} (harness bug, see below)" if is_task_envelope_schema_bug(check) else note


def _row(scenario: str, checks: Sequence[Mapping[str, Any]]) -> str:
    statuses = Counter(str(check.get("status")) for check in checks)
    passed = statuses["SUCCESS"]
    if any(_failing(check) for check in checks):
        verdict = "fail"
    elif checks and statuses["SKIPPED"] == len(checks):
        verdict = "skipped by the suite"
    else:
        verdict = "pass"
    notes = ", ".join(_note(check) for check in checks if check.get("status") != "SUCCESS")
    return f"| `{scenario}` | {passed}/{len(checks)} | {verdict} | {notes} |"


def _subtotal(label: str, groups: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    checks = [check for group in groups for check in group]
    passed = sum(check.get("status") == "SUCCESS" for check in checks)
    failing = sum(any(_failing(check) for check in group) for group in groups)
    return f"| **{label}** ({len(groups)} scenarios) | **{passed}/{len(checks)}** | **{failing} failing** | |"


@dataclass(frozen=True)
class RunInfo:
    """How one harness invocation went (for the document's header lines)."""

    exit_code: int | None = None
    seconds: float | None = None

    def describe(self) -> str:
        return (f", harness exit code {self.exit_code}" if self.exit_code is not None else "") + (
            f", {self.seconds:.1f} s" if self.seconds is not None else ""
        )


_HEADER = "| Scenario | Checks passed | Result | Non-SUCCESS checks |\n|---|---|---|---|"


def render_tasks(results: Mapping[str, Sequence[Mapping[str, Any]]], run: RunInfo) -> list[str]:
    """The tasks-extension section: the `tasks-*` scenarios of a `--suite pending` run."""
    task_names = [name for name in _TASK_NAMES if name in results]
    graded = [name for name in task_names if name != TASKS_ALWAYS_SKIPPED]
    bug_seen = any(is_task_envelope_schema_bug(check) for name in task_names for check in results[name])
    bug_note = [
        "Harness bug: in this suite version `wire-schema-valid` validates every `tools/call` result "
        "against the core `CallToolResult` schema unless it is `input_required`, so each correct "
        '`CreateTaskResult` (`resultType: "task"`, which has no `content`) is reported as a violation '
        "(modelcontextprotocol/conformance#424, fixed by #468 in 0.2.0-alpha.12). Such a check is counted "
        "as not passed above but fails no scenario, and only when every violation it lists is exactly "
        "that one; any other schema violation still fails.",
        "",
    ]
    return [
        "## Tasks extension (`tasks-*`, SEP-2663)",
        "",
        "Same suite and fixture server, `--suite pending` (extension scenarios are selected by no spec "
        "version; only the `tasks-*` scenarios of that run are read, so its exit code is no verdict on "
        f"tasks){run.describe()}. Not scored by the suite; no baseline: `tests/external/test_conformance.py` requires "
        "every check of the nine graded scenarios to be SUCCESS, the harness bug below aside.",
        "",
        _HEADER,
        *(_row(name, results[name]) for name in task_names),
        *(f"| `{name}` | 0/0 | **did not run** | |" for name in TASKS_SCENARIOS if name not in results),
        _subtotal("Tasks", [results[name] for name in graded]),
        "",
        *(bug_note if bug_seen else []),
    ]


def render(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    exit_code: int | None,
    seconds: float | None,
    tasks_run: RunInfo | None = None,
) -> str:
    """The Markdown document for one run's checks (MRTR scenarios first, then tasks, then the rest).

    `results` may hold the `tasks-*` scenarios of a `--suite pending` run (`tasks_run` says
    how that run went). The tasks section appears when either is given; a tasks scenario
    missing then is listed as not run.
    """
    mrtr_names = [name for name in MRTR_SCENARIOS if name in results]
    missing = [name for name in MRTR_SCENARIOS if name not in results]
    task_names = [name for name in _TASK_NAMES if name in results]
    others = sorted(name for name in results if name not in MRTR_SCENARIOS and name not in _TASK_NAMES)
    graded_tasks = [name for name in task_names if name != TASKS_ALWAYS_SKIPPED]
    with_tasks = bool(task_names) or tasks_run is not None
    lines = [
        "# Conformance results",
        "",
        f"`{CONFORMANCE_PACKAGE}` (Node `{NODE_PACKAGE}`), server mode, `--suite all --spec-version "
        f"{SPEC_VERSION}`, against `tests/external/conformance/server.py` — mrtr {_version('mrtr')}, "
        f"mcp {_version('mcp')}, run {datetime.date.today().isoformat()}"
        + RunInfo(exit_code, seconds).describe()
        + ".",
        "",
        "Generated by `python tests/external/conformance/summarize.py --run` from the suite's `checks.json` files. "
        "A scenario passes when none of its checks is FAILURE or WARNING (INFO is informational). "
        "Expected failures: `tests/external/conformance/expected-failures.yml`.",
        "",
        "## MRTR (`input-required-result-*`)",
        "",
        _HEADER,
        *(_row(name, results[name]) for name in mrtr_names),
        *(f"| `{name}` | 0/0 | **did not run** | |" for name in missing),
        _subtotal("MRTR", [results[name] for name in mrtr_names]),
        "",
        *(render_tasks(results, tasks_run or RunInfo()) if with_tasks else []),
        "## Other scenarios",
        "",
        _HEADER,
        *(_row(name, results[name]) for name in others),
        _subtotal("Other", [results[name] for name in others]),
        "",
        "## Overall",
        "",
        _HEADER,
        _subtotal("All", [results[name] for name in [*mrtr_names, *graded_tasks, *others]]),
        "",
    ]
    return "\n".join(lines)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("out_dir", nargs="?", type=Path, help="a directory the harness wrote with -o")
    source.add_argument("--run", action="store_true", help="start the fixtures and run both suites now")
    parser.add_argument("--tasks-dir", type=Path, help="with OUT_DIR: a `--suite pending` run's -o directory")
    parser.add_argument("--output", default=str(RESULTS_MD), help="where to write the table ('-': stdout only)")
    args = parser.parse_args(argv)

    main_run = RunInfo()
    tasks_run: RunInfo | None = None
    if args.run:
        npx = find_npx()
        if npx is None:
            print("npx not found: install Node.js (any version; npx fetches Node 22 itself)", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="mrtr-conformance-") as tmp:
            work = Path(tmp)
            with fixture_server(work) as url:
                run = run_server_suite(npx, url, work / "out")
                pending = run_tasks_suite(npx, url, work / "tasks")
            main_run = RunInfo(run.returncode, run.seconds)
            tasks_run = RunInfo(pending.returncode, pending.seconds)
            results = load_checks(run.out_dir)
            task_results = load_checks(pending.out_dir)
            if run.returncode != 0:
                print(run.tail(), file=sys.stderr)
    else:
        results = load_checks(args.out_dir)
        task_results = load_checks(args.tasks_dir) if args.tasks_dir is not None else {}
        tasks_run = RunInfo() if args.tasks_dir is not None else None
    # Only the tasks scenarios of the pending run: its other scenarios ran at other spec versions.
    results = results | {name: checks for name, checks in task_results.items() if name in _TASK_NAMES}
    if not results:
        print("no checks.json found", file=sys.stderr)
        return 2
    document = render(results, exit_code=main_run.exit_code, seconds=main_run.seconds, tasks_run=tasks_run)
    print(document)
    if args.output != "-":
        Path(args.output).write_text(document)
        print(f"written to {args.output}", file=sys.stderr)
    tasks_bad = tasks_failures(results) if tasks_run is not None else {}
    for name, bad in tasks_bad.items():
        print(f"tasks scenario {name} failed: {bad}", file=sys.stderr)
    return 0 if main_run.exit_code in (None, 0) and not tasks_bad else 1


if __name__ == "__main__":
    sys.exit(main())
