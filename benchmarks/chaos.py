"""Chaos benchmark: mrtr flows and durable tasks behind a real load balancer, instances dying.

Three uvicorn instances of `tests/support/chaos_server.py` share a state key, the server name
and a Redis store (127.0.0.1:6379, a random namespace, deleted afterwards); HAProxy
balances them round robin with health checks and no stickiness; a killer SIGKILLs a random
instance every 2-4 s and restarts it. Meanwhile a load of three-round ephemeral flows
(`trip`) and durable task flows (`job`) runs through HAProxy, once per client mode:

- `sdk`: the official `mcp.Client` (tasks followed by mrtr's `TasksClient` extension), no
  retries of its own; ONE client per worker shared by all that worker's concurrent flows
  (`--clients` workers, `--concurrency` flows in flight in all), as an agent host would;
- `mrtr`: `mrtr.client.FlowClient(tasks=True)`, once per fleet bus and client sharing:
  - bus `plain`: the README's plain fleet recipe (a shared Redis store, no `subscriptions=`:
    the bus comes from the store); `explicit`: `MCPServer(subscriptions=mrtr.open_bus(url))`;
  - sharing `lane`: one client per lane (flow in flight); `shared`: one client for all lanes;
    `workers`: `--clients` clients, as the sdk mode.

A client that breaks is counted and replaced. Each run gets a fresh fleet and namespace. The
plain recipe's task median must stay within 2x of the explicit bus's (same sharing).

Every side effect is a step that counts its runs per idempotency key in Redis and logs
its instance, pid and start/end time. Printed per mode: flows completed / lost / wrong
value; duplicate step runs (same key run twice) and whether each coincided with a kill
(the pid of the earlier run was SIGKILLed between its start and the rerun, at most
`KILL_WINDOW` s after it ended); steps rerun under a *new* key because a first round was
resent (a new flow to the server); tasks completed / stuck (not terminal after the
traffic, counted in the store, so orphans count too); rounds shed (state-only
`input_required`, counted by the servers); flows per second; kills; client breakages.
Target with mrtr's clients: 0 lost, 0 wrong, 0 stuck, duplicates only where a kill hit.

Run: `make chaos`, or `.venv/bin/python benchmarks/chaos.py [--flows 1000 --tasks 100 ...]`.
Needs HAProxy (installed with apt-get when missing and root) and Redis on 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.chaos_fleet import Fleet, Kill, Killer, balancer, find_haproxy  # noqa: E402
from benchmarks.chaos_load import MODES, Load, LoadResult  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
KILL_WINDOW = 2.0
"""Seconds after a step ended in which a kill of its process can still lose its result
(the round's response, or the task's checkpoint, was not out yet)."""


BUSES = ("plain", "explicit")
SHARING = ("lane", "shared", "workers")
PLAIN_TASK_RATIO = 2.0
"""The plain recipe's task median may be at most this many times the explicit bus's."""


@dataclass(frozen=True)
class Options:
    flows: int = 1000
    tasks: int = 100
    concurrency: int = 16
    clients: int = 4
    kill_interval: tuple[float, float] = (2.0, 4.0)
    min_kills: int = 10
    duration_cap: float = 600.0
    modes: tuple[str, ...] = MODES
    buses: tuple[str, ...] = BUSES
    sharing: tuple[str, ...] = ("lane", "shared")
    task_seconds: float = 0.3
    step_seconds: float = 0.02
    lease: float = 1.0
    settle: float = 20.0
    guard: bool = True
    max_inflight: int = 6
    seed: int | None = None
    keep_logs: bool = False


@dataclass(frozen=True)
class Variant:
    """One run: which client, which fleet bus, how clients are shared among the lanes."""

    mode: str
    bus: str = "plain"
    sharing: str = "workers"

    def clients(self, options: Options) -> int:
        return {"lane": options.concurrency, "shared": 1}.get(self.sharing, options.clients)

    @property
    def label(self) -> str:
        return f"{self.mode}-{self.bus}-{self.sharing}"


def variants(options: Options) -> list[Variant]:
    """The runs: the sdk baseline once; mrtr's client per bus and sharing."""
    out = []
    for mode in options.modes:
        if mode == "sdk":
            out.append(Variant("sdk"))
        else:
            out += [Variant(mode, bus, sharing) for sharing in options.sharing for bus in options.buses]
    return out


