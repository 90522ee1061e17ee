"""A private `redis-server` for tests that restart Redis for real, without touching the shared one."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """`redis-server` on 127.0.0.1:`port`, no persistence; `kill()` is SIGKILL, `start()` brings it back."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @staticmethod
    def binary() -> str | None:
        return shutil.which("redis-server")

    def start(self) -> None:
        binary = self.binary()
        assert binary is not None, "redis-server is not installed"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*args, "--daemonize", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on {self.port}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
