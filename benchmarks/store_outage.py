"""Store outage benchmark: a fleet's shared store fails in the middle of a batch of durable tasks.

Two uvicorn instances of `tests/support/store_server.py` (the README's fleet recipe: a shared key
and a shared store, nothing else) run behind HAProxy; each reaches the store through its own
`tests/support/storeproxy.py`. The store is a PRIVATE `redis-server` (AOF on, `appendfsync
always`: the setting that loses no acknowledged write when the process is killed, whatever the
disk does) or a PRIVATE PostgreSQL, started here on free ports. `FlowClient`s (one per lane,
through HAProxy) run `--tasks` durable tasks (three steps each); once half of them have started,
the fault begins and lasts `--outage` seconds:

- `outage`: the store is SIGKILLed, and started again (same data directory) when it ends;
- `cut`: the first instance's proxy drops every connection and refuses new ones (a partition
  between that instance and the store); the other instance still reaches it;
- `slow`: every reply of the store reaches both instances 200 ms late (the fault lasts the whole run).

Meanwhile probes measure, on each instance directly (not through HAProxy), its own `/healthz` and
an inline flow that needs no store (`quick`: one round, no step), and a raw JSON-RPC call that needs the store
(`tasks/get`), recording the error a client without retries sees. Reported per store and fault:
tasks completed / lost / wrong; errors the `FlowClient`s saw (raised to the caller, after their
own retries) and what the raw probe saw; seconds from the store's return to each task's completion
(p50 and max, over tasks still running at the return); duplicate step runs under the same
idempotency key (a lost checkpoint: allowed) and under a new key (a task or step run twice: never
allowed), with the keys; the probes' p50 before and during the fault.

Run: `.venv/bin/python benchmarks/store_outage.py [--stores redis,postgres] [--faults outage]
[--tasks 200] [--outage 10] [--asks 10] [--guard-outage fail_closed|degrade]`; `--quick` is a short
smoke run. Needs HAProxy (installed with apt-get when missing and root), `redis-server`, and
PostgreSQL's server binaries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.chaos_fleet import Fleet, Instance, balancer, find_haproxy, free_ports  # noqa: E402
from tests.support.pg_proc import PostgresProcess  # noqa: E402
from tests.support.redis_proc import RedisProcess  # noqa: E402
from tests.support.servers import ServerProcess, ServerSpec, new_key, spawn_servers  # noqa: E402
from tests.support.storeproxy import StoreProxy  # noqa: E402

from mrtr.client import FlowClient  # noqa: E402

STORES = ("redis", "postgres")
FAULTS = ("outage", "cut", "slow")
SERVER = ROOT / "tests" / "support" / "store_server.py"
READY_PREFIX = "store-server ready:"
SLOW_REPLY = 0.2
TASK_TIMEOUT = 120.0
PROBE_INTERVAL = 0.25


@dataclass(frozen=True)
class Options:
    stores: tuple[str, ...] = STORES
    faults: tuple[str, ...] = ("outage",)
    tasks: int = 200
    concurrency: int = 20
    outage: float = 10.0
    task_seconds: float = 0.5
    instances: int = 2
    lease: float = 2.0
    asks: int = 0
    """Inline flows with a question (their answer's round passes the replay guard) run alongside."""
    listen: bool = True
    """`FlowClient(listen=...)`: follow tasks by listening (the default) or by polling `tasks/get`."""
    guard_outage: str = "fail_closed"
    """`Flows(replay_guard_outage=...)` on every instance: what an answer round does while the
    replay guard's store is away (`fail_closed`: refused, retryable; `degrade`: runs unguarded)."""
    keep_logs: bool = False


@dataclass
class Probe:
    """Latencies of one probe, split by whether the fault was on when it was sent."""

    before: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    failures_during: int = 0
    failures_outside: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def p50(self, during: bool) -> float | None:
        values = self.during if during else self.before
        return statistics.median(values) if values else None


@dataclass
class Report:
    store: str
    fault: str
    options: Options
    tasks_ok: int = 0
    tasks_lost: int = 0
    tasks_wrong: int = 0
    asks_ok: int = 0
    asks_failed: int = 0
    ask_durations: list[float] = field(default_factory=list)
    """Seconds from `tools/call` to the result, per inline flow with a question that completed right."""
    asks_done_during: int = 0
    """Inline flows with a question that completed while the fault was on."""
    client_errors: Counter[str] = field(default_factory=Counter)
    """Errors that reached a `FlowClient`'s caller (after its retries), by kind."""
    raw_errors: Counter[str] = field(default_factory=Counter)
    """What a client without retries got from a call needing the store, during the fault."""
    fault_started: float = 0.0
    fault_ended: float = 0.0
    fault_window: tuple[float, float] = (0.0, 0.0)
    """The fault's start and end on the wall clock (the audit's timestamps are wall clock)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Every step run the audit recorded."""
    completions: dict[str, float] = field(default_factory=dict)
    """Flow label -> when its task's result arrived (monotonic)."""
    durations: list[float] = field(default_factory=list)
    """Seconds from `tools/call` to the result, per task that completed right."""
    same_key: dict[str, int] = field(default_factory=dict)
    """Idempotency key -> runs, for keys run more than once (a lost checkpoint)."""
    new_key: dict[str, int] = field(default_factory=dict)
    """`flow/step` -> distinct keys, where more than one (a task or a step run twice: a bug)."""
    health: Probe = field(default_factory=Probe)
    quick: Probe = field(default_factory=Probe)
    seconds: float = 0.0
    server_tracebacks: int = 0
    restarts: int = 0
    """Server processes that exited during the run (none should)."""

    def task_p50(self) -> float | None:
        return statistics.median(self.durations) if self.durations else None

    def recovery(self) -> list[float]:
        """Seconds from the store's return to each task's completion, for tasks that completed after it."""
        return sorted(at - self.fault_ended for at in self.completions.values() if at >= self.fault_ended)

    def ok(self) -> bool:
        wanted = self.options.tasks
        return (
            self.tasks_ok == wanted
            and not self.tasks_lost
            and not self.tasks_wrong
            and not self.new_key
            and not self.restarts
            and self.asks_ok == self.options.asks
        )


@dataclass
class StoreUnderTest:
    """A private store, the URL template its proxies fill in, and how to take it down."""

    kind: str
    workdir: Path
    redis: RedisProcess | None = None
    postgres: PostgresProcess | None = None

    def start(self) -> None:
        if self.kind == "redis":
            self.redis = RedisProcess(self.workdir, appendfsync="always")
            self.redis.start()
        else:
            self.postgres = PostgresProcess()
            self.postgres.start()

    @property
    def port(self) -> int:
        return self.redis.port if self.redis is not None else self._pg().port

    def template(self) -> str:
        if self.kind == "redis":
            return "redis://127.0.0.1:{port}/0"
        return "postgresql://postgres@127.0.0.1:{port}/test"

    def kill(self) -> None:
        if self.redis is not None:
            self.redis.kill()
        else:
            self._pg().kill()

    def revive(self) -> None:
        if self.redis is not None:
            self.redis.start()
        else:
            self._pg().start()

    def close(self) -> None:
        if self.redis is not None:
            self.redis.kill()
        if self.postgres is not None:
            self.postgres.cleanup()

    def _pg(self) -> PostgresProcess:
        assert self.postgres is not None
        return self.postgres


@contextlib.contextmanager
def store_fleet(
    kind: str, options: Options, workdir: Path, haproxy: str
) -> Iterator[tuple[StoreUnderTest, list[StoreProxy], dict[str, ServerProcess], str, Path]]:
    """A private store, one proxy and one instance per slot, HAProxy in front; all stopped on exit."""
    store = StoreUnderTest(kind, workdir)
    audit = workdir / "audit.jsonl"
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        store.start()
        proxies = [stack.enter_context(StoreProxy(store.port)) for _ in range(options.instances)]
        ports = free_ports(options.instances)
        key, namespace = new_key(), f"mrtr_outage_{secrets.token_hex(4)}"
        specs = []
        for index, (proxy, port) in enumerate(zip(proxies, ports, strict=True)):
            label = f"s{index + 1}"
            env = {
                "MRTR_STATE_KEY": key,
                "MRTR_INSTANCE": label,
                "MRTR_STORE": proxy.url(store.template()),
                "MRTR_STORE_NAMESPACE": namespace,
                "MRTR_TASK_LEASE": str(options.lease),
                "MRTR_GUARD_OUTAGE": options.guard_outage,
                "STORE_AUDIT": str(audit),
                "STORE_PORT": str(port),
            }
            specs.append(ServerSpec(label, env, SERVER, READY_PREFIX))
        servers = stack.enter_context(spawn_servers(specs, workdir))
        fleet = Fleet(workdir, {}, instances=[Instance(f"s{i + 1}", port) for i, port in enumerate(ports)])
        url = stack.enter_context(balancer(haproxy, fleet, workdir))
        yield store, proxies, servers, url, audit


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())[:100]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Run:
    """One store x fault run: the load, the fault, the probes."""

    kind: str
    fault: str
    options: Options
    report: Report
    started: int = 0
    half: anyio.Event = field(default_factory=anyio.Event)
    faulting: bool = False

    async def job(self, client: FlowClient, number: int) -> None:
        label = f"T{number:05d}"
        self.started += 1
        called = time.monotonic()
        if self.started * 2 >= self.options.tasks:
            self.half.set()
        try:
            with anyio.fail_after(TASK_TIMEOUT):
                result = await client.call_tool("job", {"flow": label, "n": number, "slow": self.options.task_seconds})
        except Exception as exc:
            self.report.tasks_lost += 1
            self.report.client_errors[_describe(exc)] += 1
            return
        if result.is_error:
            self.report.tasks_lost += 1
            text = " ".join(c.text for c in result.content if isinstance(c, t.TextContent))
            self.report.client_errors[f"tool error: {text[:100]}"] += 1
            return
        value = (result.structured_content or {}).get("result")
        if value == 2 * number + 1:
            self.report.tasks_ok += 1
            self.report.completions[label] = time.monotonic()
            self.report.durations.append(self.report.completions[label] - called)
        else:
            self.report.tasks_wrong += 1

    async def ask(self, client: FlowClient, number: int) -> None:
        called = time.monotonic()
        try:
            with anyio.fail_after(TASK_TIMEOUT):
                result = await client.call_tool("ask", {"flow": f"A{number:05d}", "n": number})
        except Exception as exc:
            self.report.asks_failed += 1
            self.report.client_errors[f"ask: {_describe(exc)}"] += 1
            return
        value = (result.structured_content or {}).get("result")
        if not result.is_error and value == number + _z(number):
            self.report.asks_ok += 1
            self.report.ask_durations.append(time.monotonic() - called)
            self.report.asks_done_during += self.faulting
        else:
            self.report.asks_failed += 1

    async def lanes(self, url: str) -> None:
        numbers = iter(range(1, self.options.tasks + 1))

        async def lane() -> None:
            async with FlowClient(url, tasks=True, timeout=60.0, listen=self.options.listen) as client:
                for number in numbers:
                    await self.job(client, number)

        async def asking() -> None:
            """The flows with a question start as the fault does, one every half second."""
            await self.half.wait()
            async with FlowClient(url, elicit=_answer, timeout=60.0) as client, anyio.create_task_group() as group:
                for number in range(1, self.options.asks + 1):
                    group.start_soon(self.ask, client, number)
                    await anyio.sleep(0.5)

        async with anyio.create_task_group() as group:
            group.start_soon(asking)
            for _ in range(self.options.concurrency):
                group.start_soon(lane)

    async def probe(self, servers: dict[str, ServerProcess], stop: anyio.Event) -> None:
        """Health and `quick` on each instance directly; a raw store call, its error kept.

        Each probe loops on its own, so one that hangs does not hide what the others see."""
        async with httpx2.AsyncClient(timeout=10.0) as http, anyio.create_task_group() as group:
            for server in servers.values():
                base = server.url.removesuffix("/mcp")
                group.start_soon(
                    self._loop, stop, lambda b=base: self._timed(self.report.health, http.get(f"{b}/healthz"))
                )
                group.start_soon(self._quick_loop, server.url, stop)
                group.start_soon(self._loop, stop, lambda u=server.url: self._raw(http, u))

    async def _loop(self, stop: anyio.Event, once: Any) -> None:
        while not stop.is_set():
            await once()
            with anyio.move_on_after(PROBE_INTERVAL):
                await stop.wait()

    async def _quick_loop(self, url: str, stop: anyio.Event) -> None:
        counter = 0
        async with FlowClient(url, timeout=10.0) as client:

            async def once() -> None:
                nonlocal counter
                counter += 1
                await self._timed(self.report.quick, client.call_tool("quick", {"flow": "Q", "n": counter}))

            await self._loop(stop, once)

    async def _raw(self, http: httpx2.AsyncClient, url: str) -> None:
        if self.faulting:
            self.report.raw_errors[await _raw_store_call(http, url)] += 1

    async def _timed(self, probe: Probe, call: Any) -> None:
        during = self.faulting
        started = time.monotonic()
        reason = ""
        try:
            with anyio.fail_after(10):
                answer = await call
            if getattr(answer, "is_error", False) or getattr(answer, "status_code", 200) != 200:
                reason = f"answer {getattr(answer, 'status_code', 'isError')}"
        except Exception as exc:
            reason = _describe(exc)
        if reason:
            probe.reasons[reason] += 1
            if during:
                probe.failures_during += 1
            else:
                probe.failures_outside += 1
            return
        (probe.during if during else probe.before).append(time.monotonic() - started)

    async def inject(self, store: StoreUnderTest, proxies: list[StoreProxy]) -> None:
        await self.half.wait()
        self.faulting = True
        self.report.fault_started = time.monotonic()
        wall_started = time.time()
        if self.fault == "outage":
            await anyio.to_thread.run_sync(store.kill)
        elif self.fault == "cut":
            proxies[0].cut()
        await anyio.sleep(self.options.outage)
        if self.fault == "outage":
            await anyio.to_thread.run_sync(store.revive)
        elif self.fault == "cut":
            proxies[0].restore()
        self.report.fault_ended = time.monotonic()
        self.report.fault_window = (wall_started, time.time())
        self.faulting = False


