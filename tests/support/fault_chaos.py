"""Chaos run for one shared client: `python tests/support/fault_chaos.py [flowclient|sdk] [FLOWS]`.

Three `tests/support/fault_server.py` instances (one key, one SQLite task store) behind the round-robin
`tests/support/faultproxy.py`; a killer SIGKILLs a random instance every 2-4 s and restarts it. ONE
client is shared by every concurrent flow (16 at a time): each flow is `three_rounds` (three
requests) then `slow` (a 0.2 s step); with `flowclient`, one task flow (`remember`, task-augmented)
per ten flows as well. Prints completed / lost / wrong, tasks, kills, flows per second.
Not part of `make test` (it measures; the tests in test_client_faults.py prove).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import mcp_types as t
from mcp import Client

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mrtr.client import FlowClient  # noqa: E402
from tests.support.faultproxy import FaultProxy, running_proxy  # noqa: E402
from tests.support.servers import ServerProcess, ServerSpec, new_key, spawn_servers  # noqa: E402

CONCURRENCY = 16
SERVER = ROOT / "tests" / "support" / "fault_server.py"


async def answer(params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"word": "w"})


async def answer_sdk(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    return await answer(params)


class Chaos:
    def __init__(self, workdir: Path, stack: contextlib.ExitStack) -> None:
        self.workdir, self.stack, self.key = workdir, stack, new_key()
        self.servers: dict[str, ServerProcess] = {}
        self.stats: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    def start(self, label: str) -> ServerProcess:
        env = {
            "MRTR_STATE_KEY": self.key,
            "MRTR_INSTANCE": label,
            "MRTR_AUDIT": str(self.workdir / "audit.jsonl"),
            "MRTR_STORE": f"sqlite:///{self.workdir / 'tasks.db'}",
        }
        spec = ServerSpec(label, env, script=SERVER, ready_prefix="fault-server ready:")
        self.servers[label] = self.stack.enter_context(spawn_servers([spec], self.workdir))[label]
        return self.servers[label]

    async def kill_forever(self, proxy: FaultProxy, done: anyio.Event) -> None:
        while not done.is_set():
            with anyio.move_on_after(random.uniform(2, 4)):
                await done.wait()
            if done.is_set():
                return
            label = random.choice(sorted(self.servers))
            victim = self.servers[label]
            os.kill(victim.process.pid, signal.SIGKILL)
            victim.process.wait()
            self.stats["kills"] += 1
            fresh = await anyio.to_thread.run_sync(self.start, label)
            proxy.upstreams[proxy.upstreams.index(victim.url)] = fresh.url

    async def flow(self, call: Any, number: int, gate: anyio.Semaphore) -> None:
        async with gate:
            try:
                with anyio.fail_after(120):
                    first = await call("three_rounds", {"name": f"f{number}"})
                    second = await call("slow", {"label": f"s{number}", "seconds": 0.2})
                ok = first.content[0].text == f"f{number}:w:w" and second.content[0].text.startswith(f"s{number} ")
                self.stats["completed" if ok else "wrong"] += 1
            except Exception as error:
                self.stats["lost"] += 1
                self.errors[type(error).__name__] += 1

    async def task(self, call: Any, number: int, gate: anyio.Semaphore) -> None:
        async with gate:
            try:
                with anyio.fail_after(120):
                    result = await call("remember", {"text": f"t{number}"})
                self.stats["tasks completed" if result.content[0].text == f"noted t{number}" else "wrong"] += 1
            except Exception as error:
                self.stats["tasks lost"] += 1
                self.errors[type(error).__name__] += 1


async def main(mode: str, flows: int) -> None:
    with contextlib.ExitStack() as stack:
        chaos = Chaos(Path(tempfile.mkdtemp(prefix="mrtr-chaos-")), stack)
        for label in "ABC":
            chaos.start(label)
        async with running_proxy([s.url for s in chaos.servers.values()]) as proxy:
            done = anyio.Event()
            gate = anyio.Semaphore(CONCURRENCY)
            started = time.monotonic()
            async with anyio.create_task_group() as outer:
                outer.start_soon(chaos.kill_forever, proxy, done)
                try:
                    if mode == "flowclient":
                        async with (
                            FlowClient(proxy.url, elicit=answer, tasks=True) as client,
                            anyio.create_task_group() as group,
                        ):
                            for number in range(flows):
                                group.start_soon(chaos.flow, client.call_tool, number, gate)
                            for number in range(flows // 10):
                                group.start_soon(chaos.task, client.call_tool, number, gate)
                    else:
                        async with (
                            Client(proxy.url, elicitation_callback=answer_sdk) as sdk,
                            anyio.create_task_group() as group,
                        ):
                            for number in range(flows):
                                group.start_soon(chaos.flow, sdk.call_tool, number, gate)
                except Exception as error:  # the shared client itself gave up
                    chaos.errors[f"client: {type(error).__name__}"] += 1
                finally:
                    done.set()
            elapsed = time.monotonic() - started
    print(f"{mode}: {dict(chaos.stats)} errors={dict(chaos.errors)}")
    print(f"{mode}: {elapsed:.1f} s, {chaos.stats['completed'] / elapsed:.1f} flows/s")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "flowclient", int(sys.argv[2]) if len(sys.argv) > 2 else 300)
