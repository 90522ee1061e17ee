"""`make demo`: one deployment flow whose rounds alternate between two server processes.

Starts two instances of examples/deployer_server.py (labels A and B) on free 127.0.0.1
ports, sharing a freshly generated state key, then drives the `deploy` flow with
examples/deployer_client.py so that consecutive rounds land on different processes.
Afterwards it reads the servers' audit log to show that each side effect really ran
exactly once, on whichever instance got there first, and runs the same flow once more
with a 2025-11-25 (legacy) client to show that one server serves both protocol eras.

The servers are always stopped: on success, on error and on Ctrl-C.
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
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as t
from deployer_client import SCENARIOS, Answerer, drive, summarize
from deployer_server import READY_PREFIX
from mcp import Client

HERE = Path(__file__).resolve().parent
SERVER = HERE / "deployer_server.py"
READY_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0


@dataclass
class Instance:
    label: str
    url: str
    process: asyncio.subprocess.Process
    stderr_path: Path


async def spawn(label: str, key: str, workdir: Path, stack: AsyncExitStack) -> Instance:
    """Start one deployer over HTTP on a free port; `stack` stops it on the way out, whatever happens."""
    env = os.environ | {
        "MRTR_STATE_KEY": key,
        "MRTR_INSTANCE": label,
        "MRTR_AUDIT_LOG": str(workdir / "audit.log"),
        "PYTHONUNBUFFERED": "1",
    }
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
            name = entry["step"] + (f":{entry['service']}" if "service" in entry else "")
            ran[name].append(entry["instance"])
    return dict(ran)


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
        return t.ListRootsResult(roots=[t.Root(uri="file:///srv/shop")])

    async with Client(
        url, mode="legacy", elicitation_callback=on_elicit, sampling_callback=on_sample, list_roots_callback=on_roots
    ) as client:
        result = await client.call_tool("deploy", {"app": "shop"})
        report = result.structured_content or {}
        return {"version": client.protocol_version, "asked": asked, "status": report.get("status")}


async def main() -> int:
    key = secrets.token_hex(32)
    with tempfile.TemporaryDirectory(prefix="mrtr-demo-") as tmp:
        workdir = Path(tmp)
        async with AsyncExitStack() as stack:
            print("starting two deployer instances with one shared state key ...")
            a = await spawn("A", key, workdir, stack)
            b = await spawn("B", key, workdir, stack)
            for instance in (a, b):  # both boot in parallel; wait for each in turn
                await wait_ready(instance)
            print(f"  instance A: {a.url}\n  instance B: {b.url}")

            script = {k: list(v) for k, v in SCENARIOS["production"].items()}
            print("\n=== 2026-07-28: one deploy flow, each round a new request to the other instance ===")
            result = await drive([a.url, b.url], "shop", Answerer(interactive=False, script=script))
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

        ok = (
            not result.is_error
            and (result.structured_content or {}).get("status") == "deployed"
            and once
            and legacy["status"] == "deployed"
        )
        print("\nservers stopped. demo " + ("OK" if ok else "FAILED"))
        return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped")
        sys.exit(130)
