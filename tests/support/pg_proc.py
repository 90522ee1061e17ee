"""A private PostgreSQL server for tests that kill and restart it, never touching the shared one.

The cluster lives in a fresh temporary directory owned by the `postgres` user, because
PostgreSQL refuses to run as root and tests run as root in CI and here. It listens on
127.0.0.1 at a free port with trust auth and a `test` database, so its `url` works the way
the shared instance's does. `kill()` is SIGKILL of the postmaster (crash recovery on the
next `start()`, as after a real crash); `stop()` is a fast, clean shutdown.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.redis_proc import free_port

__all__ = ["PostgresProcess"]


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


class PostgresProcess:
    """`postgres` on 127.0.0.1:`port` with database `test`; `kill()`, `stop()`, `start()`, `restart()`."""

    def __init__(self, port: int | None = None, *, user: str = "postgres") -> None:
        self.port = port or free_port()
        self.user = user
        self.root = Path(tempfile.mkdtemp(prefix="mrtr-pg-"))
        self.datadir = self.root / "data"
        self.logfile = self.root / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._initialised = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"

    @staticmethod
    def available() -> str | None:
        """None when a private server can be started, else the reason it cannot."""
        if _bindir() is None:
            return "PostgreSQL server binaries (initdb, postgres) are not installed"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "there is no `postgres` system user to run a private server as"
        return None

    def _run_as(self) -> dict[str, object]:
        """Popen arguments that run a command as the `postgres` user when we are root.

        Setting the user in the child (not through `runuser`/`su`) keeps the postmaster our
        direct child, so a SIGKILL leaves no zombie that a restart would mistake for a live one.
        """
        if os.geteuid() != 0:
            return {}
        entry = pwd.getpwnam(self.user)
        return {
            "user": entry.pw_uid,
            "group": entry.pw_gid,
            "extra_groups": [],
            "env": {**os.environ, "HOME": self.root.as_posix()},
        }

    def _init(self) -> None:
        bindir = _bindir()
        assert bindir is not None, self.available()
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)
        self.logfile.touch()
        if os.geteuid() == 0:
            os.chown(self.logfile, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.root,
            **self._run_as(),  # type: ignore[call-overload]
        )
        # fsync off: a SIGKILL of the server loses nothing the OS already holds; only a machine
        # crash would, and tests never cause one. Commits stay synchronous so none is lost.
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                "fsync = off\nfull_page_writes = off\nmax_connections = 100\n"
            )
        self._initialised = True
        self.start()
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "test"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def start(self) -> None:
        """Start (the first call also runs initdb) and wait until it accepts connections."""
        if not self._initialised:
            self._init()
            return
        bindir = _bindir()
        assert bindir is not None
        with open(self.logfile, "ab") as log:
            self.process = subprocess.Popen(  # type: ignore[call-overload]
                [str(bindir / "postgres"), "-D", str(self.datadir)],
                stdout=log,
                stderr=log,
                cwd=self.root,
                start_new_session=True,
                **self._run_as(),
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.logfile.read_text()[-2000:]}")
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-q"],
                check=False,
            ).returncode
            if ready == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not accept connections on {self.port}")

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _signal(self, sig: int) -> None:
        pid = self._postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if self.process is not None:
            if sig == signal.SIGKILL:
                # The postmaster's children would linger holding the port; kill the whole session.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None
        self._wait_port_free()

    def _wait_port_free(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                return
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends: a crash, recovered on the next start."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """A fast shutdown: clients are disconnected, the data is consistent."""
        self._signal(signal.SIGINT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