@dataclass
class Duplicates:
    """Extra runs of side effects, split by whether a kill explains them."""

    same_key: int = 0
    same_key_after_kill: int = 0
    new_key: int = 0
    new_key_after_kill: int = 0
    unexplained: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ModeReport:
    mode: str
    bus: str
    sharing: str
    clients: int
    load: LoadResult
    duplicates: Duplicates
    tasks_in_store: int
    tasks_completed_in_store: int
    tasks_stuck: int
    stuck_statuses: dict[str, int]
    shed_rounds: int
    input_rounds: int
    kills: int
    kills_skipped: int
    restart_failures: list[str]
    flows_per_second: float

    @property
    def task_median(self) -> float | None:
        return self.load.task_median()

    def meets_target(self) -> bool:
        load, dup = self.load, self.duplicates
        return (
            load.lost == 0
            and load.wrong == 0
            and self.tasks_stuck == 0
            and dup.same_key == dup.same_key_after_kill
            and dup.new_key == dup.new_key_after_kill
        )

    def problems(self) -> list[str]:
        """What misses the target, in words (empty when it is met)."""
        out = []
        if self.load.lost:
            out.append(f"{self.load.lost} lost: {self.load.lost_reasons}")
        if self.load.wrong:
            out.append(f"{self.load.wrong} wrong values: {self.load.wrong_examples}")
        if self.tasks_stuck:
            out.append(f"{self.tasks_stuck} stuck tasks: {self.stuck_statuses}")
        if self.duplicates.unexplained:
            out.append(f"duplicates no kill explains: {self.duplicates.unexplained[:5]}")
        return out


def analyse_duplicates(records: list[dict[str, Any]], kills: list[Kill]) -> Duplicates:
    """Count reruns per idempotency key and per (flow, step), and match each to a kill."""
    killed = {(k.pid, k.instance): k.at for k in kills}
    by_pid = {pid: at for (pid, _), at in killed.items()}
    out = Duplicates()

    def explained(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
        at = by_pid.get(earlier["pid"])
        return at is not None and earlier["start"] <= at <= min(later["start"], earlier["end"] + KILL_WINDOW)

    by_key: dict[str, list[dict[str, Any]]] = {}
    by_step: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: r["start"]):
        by_key.setdefault(record["key"], []).append(record)
        by_step.setdefault((record["flow"], record["step"]), {}).setdefault(record["key"], record)
    for runs in by_key.values():
        for earlier, later in itertools.pairwise(runs):
            out.same_key += 1
            if explained(earlier, later):
                out.same_key_after_kill += 1
            else:
                out.unexplained.append({"kind": "same key", "earlier": earlier, "later": later})
    for first_runs in by_step.values():
        runs = sorted(first_runs.values(), key=lambda r: r["start"])
        for earlier, later in itertools.pairwise(runs):
            out.new_key += 1
            if explained(earlier, later):
                out.new_key_after_kill += 1
            else:
                out.unexplained.append({"kind": "new key", "earlier": earlier, "later": later})
    return out


async def tasks_in_store(redis: aioredis.Redis, namespace: str) -> dict[str, str]:
    """Every task record of the namespace and its status (orphans included)."""
    from mrtr.stores._redis import RedisStore

    store = RedisStore(REDIS_URL, prefix=f"{namespace}:")
    try:
        statuses = {}
        async for key in redis.scan_iter(match=f"{namespace}:task:*", count=500):
            task_id = key.decode().removeprefix(f"{namespace}:task:")
            record = await store.load(task_id, time.time())
            if record is not None:
                statuses[task_id] = str(record.status)
        return statuses
    finally:
        await store.close()


