"""The written floor of a durable task (issue 49): what mrtr spends per task, next to a hand-written server.

Counts, per one-step task and per task with one answer, for mrtr (`benchmarks/fastmcp_tasks.py`'s
server: FastMCP + `mrtr.fastmcp.Flows` on Redis, every option at its default, so sealing at rest
and the replay guard are on) and for the floor (`benchmarks/fastmcp_tasks_floor.py`: the SDK's
low-level server, one Redis write per state change, no sealing, no guard), both driven by mrtr's
`FlowClient(url, tasks=True)`:

  HTTP exchanges      requests the server answered, by JSON-RPC method (an ASGI counter around the
                      app); a listen stream is one exchange however many tasks it carries
  Redis commands run  `INFO commandstats` deltas of a PRIVATE redis-server this script starts on a
                      free port (never the shared one), by command: those sent, and those run
                      inside Lua scripts
  Redis commands sent commands the clients packed (`pack_command`; a script call is one, a pipeline
                      or transaction counts each of its commands and MULTI/EXEC)
  Redis round trips   writes to a Redis socket (`send_packed_command`: one per command, one per
                      pipeline or transaction), counted in this process
  encodings           task records to/from JSON (`TaskRecord.to_json`/`from_json`), journals
                      (`journal.encode`/`decode`); the floor's `json.dumps`/`json.loads`
  Redis CPU           the private redis-server's own CPU (`INFO cpu`, user + system), per task: noisy
                      in these short sequential windows (the idle rate is subtracted)
  seals               AEAD seals and opens (`AESGCMRequestStateCodec.seal`/`unseal`: records at rest,
                      request state, callback tokens alike)

Server and client run in this one process (uvicorn in the same event loop), so each count is
exact and nothing else talks to the private Redis. A window runs N tasks one after another, waits
for the server to go quiet, and divides; the background work a window includes (mrtr's scan for
orphaned or due tasks, once a second) is shown as its own row, per second idle.

Then what each costs on this machine, in the same run: one MCP exchange (the floor's static
`tools/list`, client and server in this process), one Redis round trip (`PING`), one record encoding and one seal of the
record a finished one-step task holds, and each variant's p50 per task over the window.

    python benchmarks/task_floor.py [--quick] [--n 100] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this directory leads sys.path, and its `fastmcp.py` would shadow FastMCP (as in
# benchmarks/fastmcp_tasks.py): drop it, and import `benchmarks.*` and `tests.*` from the root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import benchmarks.fastmcp_tasks_floor as floor_module  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
import uvicorn  # noqa: E402
from benchmarks.fastmcp_tasks import KEY_ENV, TOOLS, FlowClientDriver, build_mrtr_app  # noqa: E402
from mcp.server.request_state import AESGCMRequestStateCodec  # noqa: E402
from redis.asyncio.connection import AbstractConnection, Connection  # noqa: E402
from tests.support.redis_proc import RedisProcess  # noqa: E402

from mrtr._engine import journal as journal_codec  # noqa: E402
from mrtr.stores._base import TaskRecord  # noqa: E402
from mrtr.stores._sealed import RecordSeal  # noqa: E402

MRTR, FLOOR = "mrtr/fc", "floor"
VARIANTS = (MRTR, FLOOR)
QUIET = 0.3
"""Seconds after a window's last task before its counters are read (work that follows the answer)."""


# -- counters ----------------------------------------------------------------------------------------


@dataclass
class Counts:
    """Everything counted in this process and at the private Redis."""

    http: Counter[str] = field(default_factory=Counter)
    trips: int = 0
    calls: Counter[str] = field(default_factory=Counter)

    def snapshot(self, commands: Counter[str]) -> Counter[str]:
        out: Counter[str] = Counter({f"http {k}": v for k, v in self.http.items()})
        out["http"] = sum(self.http.values())
        out["redis round trips"] = self.trips
        out.update(self.calls)
        out.update({f"redis {k}": v for k, v in commands.items()})
        out["redis commands"] = sum(commands.values())
        return out


COUNTS = Counts()


