"""`make demo`: a flow whose rounds alternate between two servers, then a task that outlives one.

Starts two instances of examples/deployer_server.py (labels A and B) on free 127.0.0.1
ports, sharing a freshly generated state key and one task store: the local Redis
(127.0.0.1:6379, a fresh namespace, deleted at the end) when one answers, else a SQLite
file in a temp dir. Each instance's start-up line says which bus its task notifications
ride: with Redis, a fleet bus on the store's own broker (the plain fleet recipe of docs/guides/fleet.md).

Part 1 drives the ephemeral `deploy` flow with examples/deployer_client.py so that
consecutive rounds land on different processes, reads the servers' audit log to show
that each side effect really ran exactly once, on whichever instance got there first,
and runs the same flow once more with a 2025-11-25 (legacy) client to show that one
server serves both protocol eras.

Part 2 shows a durable task surviving its worker: it starts the `migrate` task on A,
waits (watching the audit log) until A is inside the slow step, and SIGKILLs A: no
shutdown, no lease release. Then it follows the task on B with `tasks/get`, answers
its question with `tasks/update` and checks the audit: the finished step ran once, the
interrupted one twice (A, then B) under the same idempotency key. The lease is 1 s
here (10 s by default) so B takes over within a couple of seconds.

The servers are always stopped and the temp dir removed: on success, on error and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as t
from deployer_client import (
    MIGRATION_SCRIPT,
    SCENARIOS,
    Answerer,
    drive,
    follow_migration,
    start_migration,
    summarize,
    summarize_migration,
)
from deployer_server import READY_PREFIX
from mcp import Client

HERE = Path(__file__).resolve().parent
SERVER = HERE / "deployer_server.py"
READY_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
TASK_LEASE = 1.0
"""Seconds a silent worker keeps its task: short, so B adopts A's task soon after the kill."""
SLOW_STEP = 2.0
"""Seconds the migration's slow step takes: long enough to be killed in the middle of."""
PART2_TIMEOUT = 30.0


@dataclass
class Instance:
    label: str
    url: str
    process: asyncio.subprocess.Process
    stderr_path: Path


LOCAL_REDIS = "redis://127.0.0.1:6379/1"  # a database of its own, as the docs' fleet examples