def _z(number: int) -> int:
    return number * 7 % 100


async def _answer(params: t.ElicitRequestParams) -> t.ElicitResult:
    number = int(params.message.split()[0].lstrip("A"))
    return t.ElicitResult(action="accept", content={"value": _z(number)})


_TASKS_CAPABILITY = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


async def _raw_store_call(http: httpx2.AsyncClient, url: str) -> str:
    """`tasks/get` for a task that does not exist, as one plain HTTP request: it needs the store.

    With the store reachable the answer is "not found"; without it, what a client with no
    retries of its own sees (kept as status + JSON-RPC code + message).
    """
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": _TASKS_CAPABILITY,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "no-such-task", "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Mcp-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tasks/get",
    }
    try:
        answer = await http.post(url, json=body, headers=headers)
    except httpx2.HTTPError as exc:
        return f"transport: {type(exc).__name__}"
    text = answer.text
    for line in text.splitlines():
        line = line.removeprefix("data:").strip()
        if line.startswith("{"):
            text = line
            break
    try:
        error = json.loads(text).get("error") or {}
    except ValueError:
        return f"HTTP {answer.status_code}: {text[:80]}"
    if not error:
        return f"HTTP {answer.status_code}: no error"
    return f"HTTP {answer.status_code} {error.get('code')}: {str(error.get('message'))[:100]}"