class CountingApp:
    """An ASGI wrapper that counts each HTTP request the server answers, by its JSON-RPC method."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        counted = False

        async def reading() -> Any:
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request" and not counted:
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    counted = True
                    try:
                        method = json.loads(body).get("method", "?")
                    except (ValueError, AttributeError):
                        method = "?"
                    COUNTS.http[f"{scope['method']} {method}"] += 1
            return message

        await self.app(scope, reading, send)
        if not counted:
            COUNTS.http[str(scope["method"])] += 1


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """Count Redis socket writes, record and journal encodings, seals; restore everything after."""
    patches: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, label: str, *, classmethod_: bool = False) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        func = original.__func__ if classmethod_ else original

        def counted(*args: Any, **kwargs: Any) -> Any:
            COUNTS.calls[label] += 1
            return func(*args, **kwargs)

        patches.append((owner, name, original))
        setattr(owner, name, classmethod(counted) if classmethod_ else counted)

    original_send = AbstractConnection.send_packed_command

    async def send_packed_command(self: Any, *args: Any, **kwargs: Any) -> None:
        COUNTS.trips += 1
        await original_send(self, *args, **kwargs)

    patches.append((AbstractConnection, "send_packed_command", original_send))
    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    wrap(TaskRecord, "to_json", "record to JSON")
    wrap(TaskRecord, "from_json", "record from JSON", classmethod_=True)
    wrap(journal_codec, "encode", "journal encode")
    wrap(journal_codec, "decode", "journal decode")
    wrap(AESGCMRequestStateCodec, "seal", "AEAD seal")
    wrap(AESGCMRequestStateCodec, "unseal", "AEAD open")
    packer = next(cls for cls in Connection.__mro__ if "pack_command" in cls.__dict__)
    wrap(packer, "pack_command", "redis commands sent")  # pipelines pack each of theirs through it
    floor_json = floor_module.json

    class CountingJson:
        @staticmethod
        def dumps(*args: Any, **kwargs: Any) -> str:
            COUNTS.calls["floor json.dumps"] += 1
            return floor_json.dumps(*args, **kwargs)

        @staticmethod
        def loads(*args: Any, **kwargs: Any) -> Any:
            COUNTS.calls["floor json.loads"] += 1
            return floor_json.loads(*args, **kwargs)

    patches.append((floor_module, "json", floor_json))
    floor_module.json = CountingJson  # type: ignore[assignment]
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


# -- servers in this process ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve `app` (wrapped in the counter) with uvicorn in this event loop; yields its MCP URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(CountingApp(app), log_level="warning", access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
        sock.close()


@dataclass
class Window:
    """One variant's tool, N tasks: what was counted, per task, and the time each took."""

    per_task: dict[str, float]
    seconds: list[float]


async def counted(redis: aioredis.Redis) -> Counter[str]:
    """Everything counted so far: in this process, and at the private Redis (its commands and CPU)."""
    info = await redis.info("commandstats", "cpu")
    stats = {k.removeprefix("cmdstat_"): v for k, v in info.items() if k.startswith("cmdstat_")}
    commands = Counter({k: int(v["calls"]) for k, v in stats.items()})
    out = COUNTS.snapshot(commands)
    out["redis cpu us"] = round((float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6)
    return out


def difference(after: Counter[str], before: Counter[str]) -> Counter[str]:
    """What a window added, less the `INFO` that read the counters at its start."""
    delta = Counter({k: v - before.get(k, 0) for k, v in after.items()})
    delta.subtract({"redis info": 1, "redis commands": 1, "redis round trips": 1, "redis commands sent": 1})
    return delta


async def window(client: Any, tool: str, n: int, redis: aioredis.Redis, idle_per_s: Counter[str]) -> Window:
    before = await counted(redis)
    started = time.perf_counter()
    seconds = []
    for _ in range(n):
        t0 = time.perf_counter()
        await FlowClientDriver.call(None, client, tool)  # type: ignore[arg-type]
        seconds.append(time.perf_counter() - t0)
    await asyncio.sleep(QUIET)
    elapsed = time.perf_counter() - started
    delta = difference(await counted(redis), before)
    per_task = {k: max(v - idle_per_s.get(k, 0) * elapsed, 0.0) / n for k, v in delta.items() if v > 0}
    return Window(per_task, seconds)


async def idle_rate(redis: aioredis.Redis, seconds: float) -> Counter[str]:
    """What a server does per second with no task: counted over `seconds` of quiet."""
    before = await counted(redis)
    await asyncio.sleep(seconds)
    delta = difference(await counted(redis), before)
    return Counter({k: v / seconds for k, v in delta.items() if v > 0})


@dataclass
class Measured:
    windows: dict[tuple[str, str], Window] = field(default_factory=dict)
    idle: dict[str, Counter[str]] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)


