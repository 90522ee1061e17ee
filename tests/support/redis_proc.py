"""A private `redis-server` for tests that restart Redis for real, without touching the shared one."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.ports import restartable_port


def free_port() -> int:
    """A free port below the ephemeral range (`tests.support.ports`): this server is killed and
    started again on it, and clients dial it while it is down."""
    return restartable_port()


class RedisProcess:
    """`redis-server` on 127.0.0.1:`port`; `kill()` is SIGKILL, `start()` brings it back on the same port.

    Without `appendfsync`, nothing persists and a restart comes back empty. With `appendfsync`
    ("always" or "everysec"), the append-only file lives in `workdir`, so a restart after `kill()`
    reloads the data, as the docs recommend for a production store.
    """

    def __init__(self, workdir: Path, port: int | None = None, *, appendfsync: str | None = None) -> None:
        assert appendfsync in (None, "always", "everysec"), appendfsync
        self.port = port or free_port()
        self.workdir = workdir
        self.appendfsync = appendfsync
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
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.appendfsync is None:
            args += ["--appendonly", "no"]
        else:
            args += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
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

    def restart(self) -> None:
        """SIGKILL, then start again on the same port (data survives only with `appendfsync`)."""
        self.kill()
        self.start()

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
