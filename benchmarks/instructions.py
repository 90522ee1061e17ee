"""Instructions per call, counted by valgrind's callgrind: the hot path's cost whatever the load.

On a shared 2-core machine even the CPU clock (`ab.py --clock cpu`) moves by tens of percent
with what else runs (caches, frequency). The number of instructions a call executes does
not: run under callgrind, with hash randomization fixed, it repeats within ~0.5% (about
15,000 instructions a 2-round call, from addresses, random ids and clock digits).

Each case runs in its own process under `valgrind --tool=callgrind`, counting only the timed
calls (collection switched on and off around them with `callgrind_control`):

  * (c) `rounds.py`'s 2-round tool as an mrtr flow, and (d) the hand-written floor, both on
    the SDK's `MCPServer` in process with the official client (`ab.py`'s servers): mrtr's
    cost over the floor per 2-round call, in instructions (client and server together, as the
    floor's share cancels);
  * the 100-round loop, per request, against the 2-round tool per request.

Instructions are not time: C code (zlib, base64, pydantic-core) runs several instructions a
cycle, the interpreter's loop about one, so a ratio of instructions overstates what the long
loop's byte-handling costs in time. Read them to compare two trees (`--base`), not as ms.

Run: `PYTHONPATH=src .venv/bin/python benchmarks/instructions.py [--base REF] [--calls N]`
(~2 minutes per case and tree; valgrind must be installed).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = ("two", "floor", "loop")


def child(case: str, calls: int, ref: str | None) -> None:
    """Inside valgrind: build the server, warm up, count `calls` calls of `case`."""
    sys.path.insert(0, str(HERE))
    import ab

    if ref is None:
        import mrtr as lib

        engine = "this"
    else:
        lib = ab.load_base(ref, Path(tempfile.mkdtemp(prefix="mrtr-instr-")))
        engine = "base"

    async def run() -> None:
        server = ab.build_server(engine, lib)
        async with ab.new_client(server) as client:
            args: dict[str, Any] = {"service": "api"} if case != "loop" else {}
            call = ab._tool_call(client, case, args)
            for _ in range(3 if case == "loop" else 20):
                await call()
            gc.collect()
            toggle("on")
            for _ in range(calls):
                await call()
            toggle("off")

    asyncio.run(run())


def toggle(state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], capture_output=True, check=False)


def count(case: str, calls: int, ref: str | None) -> int:
    """Instructions of `calls` calls of `case`, counted in a child process under callgrind."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        case,
        "--calls",
        str(calls),
    ]
    if ref is not None:
        command += ["--base", ref]
    env = os.environ | {"PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {case} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def measure(calls: int, ref: str | None, loops: bool) -> dict[str, float]:
    cases = CASES if loops else ("two", "floor")
    per_call = {case: count(case, max(1, calls // 100) if case == "loop" else calls, ref) for case in cases}
    two = per_call["two"] / calls
    floor = per_call["floor"] / calls
    figures = {
        "(c) 2-round tool, instructions per call": two,
        "(d) floor, instructions per call": floor,
        "(c) over (d), instructions per call": two - floor,
        "(c)/(d)": two / floor,
    }
    if loops:
        loop = per_call["loop"] / max(1, calls // 100)
        figures["100-round loop, instructions per request"] = loop / 101
        figures["loop/1-round per request (instructions)"] = (loop / 101) / (two / 2)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description="Instructions per call of the hot path, counted by callgrind.")
    parser.add_argument("--base", help="also count a git ref's engine (as ab.py imports it)")
    parser.add_argument("--calls", type=int, default=200, help="counted calls of (c) and (d); the loop runs calls/100")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 calls of (c) and (d), no loop")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.calls = 5
    if args.child:
        child(args.child, args.calls, args.base)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    trees: dict[str, str | None] = {"this": None}
    if args.base:
        trees = {"base": args.base, "this": None}
    figures = {name: measure(args.calls, ref, not args.quick) for name, ref in trees.items()}
    loops = "no loop" if args.quick else f"loop x{max(1, args.calls // 100)}"
    print(f"instructions per call (callgrind, PYTHONHASHSEED=0, {args.calls} calls, {loops})")
    print(f"  {'figure':<44} " + " ".join(f"{name:>12}" for name in figures) + ("   this/base" if args.base else ""))
    for figure in figures["this"]:
        values = [figures[name][figure] for name in figures]
        cells = " ".join(f"{value:>12,.0f}" if value > 100 else f"{value:>12.3f}" for value in values)
        ratio = f"   {values[-1] / values[0]:>9.3f}" if args.base else ""
        print(f"  {figure:<44} {cells}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