def _duplicates(audit: Path, report: Report) -> None:
    records = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()] if audit.exists() else []
    report.steps = records
    runs = Counter(r["key"] for r in records if r["flow"].startswith("T"))
    report.same_key = {key: count for key, count in runs.items() if count > 1}
    keys: dict[str, set[str]] = {}
    for r in records:
        if r["flow"].startswith(("T", "A")):
            keys.setdefault(f"{r['flow']}/{r['step']}", set()).add(r["key"])
    report.new_key = {step: len(k) for step, k in keys.items() if len(k) > 1}


async def run_one(kind: str, fault: str, options: Options, haproxy: str, workdir: Path) -> Report:
    report = Report(kind, fault, options)
    run = Run(kind, fault, options, report)
    with store_fleet(kind, options, workdir, haproxy) as (store, proxies, servers, url, audit):
        if fault == "slow":
            for proxy in proxies:
                proxy.delay(SLOW_REPLY)
        started = time.monotonic()
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(run.probe, servers, stop)
            if fault != "slow":
                group.start_soon(run.inject, store, proxies)
            else:
                run.faulting = True
                report.fault_started = started
            wall_started = time.time()
            await run.lanes(url)
            if fault == "slow":
                report.fault_ended = time.monotonic()
                report.fault_window = (wall_started, time.time())
                run.faulting = False
            stop.set()
            run.half.set()
        report.seconds = time.monotonic() - started
        report.restarts = sum(server.process.poll() is not None for server in servers.values())
        _duplicates(audit, report)
        report.server_tracebacks = sum(server.log().count("Traceback (") for server in servers.values())
    return report


