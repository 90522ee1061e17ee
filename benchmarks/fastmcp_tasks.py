"""mrtr's durable tasks on FastMCP against FastMCP's own task system, `fastmcp-tasks` (issue 40).

Three variants, each one uvicorn server process on the same machine and the same Redis:

  ft         fastmcp-tasks 4.1.4 (`TasksExtension(url=redis, name=PRIVATE)`: Docket on Redis, its
             worker in the server process), tools `@mcp.tool(task=True)`, driven by FastMCP's own
             `Client` (whose task driver is fastmcp-tasks' client half: `tasks/get` polling at the
             server's advertised interval, `tasks/update` for input).
  mrtr/fm    mrtr's FastMCP adapter, `mrtr.fastmcp.Flows(mcp, store=mrtr.open_store(redis,
             namespace=PRIVATE))`, tools `@flows.tool(task="optional")` (FastMCP 4.2.3, our venv),
             driven by the same FastMCP `Client` as `ft`.
  mrtr/fc    the same mrtr server, driven by mrtr's `FlowClient(url, tasks=True)` (it listens for
             task notifications where the server offers them; this one does: its store brings a bus).
  floor      the floor (issue 49): a hand-written minimal task server on the same Redis
             (`fastmcp_tasks_floor.py`: the SDK's low-level server, one Redis write per state change,
             the work in a background asyncio task; no sealing, no guard, no lease, no push), driven
             by the same `FlowClient` as mrtr/fc, which polls it (`tasks/get`, the advertised 500 ms
             apart; the first poll is sent at once and nearly always finds the task finished).

Every option is left at its default on both sides. Two tools each:
  one_step   fastmcp-tasks: returns `done x` in the background task (Docket's task is the durable unit);
             mrtr: `await mrtr.step("work", ...)` (a journaled step) in the task.
  one_answer fastmcp-tasks: FastMCP's guard pattern (it refuses `await ctx.elicit(...)` in a background
             task): return `InputRequiredResult`, read `ctx.input_responses` when the task re-runs;
             mrtr: the step, then `await ctx.elicit("Go on?", Go)`. The client answers at once.

Figures:
  (1) one-step task, `tools/call` -> completed result, as the client's `call_tool` returns it; p50.
  (2) a task with one answer (create -> input_required -> answer -> completed); p50.
  (3) throughput: 16 concurrent clients (each its own client object, all in one driver process)
      looping `one_step` for a window; completed tasks per second.
  (4) server CPU per task: the server process's utime+stime from /proc over each throughput window,
      divided by the tasks completed in it (the driver's CPU is shown beside it).

Method: (1) and (2) interleave all variants every cycle in rotating order; throughput windows run
round-robin, rotating the order every round, so drift hits all alike. Reported: medians, and each
variant's ratio to fastmcp-tasks measured in the same run (95% bootstrap interval over cycles
for latency; min-max over rounds for throughput), and mrtr/fc's ratio to the floor (`floor:` in
its cell). The machine's load average is printed first and last.

The two clients are driver processes answering line-JSON commands on stdin (`lat`: one timed call;
`load`: a throughput window), the FastMCP one under fastmcp-tasks' venv (`fastmcp_tasks_peer.py
drive`), the FlowClient one under ours (this file, `--drive`).

fastmcp-tasks pins another FastMCP (`fastmcp-slim[server]==4.1.4`; ours is 4.2.3), so it runs from its
own venv, which this script builds when it is missing or its requirements changed:

    python -m venv benchmarks/.venv-fastmcp-tasks              (with this interpreter; gitignored)
    benchmarks/.venv-fastmcp-tasks/bin/python -m pip install -r benchmarks/fastmcp_tasks-requirements.txt

(under a file lock; a stamp holds the digest of the requirements and this Python's version). If it
cannot be built (no registry, say), the `ft` and `mrtr/fm` variants are skipped with the reason, and
mrtr/fc and the floor are measured alone; with CI set, that is a failure (exit 1). `--ft-python PATH`
uses an interpreter you built yourself.

Redis: every run uses private key prefixes (`mrtr_bench_ft_<hex>` for Docket's queue name and for
mrtr's store namespace) and deletes exactly those keys at the end; nothing else is touched.

    python benchmarks/fastmcp_tasks.py [--quick] [--n 200] [--rounds 3] [--seconds 5] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this directory leads sys.path, and its `fastmcp.py` would shadow FastMCP (as in
# benchmarks/fastmcp.py): drop it, and import the shared helpers as `benchmarks.*` from the root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.benchkit import ratio_ci  # noqa: E402
from benchmarks.fastmcp_tasks_drive import drive, run_load, serve_app  # noqa: E402
from fastmcp import Context, FastMCP  # noqa: E402
from mcp.server.request_state import RequestStateSecurity  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import mrtr  # noqa: E402
import mrtr.fastmcp  # noqa: E402

REQUIREMENTS = HERE / "fastmcp_tasks-requirements.txt"
VENV = HERE / ".venv-fastmcp-tasks"
LOCK = HERE / ".venv-fastmcp-tasks.lock"
STAMP = VENV / ".mrtr-bench-stamp"
PEER = HERE / "fastmcp_tasks_peer.py"
INSTALL_TIMEOUT = 600.0
REDIS_URL = "redis://127.0.0.1:6379/0"
KEY_ENV = "MRTR_BENCH_STATE_KEY"
ARGS = {"item": "x"}
EXPECTED = {"one_step": "done x", "one_answer": "go=True"}
QUESTION = "Go on?"
TOOLS = ("one_step", "one_answer")
FT, MRTR_FM, MRTR_FC, FLOOR = "ft", "mrtr/fm", "mrtr/fc", "floor"
LABELS = {
    FT: "fastmcp-tasks 4.1.4",
    MRTR_FM: "mrtr, FastMCP's client",
    MRTR_FC: "mrtr, FlowClient",
    FLOOR: "floor, FlowClient",
}


# -- the mrtr server (child process, our venv) -------------------------------------------------


class Go(BaseModel):
    go: bool


async def work(item: str) -> str:
    return f"done {item}"


def build_mrtr_app(redis_url: str, namespace: str) -> Any:
    security = RequestStateSecurity(keys=[bytes.fromhex(os.environ[KEY_ENV])])
    mcp: FastMCP[Any] = FastMCP("ft-bench", request_state_security=security)
    flows = mrtr.fastmcp.Flows(mcp, store=mrtr.open_store(redis_url, namespace=namespace))

    @flows.tool(task="optional")
    async def one_step(item: str, ctx: Context) -> str:
        """The work, once: a journaled step of a durable task."""
        result: str = await mrtr.step("work", work, item)
        return result

    @flows.tool(task="optional")
    async def one_answer(item: str, ctx: Context) -> str:
        """The step, then one question: the task parks `input_required` until the answer comes."""
        await mrtr.step("work", work, item)
        answer = await ctx.elicit(QUESTION, response_type=Go)
        data = getattr(answer, "data", None)
        return f"go={isinstance(data, Go) and data.go}"

    return flows.http_app()


def serve_mrtr(redis_url: str, namespace: str) -> None:
    serve_app(build_mrtr_app(redis_url, namespace))


def serve_floor(redis_url: str, prefix: str) -> None:
    from benchmarks.fastmcp_tasks_floor import build_floor_app

    serve_app(build_floor_app(redis_url, prefix)[0])


# -- the FlowClient driver (child process, our venv) -------------------------------------------


class FlowClientDriver:
    """`lat` and `load` commands (see `fastmcp_tasks_peer_protocol`) with mrtr's FlowClient."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self.stack = stack
        self.clients: dict[str, Any] = {}

    @staticmethod
    def client(url: str) -> Any:
        import mcp_types as t

        from mrtr.client import FlowClient

        async def elicit(params: Any) -> t.ElicitResult:
            if params.message != QUESTION:
                raise RuntimeError(f"unexpected question {params.message!r}")
            return t.ElicitResult(action="accept", content={"go": True})

        return FlowClient(url, tasks=True, elicit=elicit)

    async def call(self, client: Any, tool: str) -> None:
        result = await client.call_tool(tool, ARGS)
        text = "".join(getattr(block, "text", "") for block in result.content)
        if text != EXPECTED[tool]:
            raise RuntimeError(f"{tool} returned {text!r}, expected {EXPECTED[tool]!r}")

    async def lat(self, url: str, tool: str) -> dict[str, Any]:
        if url not in self.clients:
            self.clients[url] = await self.stack.enter_async_context(self.client(url))
        start = time.perf_counter()
        await self.call(self.clients[url], tool)
        return {"s": time.perf_counter() - start}

    async def load(self, url: str, tool: str, clients: int, warmup: float, seconds: float) -> None:
        await run_load(lambda: self.client(url), lambda c: self.call(c, tool), clients, warmup, seconds)


