"""Spawn the example deployer server as real processes, for tests that cross process lines.

In-memory tests cannot show that a flow survives a change of process: only separate
interpreters share nothing but the key. This module starts `examples/deployer_server.py`
under uvicorn on 127.0.0.1 (the OS picks a free port; the server prints its URL once it
listens), waits for it, and always stops it again. `spawn_servers` does the same for any
test server script (conformance fixtures, interop fixtures, the durable-task fleet).
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mcp import StdioServerParameters

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"  # the server scripts the tests spawn live here
SERVER_SCRIPT = ROOT / "examples" / "deployer_server.py"
READY_PREFIX = "deployer ready:"  # the line examples/deployer_server.py prints once it listens
START_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0


def new_key() -> str:
    """A fresh 32-byte state key, hex-encoded as `MRTR_STATE_KEY` expects."""
    return secrets.token_hex(32)


@dataclass
class ServerProcess:
    """One running deployer: its label, URL and stderr log (read it when something fails)."""

    label: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def server_env(key: str, label: str, audit_log: Path | None = None) -> dict[str, str]:
    """The environment variables the deployer reads."""
    env = {"MRTR_STATE_KEY": key, "MRTR_INSTANCE": label, "PYTHONUNBUFFERED": "1"}
    if audit_log is not None:
        env["MRTR_AUDIT_LOG"] = str(audit_log)
    return env


def stdio_params(key: str, label: str, audit_log: Path | None = None) -> StdioServerParameters:
    """How `mcp.Client` launches the deployer over stdio."""
    return StdioServerParameters(
        command=sys.executable, args=[str(SERVER_SCRIPT), "--stdio"], env=server_env(key, label, audit_log)
    )


@dataclass(frozen=True)
class ServerSpec:
    """How to start one test server process: which script, under what label and environment."""

    label: str
    env: Mapping[str, str]
    script: Path = SERVER_SCRIPT
    ready_prefix: str = READY_PREFIX


@contextmanager
def spawn_servers(specs: Sequence[ServerSpec], workdir: Path) -> Iterator[dict[str, ServerProcess]]:
    """Run each spec's script with `--port 0`; yields the servers by label, stops them all on exit.

    Every test server binds a free 127.0.0.1 port and prints `ready_prefix URL` once uvicorn
    accepts, so there is no port race and no readiness polling (a GET on /mcp would open an
    SSE stream that never ends). All processes boot in parallel; if one fails to come up
    within `START_TIMEOUT`, all are stopped and the error carries the failing server's log.
    """
    started: list[subprocess.Popen[bytes]] = []
    try:
        pending: list[tuple[ServerSpec, subprocess.Popen[bytes], Path]] = []
        for spec in specs:
            log_path = workdir / f"server-{spec.label}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, str(spec.script), "--port", "0"],
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=os.environ | {"PYTHONUNBUFFERED": "1"} | dict(spec.env),
                )
            started.append(process)
            pending.append((spec, process, log_path))
        servers = {}
        for spec, process, log_path in pending:
            url = _wait_ready(spec, process, log_path, time.monotonic() + START_TIMEOUT)
            servers[spec.label] = ServerProcess(spec.label, url, process, log_path)
        yield servers
    finally:
        for process in started:
            stop(process)


@contextmanager
def http_servers(
    specs: Sequence[tuple[str, str]], workdir: Path, *, audit_log: Path | None = None
) -> Iterator[dict[str, ServerProcess]]:
    """Run one HTTP deployer per `(label, key)`; yields them by label, stops them all on exit."""
    with spawn_servers([ServerSpec(label, server_env(key, label, audit_log)) for label, key in specs], workdir) as s:
        yield s


def _wait_ready(spec: ServerSpec, process: subprocess.Popen[bytes], log_path: Path, deadline: float) -> str:
    assert process.stdout is not None
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"server {spec.label} not ready after {START_TIMEOUT}s:\n{log_path.read_text()}")
            if selector.select(min(remaining, 0.2)):
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    process.wait(timeout=STOP_TIMEOUT)
                    raise RuntimeError(
                        f"server {spec.label} exited with {process.returncode} before ready:\n{log_path.read_text()}"
                    )
                buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode()
    if not line.startswith(spec.ready_prefix):
        raise RuntimeError(f"server {spec.label} printed {line!r} instead of its ready line")
    return line.removeprefix(spec.ready_prefix).split()[0]


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM for a graceful uvicorn shutdown, SIGKILL if it does not go in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


def audit_entries(path: Path, flow_id: str) -> list[Mapping[str, str]]:
    """The side effects one flow really executed, from the servers' shared audit log."""
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if str(e.get("key", "")).startswith(f"{flow_id}:")]