async def settle_tasks(redis: aioredis.Redis, namespace: str, seconds: float) -> dict[str, str]:
    """Let a dead worker's tasks be adopted and finished; then what each task ended as."""
    deadline = time.monotonic() + seconds
    while True:
        statuses = await tasks_in_store(redis, namespace)
        busy = [s for s in statuses.values() if s == "working"]
        if not busy or time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(0.5)


async def run_variant(
    variant: Variant, options: Options, haproxy: str, workdir: Path, rng: random.Random
) -> ModeReport:
    mode = variant.mode
    namespace = f"mrtr_chaos_{secrets.token_hex(4)}"
    env = {
        "CHAOS_REDIS": REDIS_URL,
        "CHAOS_NAMESPACE": namespace,
        "CHAOS_STEP_SECONDS": str(options.step_seconds),
        "MRTR_TASK_LEASE": str(options.lease),
        "CHAOS_GUARD": "1" if options.guard else "0",
        "CHAOS_MAX_INFLIGHT": str(options.max_inflight),
        "CHAOS_BUS": variant.bus,
    }
    redis = aioredis.Redis.from_url(REDIS_URL)
    fleet = Fleet(workdir / variant.label, env)
    fleet.workdir.mkdir()
    try:
        await anyio.to_thread.run_sync(fleet.start)  # not abandoned on cancel: close() sees every process
        with balancer(haproxy, fleet, fleet.workdir) as url:
            killer = Killer(fleet, options.kill_interval, rng)
            clients = variant.clients(options)
            load = Load(mode, url, options.flows, options.tasks, options.concurrency, clients)
            load.task_seconds = options.task_seconds
            result = await load.run(killer, options.min_kills, options.duration_cap)
            statuses = await settle_tasks(redis, namespace, options.settle)
            records = [json.loads(r) for r in await redis.lrange(f"{namespace}:fxlog", 0, -1)]
            shed = int(await redis.get(f"{namespace}:shed") or 0)
            input_rounds = int(await redis.get(f"{namespace}:input_rounds") or 0)
        stuck: dict[str, int] = {}
        for status in statuses.values():
            if status not in ("completed", "failed", "cancelled"):
                stuck[status] = stuck.get(status, 0) + 1
        return ModeReport(
            mode=mode,
            bus=variant.bus,
            sharing=variant.sharing,
            clients=clients,
            load=result,
            duplicates=analyse_duplicates(records, killer.kills),
            tasks_in_store=len(statuses),
            tasks_completed_in_store=sum(s == "completed" for s in statuses.values()),
            tasks_stuck=sum(stuck.values()),
            stuck_statuses=stuck,
            shed_rounds=shed,
            input_rounds=input_rounds,
            kills=len(killer.kills),
            kills_skipped=killer.skipped,
            restart_failures=killer.restart_failures,
            flows_per_second=result.flows_ok / result.seconds if result.seconds else 0.0,
        )
    finally:
        await anyio.to_thread.run_sync(fleet.close)
        with contextlib.suppress(Exception):
            keys = [k async for k in redis.scan_iter(match=f"{namespace}:*", count=1000)]
            for start in range(0, len(keys), 500):
                await redis.delete(*keys[start : start + 500])
        await redis.aclose()


async def run(options: Options, on_report: Callable[[ModeReport], None] | None = None) -> list[ModeReport]:
    """The whole benchmark: one fresh fleet per variant; returns the reports (and hands
    each to `on_report` as soon as its run is done)."""
    haproxy = await asyncio.to_thread(find_haproxy)
    rng = random.Random(options.seed)
    reports = []
    tmp = Path(tempfile.mkdtemp(prefix="mrtr-chaos-"))
    try:
        for variant in variants(options):
            reports.append(await run_variant(variant, options, haproxy, tmp, rng))
            if on_report is not None:
                on_report(reports[-1])
    finally:
        if options.keep_logs:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return reports