# -- the fastmcp-tasks venv ----------------------------------------------------------------------


class VenvUnavailable(Exception):
    """fastmcp-tasks' venv could not be built; the message says why (and how it was tried)."""


def _run(argv: Sequence[str | Path], what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    try:
        done = subprocess.run(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VenvUnavailable(f"{what}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
        raise VenvUnavailable(f"{what} failed ({done.returncode}):\n    " + "\n    ".join(tail))


def ensure_venv() -> Path:
    """fastmcp-tasks' interpreter: the venv, (re)built from the pinned requirements when they changed."""
    python = VENV / "bin" / "python"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes() + b"\0" + sys.version.encode()).hexdigest()
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and STAMP.exists() and STAMP.read_text() == wanted:
            return python
        create = [sys.executable, "-m", "venv", VENV]
        install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", REQUIREMENTS]
        print(f"building fastmcp-tasks' venv: {' '.join(map(str, create))}; {' '.join(map(str, install))}", flush=True)
        shutil.rmtree(VENV, ignore_errors=True)
        _run(create, " ".join(map(str, create)))
        _run(install, " ".join(map(str, install)))
        STAMP.write_text(wanted)
        return python


# -- processes (parent) ----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """A process's utime + stime so far (/proc/PID/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def foreign_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Server:
    label: str
    url: str
    pid: int


@contextlib.asynccontextmanager
async def spawn_server(label: str, argv: Sequence[str | Path], env: dict[str, str], log: Path) -> AsyncIterator[Server]:
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *map(str, argv), stdout=asyncio.subprocess.PIPE, stderr=err, stdin=asyncio.subprocess.DEVNULL, env=env
        )
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        except TimeoutError:
            line = b""
        if not line.strip().isdigit():
            raise RuntimeError(
                f"{label} server did not report a port (got {line!r}); its log:\n{log.read_text()[-3000:]}"
            )
        drain = asyncio.create_task(proc.stdout.read())
        yield Server(label, f"http://127.0.0.1:{int(line)}/mcp", proc.pid)
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), timeout=10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(drain, timeout=5)


