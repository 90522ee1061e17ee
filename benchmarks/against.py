"""Run benchmarks against an earlier mrtr in the same run: this tree's `src/` vs a git ref's.

A shared machine drifts by tens of percent between runs, so "before" and "after" measured
an hour apart say little. This script exports `src/` of `--base` (default `main`) into a
temporary directory and runs each benchmark script alternately on that tree and on this
one (`PYTHONPATH` puts the tree's `src` first; the benchmark scripts, their helpers and the
installed SDKs are the same for both), `--runs` times, swapping the order every run. Each
script ends with a `SUMMARY` line (`--summary`); the table shows the median of each figure
over the runs for both trees and their ratio (this tree / base). Server subprocesses (the
HTTP transports) inherit the environment, so they run the same tree as their client.

Run: `.venv/bin/python benchmarks/against.py [--base REF] [--runs 3] [--quick] [--scripts rounds,replay,fastmcp]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"rounds": "benchmarks/rounds.py", "replay": "benchmarks/replay.py", "fastmcp": "benchmarks/fastmcp.py"}


def export_src(ref: str, into: Path) -> Path:
    """`src/` as committed at `ref`, unpacked under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def run_script(script: str, src: Path, extra: list[str]) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    run = subprocess.run(
        [sys.executable, script, "--summary", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("SUMMARY ")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"{script} on {src} failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(lines[-1].removeprefix("SUMMARY "))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description="Benchmarks on this tree vs a git ref, alternating, in one run.")
    parser.add_argument("--base", default="main", help="git ref whose src/ is the baseline (default: main)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree and script (default 3)")
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script (smoke run)")
    parser.add_argument("--scripts", default=",".join(SCRIPTS), help=f"comma-separated, of {','.join(SCRIPTS)}")
    parser.add_argument("--args", default="", help="extra arguments for every script (e.g. '--n 500')")
    args = parser.parse_args()
    extra = (["--quick"] if args.quick else []) + args.args.split()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mrtr-base-") as tmp:
        trees = {"base": export_src(args.base, Path(tmp)), "this": ROOT / "src"}
        print(f"base = {args.base} ({trees['base']}), this = {trees['this']}; {args.runs} runs each, alternating")
        for name in args.scripts.split(","):
            script = SCRIPTS[name]
            results: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
            for run in range(args.runs):
                for tree in ("base", "this") if run % 2 == 0 else ("this", "base"):
                    results[tree].append(run_script(script, trees[tree], extra))
                    print(f"  {name} run {run + 1} {tree}: done", flush=True)
            report(name, results)
    print(f"\nmeasured in {time.perf_counter() - started:.0f}s")
    return 0


def report(name: str, results: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{name}: median over {len(results['this'])} runs per tree (base = {len(results['base'])} runs)")
    print(f"  {'figure':<36} {'base':>10} {'this':>10} {'this/base':>10}")
    for figure in results["this"][0]:
        values = [r[figure] for r in results["base"] if figure in r]
        base = statistics.median(values) if values else 0.0
        this = statistics.median(r[figure] for r in results["this"])
        change = f"{this / base:>10.3f}" if base else f"{'-':>10}"
        print(f"  {figure:<36} {base:>10.3f} {this:>10.3f} {change}")


if __name__ == "__main__":
    sys.exit(main())