def render(report: ModeReport, options: Options) -> str:
    load, dup = report.load, report.duplicates
    lines = [
        f"== mode {report.mode}, bus {report.bus}, {report.clients} clients ({report.sharing}),"
        f" {options.concurrency} flows in flight,"
        f" replay guard {'on' if options.guard else 'off'}, shedding past {options.max_inflight or '-'} rounds",
        f"  flows       completed {load.flows_ok} / lost {load.flows_lost} / wrong {load.flows_wrong}"
        f"  (of {load.flows_started} started)",
        f"  task flows  completed {load.tasks_ok} / lost {load.tasks_lost} / wrong {load.tasks_wrong}"
        f"  (of {load.tasks_started} started)",
        f"  tasks in the store {report.tasks_in_store}: completed {report.tasks_completed_in_store},"
        f" stuck {report.tasks_stuck} {report.stuck_statuses or ''}",
        f"  duplicate step runs, same key: {dup.same_key} ({dup.same_key_after_kill} coincided with a kill)",
        f"  steps rerun under a new key (first round resent): {dup.new_key}"
        f" ({dup.new_key_after_kill} coincided with a kill)",
        f"  rounds shed {report.shed_rounds} (rounds with questions {report.input_rounds})",
        f"  kills {report.kills} (skipped {report.kills_skipped}); client breakages {load.client_breaks}",
        f"  {report.flows_per_second:.1f} flows/s over {load.seconds:.1f} s;"
        f" task median {_seconds(report.task_median)}",
    ]
    if load.lost_reasons:
        lines.append(f"  lost because: {dict(load.lost_reasons)}")
    if load.break_reasons:
        lines.append(f"  clients broke because: {dict(load.break_reasons)}")
    for dup in report.duplicates.unexplained[:5]:
        earlier, later = dup["earlier"], dup["later"]
        lines.append(
            f"  no kill explains: {dup['kind']} {earlier['flow']}/{earlier['step']}: ran on {earlier['instance']}"
            f" then on {later['instance']} {later['start'] - earlier['end']:+.2f} s after"
        )
    if report.restart_failures:
        lines.append(f"  restart failures: {report.restart_failures}")
    verdict = "MET" if report.meets_target() else "missed"
    lines.append(f"  target (0 lost, 0 wrong, 0 stuck, duplicates only at kills): {verdict}")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def plain_vs_explicit(reports: list[ModeReport]) -> list[tuple[str, float | None, float | None, float | None]]:
    """Per sharing: the plain recipe's task median, the explicit bus's, and their ratio."""
    medians = {(r.sharing, r.bus): r.task_median for r in reports if r.mode == "mrtr"}
    out = []
    for sharing in dict.fromkeys(r.sharing for r in reports if r.mode == "mrtr"):
        plain, explicit = medians.get((sharing, "plain")), medians.get((sharing, "explicit"))
        ratio = plain / explicit if plain is not None and explicit else None
        out.append((sharing, plain, explicit, ratio))
    return out