class DriverProc:
    """A driver process: one JSON command line in, one JSON answer line out (plus `phase` lines in `load`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout=timeout)
        if not raw:
            raise RuntimeError(f"driver {self.proc.pid} exited ({self.proc.returncode})")
        answer: dict[str, Any] = json.loads(raw)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    async def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()

    async def lat(self, url: str, tool: str) -> float:
        await self.send(op="lat", url=url, tool=tool)
        return float((await self._line(60))["s"])

    async def load(self, url: str, tool: str, clients: int, warmup: float, seconds: float, server_pid: int) -> Load:
        await self.send(op="load", url=url, tool=tool, clients=clients, warmup=warmup, seconds=seconds)
        await self._line(warmup + 60)  # {"phase": "start"}
        cpu, own, wall = cpu_seconds(server_pid), cpu_seconds(self.proc.pid), time.perf_counter()
        machine = _machine_busy()
        answer = await self._line(seconds + 60)
        cpu, own, wall = cpu_seconds(server_pid) - cpu, cpu_seconds(self.proc.pid) - own, time.perf_counter() - wall
        busy = _machine_busy() - machine
        return Load(answer["done"], answer["s"], cpu, own, busy / wall, answer["errors"], answer["first_error"])


def _machine_busy() -> float:
    """Seconds of CPU the whole machine has been busy (all cores), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def spawn_driver(argv: Sequence[str | Path], env: dict[str, str], log: Path) -> AsyncIterator[DriverProc]:
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *map(str, argv), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err, env=env
        )
    try:
        yield DriverProc(proc)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                await DriverProc(proc).send(op="quit")
                await asyncio.wait_for(proc.wait(), timeout=10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@dataclass
class Load:
    done: int
    seconds: float
    server_cpu: float
    driver_cpu: float
    machine_cores: float
    errors: int
    first_error: str | None

    @property
    def rate(self) -> float:
        return self.done / self.seconds

    @property
    def cpu_per_task(self) -> float:
        return self.server_cpu / self.done if self.done else float("nan")


@dataclass
class Results:
    lat: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    loads: dict[str, list[Load]] = field(default_factory=dict)


async def drop_keys(prefix: str) -> int:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
        return len(keys)
    finally:
        await client.aclose()


async def count_keys(prefix: str) -> int:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        return len([key async for key in client.scan_iter(match=f"{prefix}*", count=1000)])
    finally:
        await client.aclose()


# -- the run -------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, ft_python: Path | None, workdir: Path) -> Results:
    namespace = f"mrtr_bench_ft_{secrets.token_hex(4)}"
    ft_ns, mrtr_ns, floor_ns = f"{namespace}_docket", f"{namespace}_mrtr", f"{namespace}_floor"
    print(
        f"Redis {REDIS_URL}: fastmcp-tasks' Docket queue {ft_ns!r}, mrtr's store namespace {mrtr_ns!r}, "
        f"the floor's key prefix {floor_ns!r}"
    )
    env = {**os.environ, KEY_ENV: os.urandom(32).hex()}
    ours = [sys.executable, str(Path(__file__).resolve())]
    results = Results()
    try:
        async with AsyncExitStack() as stack:
            mrtr_server = await stack.enter_async_context(
                spawn_server("mrtr", [*ours, "--serve", REDIS_URL, mrtr_ns], env, workdir / "mrtr-server.log")
            )
            floor_server = await stack.enter_async_context(
                spawn_server("floor", [*ours, "--serve-floor", REDIS_URL, floor_ns], env, workdir / "floor-server.log")
            )
            fc = await stack.enter_async_context(spawn_driver([*ours, "--drive"], env, workdir / "fc-driver.log"))
            servers = {MRTR_FC: mrtr_server, FLOOR: floor_server}
            drivers = {MRTR_FC: fc, FLOOR: fc}
            if ft_python is not None:
                ft_server = await stack.enter_async_context(
                    spawn_server(
                        "fastmcp-tasks",
                        [ft_python, PEER, "serve", REDIS_URL, ft_ns],
                        foreign_env(),
                        workdir / "ft-server.log",
                    )
                )
                fm = await stack.enter_async_context(
                    spawn_driver([ft_python, PEER, "drive"], foreign_env(), workdir / "fm-driver.log")
                )
                servers = {FT: ft_server, MRTR_FM: mrtr_server, MRTR_FC: mrtr_server, FLOOR: floor_server}
                drivers = {FT: fm, MRTR_FM: fm, MRTR_FC: fc, FLOOR: fc}
            variants = list(servers)
            pids = ", ".join(f"{s.label} {s.pid}" for s in {s.pid: s for s in servers.values()}.values())
            print(f"server processes: {pids}")
            for variant in (MRTR_FM, MRTR_FC):  # each mrtr client really makes tasks (not inline calls)
                if variant in variants:
                    before = await count_keys(mrtr_ns)
                    await drivers[variant].lat(servers[variant].url, "one_step")
                    if await count_keys(mrtr_ns) <= before:
                        raise RuntimeError(f"{LABELS[variant]}: the call left no task in mrtr's store (ran inline?)")
            cells = [(v, tool) for v in variants for tool in TOOLS]
            results.lat = {cell: [] for cell in cells}
            print(f"(1)+(2) latency: {args.warmup} warm-up + {args.n} timed cycles, every variant and tool per cycle")
            for cycle in range(args.warmup + args.n):
                shift = cycle % len(cells)
                for variant, tool in cells[shift:] + cells[:shift]:
                    took = await drivers[variant].lat(servers[variant].url, tool)
                    if cycle >= args.warmup:
                        results.lat[(variant, tool)].append(took)
            print(
                f"(3)+(4) throughput: {args.clients} clients x {args.seconds:g} s windows "
                f"(+{args.tp_warmup:g} s warm-up each), {args.rounds} round(s), order rotating"
            )
            results.loads = {v: [] for v in variants}
            for rnd in range(args.rounds):
                shift = rnd % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    load = await drivers[variant].load(
                        servers[variant].url,
                        "one_step",
                        args.clients,
                        args.tp_warmup,
                        args.seconds,
                        servers[variant].pid,
                    )
                    results.loads[variant].append(load)
                    note = f"; {load.errors} errors, first: {load.first_error}" if load.errors else ""
                    print(
                        f"  round {rnd + 1} {LABELS[variant]:<24} {load.rate:7.1f} tasks/s  server CPU "
                        f"{load.cpu_per_task * 1e3:6.2f} ms/task  driver CPU "
                        f"{load.driver_cpu / max(load.done, 1) * 1e3:6.2f} ms/task  "
                        f"machine {load.machine_cores:.2f} cores busy{note}",
                        flush=True,
                    )
                    if load.errors:
                        raise RuntimeError(f"{LABELS[variant]}: {load.errors} calls failed: {load.first_error}")
    finally:
        for log in sorted(workdir.glob("*.log")):
            text = log.read_text(errors="replace").strip().splitlines()
            if text:
                print(f"  {log.name}, {len(text)} lines; last {min(6, len(text))}:")
                for line in text[-6:]:
                    print(f"    | {line[:200]}")
        dropped = await drop_keys(namespace)
        print(f"cleanup: deleted {dropped} Redis keys under {namespace}*")
    return results


def report(results: Results, rng: random.Random) -> None:
    variants = list(results.loads) or sorted({v for v, _ in results.lat})
    base = FT if FT in variants else None
    print(
        "\nSummary (medians; ratio = variant / fastmcp-tasks measured in the same run, 95% bootstrap interval; "
        "floor = mrtr/fc / the floor, same run)"
    )
    head = "".join(f"{LABELS[v]:>52}" for v in variants)
    print(f"  {'figure':<34}{head}")
    for tool, what in (("one_step", "(1) one-step task, p50"), ("one_answer", "(2) task with one answer, p50")):
        cells = []
        for v in variants:
            values = results.lat[(v, tool)]
            text = f"{statistics.median(values) * 1e3:.2f} ms"
            parts = []
            if base is not None and v != base:
                den = results.lat[(base, tool)]
                lo, hi = ratio_ci(values, den, rng)
                parts.append(f"{statistics.median(values) / statistics.median(den):.2f}x, {lo:.2f}-{hi:.2f}")
            if v == MRTR_FC and FLOOR in variants:
                den = results.lat[(FLOOR, tool)]
                parts.append(f"floor {statistics.median(values) / statistics.median(den):.2f}x")
            cells.append(text + (f" ({'; '.join(parts)})" if parts else ""))
        print(f"  {what:<34}" + "".join(f"{c:>52}" for c in cells))
    for what, get, unit, fmt in (
        ("(3) throughput, tasks/s", lambda ld: ld.rate, "/s", "{:.0f}"),
        ("(4) server CPU per task", lambda ld: ld.cpu_per_task * 1e3, " ms", "{:.2f}"),
    ):
        cells = []
        for v in variants:
            values = [get(ld) for ld in results.loads[v]]
            text = fmt.format(statistics.median(values)) + unit
            parts = []
            for other, name in ((base, ""), (FLOOR if v == MRTR_FC else None, "floor ")):
                if other is None or other == v or other not in variants:
                    continue
                den = [get(ld) for ld in results.loads[other]]
                ratios = [a / b for a, b in zip(values, den, strict=True)]
                part = f"{name}{statistics.median(values) / statistics.median(den):.2f}x"
                parts.append(part + (f", {min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""))
            cells.append(text + (f" ({'; '.join(parts)})" if parts else ""))
        print(f"  {what:<34}" + "".join(f"{c:>52}" for c in cells))
    drivers = "".join(
        f"{statistics.median(ld.driver_cpu / max(ld.done, 1) for ld in results.loads[v]) * 1e3:>49.2f} ms"
        for v in variants
    )
    print(f"  {'    client driver CPU per task':<34}{drivers}")


async def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    print(
        f"fastmcp-tasks comparison: mrtr {version('mrtr')}, FastMCP {version('fastmcp')} (ours), mcp {version('mcp')}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} "
        f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
    )
    failed = False
    ft_python: Path | None = Path(args.ft_python) if args.ft_python else None
    if ft_python is None and not args.mrtr_only:
        try:
            ft_python = await asyncio.to_thread(ensure_venv)
        except VenvUnavailable as exc:
            ci = bool(os.environ.get("CI"))
            what = "FAILED (CI is set: the venv must build)" if ci else "SKIPPED"
            print(f"fastmcp-tasks and mrtr/fm: {what}: its venv could not be built: {exc}")
            failed = ci
    if ft_python is not None:
        probe = subprocess.run(
            [
                str(ft_python),
                "-c",
                "from importlib.metadata import version as v; print(v('fastmcp-tasks'), v('fastmcp-slim'))",
            ],
            capture_output=True,
            text=True,
            env=foreign_env(),
            check=False,
        )
        print(
            f"fastmcp-tasks venv {ft_python}: fastmcp-tasks, fastmcp-slim = "
            f"{probe.stdout.strip() or probe.stderr[-300:]}"
        )
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"mrtr-ft-bench-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        results = await measure(args, ft_python, workdir)
    except Exception as exc:
        print(f"FAILED: {type(exc).__name__}: {exc}")
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(results, random.Random(40))
    load = os.getloadavg()
    print(
        f"\nload average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"measured in {time.perf_counter() - started:.0f} s"
    )
    return 1 if failed else 0


DEFAULTS: dict[str, Any] = {"n": 200, "warmup": 20, "rounds": 3, "seconds": 5.0, "tp_warmup": 1.0}
QUICK: dict[str, Any] = {"n": 10, "warmup": 3, "rounds": 1, "seconds": 1.0, "tp_warmup": 0.3}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: n=10, one 1 s throughput round")
    parser.add_argument("--n", type=int, default=None, help="timed latency cycles (default 200)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed cycles first (default 20)")
    parser.add_argument("--rounds", type=int, default=None, help="throughput rounds, each variant once (default 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per throughput window (default 5)")
    parser.add_argument("--tp-warmup", type=float, default=None, help="seconds of load before each window (default 1)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients in throughput (default 16)")
    parser.add_argument("--ft-python", default=None, help="fastmcp-tasks' interpreter (default: build the venv)")
    parser.add_argument(
        "--mrtr-only", action="store_true", help="measure mrtr/fc and the floor only (no fastmcp-tasks venv)"
    )
    parser.add_argument("--serve", nargs=2, metavar=("REDIS_URL", "NAMESPACE"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", nargs=2, metavar=("REDIS_URL", "PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def _entry() -> int:
    args = parse_args()
    if args.serve:
        serve_mrtr(*args.serve)
        return 0
    if args.serve_floor:
        serve_floor(*args.serve_floor)
        return 0
    if args.drive:
        asyncio.run(drive(FlowClientDriver))
        return 0
    return asyncio.run(main(args))


if __name__ == "__main__":
    sys.exit(_entry())