async def run(options: Options) -> list[Report]:
    haproxy = await anyio.to_thread.run_sync(find_haproxy)
    reports = []
    tmp = Path(tempfile.mkdtemp(prefix="mrtr-outage-"))
    try:
        for kind in options.stores:
            for fault in options.faults:
                workdir = tmp / f"{kind}-{fault}"
                workdir.mkdir()
                reports.append(await run_one(kind, fault, options, haproxy, workdir))
                print(render(reports[-1]), flush=True)
    finally:
        if options.keep_logs:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return reports


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _fault(r: Report) -> str:
    return f"slow +{SLOW_REPLY * 1000:.0f} ms" if r.fault == "slow" else f"{r.fault} {r.options.outage:g} s"


def render(r: Report) -> str:
    recovery = r.recovery()
    p50 = statistics.median(recovery) if recovery else None
    worst = recovery[-1] if recovery else None
    lines = [
        f"== {r.store}, fault {_fault(r)}, {r.options.tasks} tasks,"
        f" {r.options.concurrency} lanes, {r.options.instances} instances, lease {r.options.lease:g} s",
        f"  tasks completed {r.tasks_ok} / lost {r.tasks_lost} / wrong {r.tasks_wrong}; run {r.seconds:.1f} s;"
        f" each task p50 {_s(r.task_p50())}, max {_s(max(r.durations, default=None))}",
        f"  from the store's return to each task's completion: p50 {_s(p50)}, max {_s(worst)}"
        f" ({len(recovery)} tasks completed after it)",
        f"  errors FlowClient callers saw: {sum(r.client_errors.values())} {dict(r.client_errors) or ''}",
        f"  a raw call needing the store, during the fault: {dict(r.raw_errors) or '-'}",
        f"  duplicate step runs, same key: {sum(c - 1 for c in r.same_key.values())} {sorted(r.same_key)[:6] or ''}",
        f"  steps run under a second key (never allowed): {len(r.new_key)} {sorted(r.new_key)[:6] or ''}",
        f"  /healthz p50 before {_s(r.health.p50(False))}, during {_s(r.health.p50(True))}"
        f" (failed during {r.health.failures_during})",
        f"  inline flow p50 before {_s(r.quick.p50(False))}, during {_s(r.quick.p50(True))}"
        f" (failed during {r.quick.failures_during}, outside {r.quick.failures_outside})",
    ]
    if r.quick.reasons or r.health.reasons:
        lines.append(f"  probe failures: {dict(r.health.reasons + r.quick.reasons)}")
    if r.options.asks:
        durations = r.ask_durations
        p50 = statistics.median(durations) if durations else None
        lines.append(
            f"  inline flows with a question (replay_guard_outage={r.options.guard_outage!r}): {r.asks_ok} ok,"
            f" {r.asks_failed} failed, {r.asks_done_during} completed during the fault;"
            f" each p50 {_s(p50)}, max {_s(max(durations, default=None))}"
        )
    lines.append(f"  tracebacks in the servers' logs {r.server_tracebacks}; servers that died {r.restarts}")
    lines.append(f"  verdict: {'ok' if r.ok() else 'FAILED'}")
    return "\n".join(lines)