async def measure_variant(
    variant: str, redis_url: str, redis: aioredis.Redis, n: int, idle_seconds: float, out: Measured
) -> None:
    prefix = f"mrtr_floor_{secrets.token_hex(4)}"
    if variant == MRTR:
        app = build_mrtr_app(redis_url, prefix)
    else:
        app, _ = floor_module.build_floor_app(redis_url, prefix)
    async with serving(app) as url, FlowClientDriver.client(url) as client:
        for tool in TOOLS:  # warm up: connections, listen-ahead batches, imports
            for _ in range(5):
                await FlowClientDriver.call(None, client, tool)  # type: ignore[arg-type]
        await asyncio.sleep(QUIET)
        out.idle[variant] = await idle_rate(redis, idle_seconds)
        for tool in TOOLS:
            out.windows[(variant, tool)] = await window(client, tool, n, redis, out.idle[variant])
        if variant == FLOOR:  # one MCP exchange with next to no work behind it, client and server here
            lists = []
            for _ in range(max(n, 50)):
                t0 = time.perf_counter()
                await client.session.list_tools()
                lists.append(time.perf_counter() - t0)
            out.costs["MCP exchange (floor's tools/list, client+server)"] = statistics.median(lists)


async def unit_costs(redis: aioredis.Redis, out: Measured) -> None:
    """Redis PING, and encoding and sealing a record as a finished one-step task holds it."""
    trips = []
    for _ in range(200):
        t0 = time.perf_counter()
        await redis.ping()
        trips.append(time.perf_counter() - t0)
    out.costs["Redis round trip (PING)"] = statistics.median(trips)
    seal = RecordSeal.from_keys([os.urandom(32)])
    record = await finished_record(redis)
    sealed = seal.seal(record)
    text = sealed.to_json()
    for label, fn in (
        ("record to JSON (sealed)", sealed.to_json),
        ("record from JSON (sealed)", lambda: TaskRecord.from_json(text)),
        ("seal a record (AEAD)", lambda: seal.seal(record)),
        ("open a record (AEAD)", lambda: seal.open(sealed)),
        ("journal decode", lambda: journal_codec.decode(record.journal)),
    ):
        out.costs[label] = timed(fn)
    floor_record = {"taskId": "x" * 24, "status": "completed", "createdAt": "2026-01-01T00:00:00.000Z",
                    "lastUpdatedAt": "2026-01-01T00:00:00.000Z", "ttlMs": 3600000, "pollIntervalMs": 500,
                    "result": {"content": [{"type": "text", "text": "done x"}], "isError": False}}  # fmt: skip
    floor_text = json.dumps(floor_record, separators=(",", ":"))
    out.costs["floor record json.dumps"] = timed(lambda: json.dumps(floor_record, separators=(",", ":")))
    out.costs["floor record json.loads"] = timed(lambda: json.loads(floor_text))


async def finished_record(redis: aioredis.Redis) -> TaskRecord:
    """A completed one-step task's record, opened: any one mrtr left in the private Redis."""
    seal = None
    async for key in redis.scan_iter(match="mrtr_floor_*", count=1000):
        if await redis.type(key) != b"string":
            continue
        raw = await redis.get(key)
        with contextlib.suppress(Exception):
            record = TaskRecord.from_json(raw)
            if record.status == "completed" and record.flow == "one_step":
                if record.sealed:
                    seal = seal or RecordSeal.from_keys([bytes.fromhex(os.environ[KEY_ENV])])
                    record = seal.open(record)
                return record
    raise RuntimeError("no finished one_step record found in the private Redis")