def render_summary(reports: list[ModeReport]) -> str:
    lines = ["== summary (task median: tools/call to the right value, task flows that completed)"]
    lines.append("  variant                    flows lost  tasks ok/lost  stuck  task median  target")
    for r in reports:
        label = f"{r.mode} {r.bus} {r.sharing}"
        tasks = f"{r.load.tasks_ok}/{r.load.tasks_lost}"
        verdict = "MET" if r.meets_target() else "missed"
        median = _seconds(r.task_median)
        lines.append(f"  {label:<26} {r.load.flows_lost:>10}  {tasks:>13}  {r.tasks_stuck:>5}  {median:>11}  {verdict}")
    for sharing, plain, explicit, ratio in plain_vs_explicit(reports):
        if ratio is None:
            continue
        verdict = "MET" if ratio <= PLAIN_TASK_RATIO else "missed"
        lines.append(
            f"  {sharing}: plain recipe {_seconds(plain)} vs explicit bus {_seconds(explicit)}:"
            f" x{ratio:.2f} (target <= x{PLAIN_TASK_RATIO:g}) {verdict}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[Options, bool]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=1000, help="ephemeral three-round flows per mode (a minimum)")
    parser.add_argument("--tasks", type=int, default=100, help="durable task flows per mode")
    parser.add_argument("--concurrency", type=int, default=16, help="flows in flight, over all clients")
    parser.add_argument("--clients", type=int, default=4, help="clients (workers), each shared by its flows")
    parser.add_argument("--kill-every", default="2,4", help="seconds between kills: MIN,MAX (uniform)")
    parser.add_argument("--min-kills", type=int, default=10, help="keep flows coming until this many kills")
    parser.add_argument("--duration-cap", type=float, default=600.0, help="seconds of traffic per mode, at most")
    parser.add_argument("--modes", default=",".join(MODES), help=f"client modes, from {','.join(MODES)}")
    parser.add_argument("--buses", default=",".join(BUSES), help="fleet buses for mrtr's client: plain,explicit")
    parser.add_argument(
        "--sharing", default="lane,shared", help="client sharing for mrtr's client, from lane,shared,workers"
    )
    parser.add_argument("--task-seconds", type=float, default=0.3, help="how long a task's slow step sleeps")
    parser.add_argument("--no-guard", action="store_true", help="serve without the replay guard")
    parser.add_argument("--max-inflight", type=int, default=6, help="shed past this many rounds per instance (0: off)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' and HAProxy's logs")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON too")
    args = parser.parse_args(argv)
    low, high = (float(x) for x in args.kill_every.split(","))
    modes = tuple(m for m in args.modes.split(",") if m)
    buses = tuple(b for b in args.buses.split(",") if b)
    sharing = tuple(x for x in args.sharing.split(",") if x)
    for given, known, what in ((modes, MODES, "modes"), (buses, BUSES, "buses"), (sharing, SHARING, "sharing")):
        if unknown := set(given) - set(known):
            parser.error(f"unknown {what} {sorted(unknown)}")
    options = Options(
        flows=args.flows,
        tasks=args.tasks,
        concurrency=args.concurrency,
        clients=args.clients,
        kill_interval=(low, high),
        min_kills=args.min_kills,
        duration_cap=args.duration_cap,
        modes=modes,
        buses=buses,
        sharing=sharing,
        task_seconds=args.task_seconds,
        guard=not args.no_guard,
        max_inflight=args.max_inflight,
        seed=args.seed,
        keep_logs=args.keep_logs,
    )
    return options, args.json


def main(argv: list[str] | None = None) -> int:
    options, as_json = parse_args(argv)

    def show(report: ModeReport) -> None:
        print(render(report, options), flush=True)
        if as_json:
            print(json.dumps(asdict(report), default=str), flush=True)

    print(f"chaos: {options}", flush=True)

    async def cancellable() -> list[ModeReport]:
        main_task = asyncio.current_task()
        assert main_task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # `kill` = Ctrl-C
        return await run(options, show)

    try:
        reports = asyncio.run(cancellable())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("chaos: interrupted; servers, HAProxy and the Redis namespace are cleaned up", file=sys.stderr)
        return 130
    print(render_summary(reports), flush=True)
    met = all(r.meets_target() for r in reports if r.mode == "mrtr")
    close = all(ratio is None or ratio <= PLAIN_TASK_RATIO for *_, ratio in plain_vs_explicit(reports))
    return 0 if met and close else 1


if __name__ == "__main__":
    sys.exit(main())