def table(reports: list[Report]) -> str:
    rows = [
        "| store | fault | tasks completed | errors callers saw | return -> task done, p50 | max "
        "| each task, p50 | max | duplicate steps (same key) | under which keys | second key |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        recovery = r.recovery()
        p50 = statistics.median(recovery) if recovery else None
        keys = ", ".join(sorted(r.same_key)[:3]) + (" ..." if len(r.same_key) > 3 else "") or "-"
        rows.append(
            f"| {r.store} | {_fault(r)} | {r.tasks_ok}/{r.options.tasks}"
            f" | {sum(r.client_errors.values())} | {_s(p50)} | {_s(recovery[-1] if recovery else None)}"
            f" | {_s(r.task_p50())} | {_s(max(r.durations, default=None))}"
            f" | {sum(c - 1 for c in r.same_key.values())} | {keys} | {len(r.new_key)} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--faults", default="outage", help=f"from {','.join(FAULTS)}")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--outage", type=float, default=10.0, help="seconds the fault lasts")
    parser.add_argument("--task-seconds", type=float, default=0.5, help="how long each task's middle step sleeps")
    parser.add_argument("--asks", type=int, default=0, help="inline flows with a question run alongside")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: 20 tasks, a 3 s fault")
    parser.add_argument("--poll", action="store_true", help="clients poll tasks/get instead of listening")
    parser.add_argument(
        "--guard-outage",
        choices=("fail_closed", "degrade"),
        default="fail_closed",
        help="Flows(replay_guard_outage=...) on every instance",
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    stores = tuple(s for s in args.stores.split(",") if s)
    faults = tuple(f for f in args.faults.split(",") if f)
    for given, known, what in ((stores, STORES, "stores"), (faults, FAULTS, "faults")):
        if unknown := set(given) - set(known):
            parser.error(f"unknown {what} {sorted(unknown)}")
    if args.quick:
        return Options(
            stores,
            faults,
            tasks=20,
            concurrency=8,
            outage=3.0,
            task_seconds=0.3,
            asks=4,
            listen=not args.poll,
            guard_outage=args.guard_outage,
            keep_logs=args.keep_logs,
        )
    return Options(
        stores,
        faults,
        tasks=args.tasks,
        concurrency=args.concurrency,
        outage=args.outage,
        task_seconds=args.task_seconds,
        asks=args.asks,
        listen=not args.poll,
        guard_outage=args.guard_outage,
        keep_logs=args.keep_logs,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    print(f"store outage: {options}", flush=True)
    reports = asyncio.run(run(options))
    print(table(reports), flush=True)
    return 0 if all(r.ok() for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