@dataclass
class Store:
    """The task store both instances share, as the environment the deployer reads."""

    description: str
    env: dict[str, str]
    namespace: str | None = None

    async def close(self) -> None:
        """Delete the demo's Redis keys (a SQLite file goes with the temp dir)."""
        if self.namespace is None:
            return
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(LOCAL_REDIS)
        try:
            keys = [key async for key in client.scan_iter(match=f"{self.namespace}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


async def choose_store(workdir: Path) -> Store:
    """The local Redis when it answers (a fleet's store), else a SQLite file both processes open."""
    try:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(LOCAL_REDIS, socket_connect_timeout=1, socket_timeout=1)
        try:
            await client.ping()
        finally:
            await client.aclose()
    except Exception:  # no redis package or no server: the embedded store
        return Store(
            "one SQLite task store (no Redis on 127.0.0.1:6379)", {"MRTR_STORE": f"sqlite:///{workdir / 'tasks.db'}"}
        )
    namespace = f"mrtr_demo_{secrets.token_hex(4)}"
    env = {"MRTR_STORE": LOCAL_REDIS, "MRTR_STORE_NAMESPACE": namespace}
    return Store(f"one Redis task store ({LOCAL_REDIS}, namespace {namespace})", env, namespace)


def bus_line(instance: Instance) -> str:
    """What the instance logged at start-up about its bus (logger `mrtr.fleet`)."""
    for line in instance.stderr_path.read_text().splitlines():
        if line.startswith(("INFO mrtr.fleet:", "WARNING mrtr.fleet:")):
            return line.split(":", 1)[1].strip()
    return "(no start-up line about the bus)"


async def spawn(label: str, key: str, workdir: Path, stack: AsyncExitStack, store: Store) -> Instance:
    """Start one deployer over HTTP on a free port; `stack` stops it on the way out, whatever happens."""
    env = (
        os.environ
        | store.env
        | {
            "MRTR_STATE_KEY": key,
            "MRTR_INSTANCE": label,
            "MRTR_AUDIT_LOG": str(workdir / "audit.log"),
            "MRTR_TASK_LEASE": str(TASK_LEASE),
            "PYTHONUNBUFFERED": "1",
        }
    )
    stderr_path = workdir / f"server-{label}.log"
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(SERVER), "--port", "0", env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    stack.push_async_callback(stop, process)
    return Instance(label, "", process, stderr_path)


async def wait_ready(instance: Instance) -> None:
    """Read the server's ready line (it prints its URL once uvicorn listens)."""
    assert instance.process.stdout is not None
    try:
        line = await asyncio.wait_for(instance.process.stdout.readline(), READY_TIMEOUT)
    except TimeoutError:
        line = b""
    text = line.decode().strip()
    if not text.startswith(READY_PREFIX):
        log = instance.stderr_path.read_text()[-2000:]
        raise RuntimeError(f"instance {instance.label} did not start:\n{log}")
    instance.url = text.removeprefix(READY_PREFIX).split()[0]


async def stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM (uvicorn shuts down gracefully), then SIGKILL if it lingers."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()


def audit_summary(path: Path) -> dict[str, list[str]]:
    """step name -> instances that actually ran it (one entry per real execution)."""
    ran: dict[str, list[str]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("flow") == "migrate":
                continue  # part 2's task, summarized separately
            name = entry["step"] + (f":{entry['service']}" if "service" in entry else "")
            ran[name].append(entry["instance"])
    return dict(ran)


@dataclass
class AuditTail:
    """Follows the `migrate` task's lines in the servers' audit log while part 2 runs.

    Printing each line as it appears puts the servers' real side effects on the same
    timeline as the client's polls and the kill; `wait_for` lets the demo time the kill
    to the moment A is inside the slow step.
    """

    path: Path
    origin: float
    entries: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0

    def poll(self) -> None:
        """Read complete new lines (a line being written is left for the next poll)."""
        if not self.path.exists():
            return
        with self.path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            entry = json.loads(line)
            if entry.get("flow") != "migrate":
                continue
            self.entries.append(entry)
            phase = f" {entry['phase']}" if "phase" in entry else ""
            print(f"  +{self.elapsed():4.1f}s [audit] instance {entry['instance']} ran {entry['step']}{phase}"
                  f"  (key {entry['key']})")  # fmt: skip

    def elapsed(self) -> float:
        return time.monotonic() - self.origin

    async def follow(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(0.05)

    async def wait_for(self, seen: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not seen(self.entries):
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)


def slow_step_started_on(label: str) -> Callable[[list[dict[str, Any]]], bool]:
    """A predicate for `AuditTail.wait_for`: the moment to kill `label` is once it is inside the slow step."""

    def seen(entries: list[dict[str, Any]]) -> bool:
        return any(e["step"] == "migrate_schema" and e.get("phase") == "start" and e["instance"] == label
                   for e in entries)  # fmt: skip

    return seen


def check_migration_audit(entries: list[dict[str, Any]]) -> bool:
    """Print what really ran for the task and whether it is what a durable task promises."""

    def ran_on(step: str, phase: str | None = None) -> list[str]:
        return [e["instance"] for e in entries if e["step"] == step and e.get("phase") == phase]

    backups, switches = ran_on("backup"), ran_on("switch_traffic")
    starts, ends = ran_on("migrate_schema", "start"), ran_on("migrate_schema", "end")
    keys = sorted({e["key"] for e in entries if e["step"] == "migrate_schema" and e.get("phase") == "start"})
    print("\nside effects that really ran for the task (server audit log):")
    print(f"  backup: {len(backups)}x, on instance {', '.join(backups)}")
    print(f"  migrate_schema: started {len(starts)}x (on {', '.join(starts)}), finished {len(ends)}x "
          f"(on {', '.join(ends)}), idempotency key{'s' if len(keys) != 1 else ''} {', '.join(keys)}")  # fmt: skip
    print(f"  switch_traffic: {len(switches)}x, on instance {', '.join(switches)}" if switches
          else "  switch_traffic: not run (traffic was not switched)")  # fmt: skip
    ok = backups == ["A"] and starts == ["A", "B"] and len(keys) == 1 and ends == ["B"] and switches in (["B"], [])
    print("  finished steps ran once; the step A died in ran again on B under the same idempotency key" if ok
          else "  UNEXPECTED: not the run-once / re-run-once pattern of a durable task")  # fmt: skip
    return ok


async def durable_task_part(a: Instance, b: Instance, workdir: Path, interactive: bool) -> bool:
    """Part 2: start `migrate` on A, SIGKILL A inside the slow step, finish the task on B."""
    print("\n=== durable task survives its worker: start on A, SIGKILL A mid-step, finish on B ===")
    origin = time.monotonic()
    tail = AuditTail(workdir / "audit.log", origin)  # part 1's lines are skipped: not the task's
    following = asyncio.create_task(tail.follow())
    try:
        task_id = await start_migration(a.url, "shop", SLOW_STEP)
        await tail.wait_for(slow_step_started_on("A"), PART2_TIMEOUT, "A to start the slow step")
        a.process.kill()  # SIGKILL: no cleanup, no lease release, no goodbye to the store
        await a.process.wait()
        print(f"  +{tail.elapsed():4.1f}s SIGKILL -> instance A (pid {a.process.pid}), mid-step; "
              f"exit status {a.process.returncode}; its {TASK_LEASE:g} s lease is left to run out")  # fmt: skip
        print("  (nobody tells B: its worker finds the task in the shared store once A's lease has lapsed)")
        print(f"\nfollowing task {task_id} on instance B ({b.url})")
        script = {key: list(values) for key, values in MIGRATION_SCRIPT.items()}
        result = await follow_migration(
            b.url, task_id, Answerer(interactive=interactive, script=script), timeout=PART2_TIMEOUT, since=origin
        )
        tail.poll()  # the last lines may have landed after the final poll
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    print("\nresult:\n" + "\n".join("  " + line for line in summarize_migration(result).splitlines()))
    audited = check_migration_audit(tail.entries)
    if interactive:  # the outcome is yours to choose; the durability pattern is not
        return audited
    return audited and not result.is_error and (result.structured_content or {}).get("status") == "migrated"


async def legacy_run(url: str) -> dict[str, Any]:
    """The staging path with a 2025-11-25 client: questions arrive as server-to-client requests."""
    asked: list[str] = []

    async def on_elicit(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        asked.append("elicitation/create")
        message = params.message
        if message.startswith("Where"):
            return t.ElicitResult(action="accept", content={"environment": "staging"})
        if message.startswith("Services"):
            return t.ElicitResult(action="accept", content={"service": "api", "done": True})
        return t.ElicitResult(action="accept", content={"approve": True})

    async def on_sample(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        asked.append("sampling/createMessage")
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="low"), model="none")

    async def on_roots(context: Any) -> t.ListRootsResult:
        asked.append("roots/list")
        return t.ListRootsResult(roots=[t.Root.model_validate({"uri": "file:///srv/shop"})])

    async with Client(
        url, mode="legacy", elicitation_callback=on_elicit, sampling_callback=on_sample, list_roots_callback=on_roots
    ) as client:
        result = await client.call_tool("deploy", {"app": "shop"})
        report = result.structured_content or {}
        return {"version": client.protocol_version, "asked": asked, "status": report.get("status")}


async def main() -> int:
    interactive = sys.stdin.isatty()  # a person at a terminal answers; otherwise the script does
    key = secrets.token_hex(32)
    with tempfile.TemporaryDirectory(prefix="mrtr-demo-") as tmp:
        workdir = Path(tmp)
        async with AsyncExitStack() as stack:
            store = await choose_store(workdir)
            stack.push_async_callback(store.close)
            print(f"starting two deployer instances with one shared state key and {store.description} ...")
            a = await spawn("A", key, workdir, stack, store)
            b = await spawn("B", key, workdir, stack, store)
            for instance in (a, b):  # both boot in parallel; wait for each in turn
                await wait_ready(instance)
            print(f"  instance A: {a.url}\n  instance B: {b.url}")
            print(f"  A at start-up: {bus_line(a)}")

            script = {k: list(v) for k, v in SCENARIOS["production"].items()}
            print("\n=== 2026-07-28: one deploy flow, each round a new request to the other instance ===")
            result = await drive([a.url, b.url], "shop", Answerer(interactive=interactive, script=script))
            print("\nresult:\n" + "\n".join("  " + line for line in summarize(result).splitlines()))

            ran = audit_summary(workdir / "audit.log")
            print("\nside effects that really ran (server audit log):")
            for name, where in ran.items():
                print(f"  {name}: {len(where)}x, on instance {', '.join(where)}")
            once = bool(ran) and all(len(where) == 1 for where in ran.values())
            print("  every step ran exactly once, although later rounds replayed it on other instances" if once
                  else "  UNEXPECTED: a step ran more than once")  # fmt: skip

            print("\n=== 2025-11-25 (legacy) client, same server, instance A ===")
            legacy = await legacy_run(a.url)
            print(f"  negotiated {legacy['version']}; the server sent {len(legacy['asked'])} requests to the client")
            print(f"  ({', '.join(sorted(set(legacy['asked'])))}) inside one tools/call; status: {legacy['status']}")

            survived = await durable_task_part(a, b, workdir, interactive)

        deployed = not result.is_error and (result.structured_content or {}).get("status") == "deployed"
        ok = (deployed or interactive) and once and legacy["status"] == "deployed" and survived
        print("\nservers stopped. demo " + ("OK" if ok else "FAILED"))
        return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped")
        sys.exit(130)