def timed(fn: Callable[[], Any], repeat: int = 2000) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat // 5):
            fn()
        samples.append((time.perf_counter() - t0) / (repeat // 5))
    return min(samples)


# -- the table -------------------------------------------------------------------------------------------


NAMED = ("tools/call", "tasks/get", "tasks/update", "subscriptions/listen")
TOTALS = ("redis commands", "redis round trips", "redis commands sent", "redis cpu us")
ROWS: list[tuple[str, Callable[[dict[str, float]], float]]] = [
    ("HTTP exchanges", lambda c: c.get("http", 0.0)),
    ("  tools/call", lambda c: c.get("http POST tools/call", 0.0)),
    ("  tasks/get", lambda c: c.get("http POST tasks/get", 0.0)),
    ("  tasks/update", lambda c: c.get("http POST tasks/update", 0.0)),
    ("  subscriptions/listen", lambda c: c.get("http POST subscriptions/listen", 0.0)),
    ("  other", lambda c: c.get("http", 0.0) - sum(c.get(f"http POST {m}", 0.0) for m in NAMED)),
    ("Redis round trips", lambda c: c.get("redis round trips", 0.0)),
    ("Redis commands sent", lambda c: c.get("redis commands sent", 0.0)),
    ("Redis commands run (scripts' too)", lambda c: c.get("redis commands", 0.0)),
    ("Redis CPU, us (noisy)", lambda c: float(round(c.get("redis cpu us", 0.0)))),
    ("record/JSON encodings (writes)", lambda c: c.get("record to JSON", 0.0) + c.get("floor json.dumps", 0.0)),
    ("record/JSON decodings (reads)", lambda c: c.get("record from JSON", 0.0) + c.get("floor json.loads", 0.0)),
    ("journal encodes", lambda c: c.get("journal encode", 0.0)),
    ("journal decodes", lambda c: c.get("journal decode", 0.0)),
    ("AEAD seals", lambda c: c.get("AEAD seal", 0.0)),
    ("AEAD opens", lambda c: c.get("AEAD open", 0.0)),
]  # fmt: skip


def fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.005 else f"{value:.2f}"


def report(m: Measured, n: int, markdown: bool) -> None:
    tools = {"one_step": "one-step task", "one_answer": "task with one answer"}
    head = [f"{v} {label}" for tool, label in tools.items() for v in VARIANTS]
    lines = []
    if markdown:
        lines.append("| per task | " + " | ".join(head) + " |")
        lines.append("|---|" + "---|" * len(head))
    else:
        lines.append(f"{'per task':<34}" + "".join(f"{h:>28}" for h in head))
    for label, get in ROWS:
        cells = [fmt(get(m.windows[(v, tool)].per_task)) for tool in tools for v in VARIANTS]
        if markdown:
            lines.append(f"| {label.strip()} | " + " | ".join(cells) + " |")
        else:
            lines.append(f"{label:<34}" + "".join(f"{c:>28}" for c in cells))
    p50 = [f"{statistics.median(m.windows[(v, tool)].seconds) * 1e3:.2f} ms" for tool in tools for v in VARIANTS]
    if markdown:
        lines.append("| p50 per task, in-process | " + " | ".join(p50) + " |")
    else:
        lines.append(f"{'p50 per task, in-process':<34}" + "".join(f"{c:>28}" for c in p50))
    print(f"\nCounts per task (N={n} tasks per window, sequential; FlowClient, server in this process)")
    print("\n".join(lines))
    for v in VARIANTS:
        idle = m.idle[v]
        busy = ", ".join(f"{k} {val:.1f}" for k, val in sorted(idle.items()) if val >= 0.05)
        print(f"  {v}: background, per second idle (subtracted above): {busy or 'nothing'}")
    for v in VARIANTS:
        for tool in tools:
            cmds = {k[6:]: val for k, val in m.windows[(v, tool)].per_task.items()
                    if k.startswith("redis ") and k not in TOTALS and val >= 0.005}  # fmt: skip
            listed = ", ".join(f"{k} {fmt(val)}" for k, val in sorted(cmds.items(), key=lambda kv: -kv[1]))
            print(f"  {v} {tool}: Redis commands: {listed}")
    print("\nWhat each costs on this machine (same run; medians, or best of 5 for CPU-only work)")
    for label, seconds in m.costs.items():
        print(f"  {label:<40} {seconds * 1e6:8.1f} us")


async def main(args: argparse.Namespace) -> int:
    load = os.getloadavg()
    print(f"task floor: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    missing = RedisProcess.binary() is None
    if missing:
        print("FAILED: redis-server is not installed (it counts on a private one)")
        return 1
    os.environ.setdefault(KEY_ENV, os.urandom(32).hex())
    out = Measured()
    with tempfile.TemporaryDirectory(prefix="mrtr-task-floor-") as tmp, RedisProcess(Path(tmp)) as proc:
        print(f"private redis-server on port {proc.port}")
        redis = aioredis.Redis.from_url(proc.url)
        try:
            with instrumented():
                for variant in VARIANTS:
                    await measure_variant(variant, proc.url, redis, args.n, args.idle, out)
            await unit_costs(redis, out)
        finally:
            await redis.aclose()
    report(out, args.n, args.markdown)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: N=10, 1 s idle window")
    parser.add_argument("--n", type=int, default=None, help="tasks per window (default 100)")
    parser.add_argument("--idle", type=float, default=None, help="seconds of idle counted per variant (default 3)")
    parser.add_argument("--markdown", action="store_true", help="print the counts as a Markdown table")
    args = parser.parse_args(argv)
    args.n = args.n or (10 if args.quick else 100)
    args.idle = args.idle or (1.0 if args.quick else 3.0)
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
