"""Set-up for the interop matrix: the fixture server as a process, and the foreign clients installed.

The foreign clients live outside the project's venv on purpose, so their dependency trees
can never change what the rest of the suite runs against:

- the TypeScript SDK client under Node 22 from `npx -p node@22.23.3` (the machine's own node
  may be older), installed with `npm ci` from the committed lock into `ts/node_modules`;
- FastMCP's client in its own venv, `.venv-fastmcp`, from `fastmcp-requirements.txt`;
- fast-agent in its own Python 3.12 venv, `.venv-fastagent`, from `fastagent-requirements.txt`.

Both installs are skipped when a stamp says the pinned files have not changed, and run under
a file lock, because colleagues may run the suite in the same tree at the same time.
Everything is loopback only: servers bind 127.0.0.1, clients connect there or over stdio.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.servers import ServerProcess, ServerSpec, new_key, server_env, spawn_servers

HERE = Path(__file__).resolve().parent
SERVER_SCRIPT = HERE / "server.py"
TS_DIR = HERE / "ts"
TS_CLIENT = TS_DIR / "client.mjs"
FASTMCP_SCRIPT = HERE / "fastmcp_client.py"
FASTMCP_REQUIREMENTS = HERE / "fastmcp-requirements.txt"
FASTMCP_VENV = HERE / ".venv-fastmcp"
AISDK_DIR = HERE / "aisdk"
AISDK_CLIENT = AISDK_DIR / "client.mjs"
AISDK_PACKAGE = "@ai-sdk/mcp"
AISDK_VERSION = "1.0.102"
FASTAGENT_SCRIPT = HERE / "fastagent_client.py"
FASTAGENT_REQUIREMENTS = HERE / "fastagent-requirements.txt"
FASTAGENT_VENV = HERE / ".venv-fastagent"
FASTAGENT_PYTHON = "3.12"
INSTALL_LOCK = HERE / ".install.lock"

NODE_SPEC = "node@22.23.3"
TS_PACKAGE = "@modelcontextprotocol/client"
TS_VERSION = "2.4.0"
START_TIMEOUT = 20.0
INSTALL_TIMEOUT = 600.0  # a cold npm/pip install takes ~10-60 s; leave room for a slow registry
_STAMP = ".mrtr-interop-stamp"


class PeerUnavailable(RuntimeError):
    """A tool a foreign client needs (npx) is not on this machine."""


class InstallFailed(RuntimeError):
    """Installing a foreign client failed; the message carries the installer's output."""


# -- the fixture server ------------------------------------------------------------------------


def stdio_command() -> list[str]:
    """How any client spawns the fixture server over stdio (our interpreter: it has mrtr)."""
    return [sys.executable, str(SERVER_SCRIPT), "--stdio"]


@contextmanager
def http_server(workdir: Path, label: str = "interop") -> Iterator[ServerProcess]:
    """The fixture server under uvicorn on a free 127.0.0.1 port; always stopped on exit."""
    spec = ServerSpec(label, server_env(new_key(), label), script=SERVER_SCRIPT)
    with spawn_servers([spec], workdir) as servers:
        yield servers[label]


# -- installs ----------------------------------------------------------------------------------


@contextmanager
def install_lock() -> Iterator[None]:
    """Serialise installs across concurrent pytest runs in one work tree."""
    with INSTALL_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _run(argv: Sequence[str | Path], what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(
            [str(a) for a in argv],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            env=foreign_env(),
        )
    except subprocess.TimeoutExpired as exc:
        raise InstallFailed(f"{what}: no result after {INSTALL_TIMEOUT:g}s ({exc.cmd})") from None
    if done.returncode != 0:
        raise InstallFailed(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def foreign_env() -> dict[str, str]:
    """Our environment minus what would make another interpreter pick up our venv's packages."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class NodeRuntime:
    """Node 22 as npx provides it, and the directory holding the installed TS client."""

    node: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.node), str(TS_CLIENT), *args]


def npx_command(script: str) -> list[str]:
    """`npx -y -p node@22 -c SCRIPT`; -y because the machine's ~/.npmrc may say yes=false."""
    npx = shutil.which("npx")
    if npx is None:
        raise PeerUnavailable("npx (Node.js) is not installed: the TypeScript SDK client cannot run")
    return [npx, "-y", "-p", NODE_SPEC, "-c", script]


def ensure_ts_client() -> NodeRuntime:
    """Node 22 and `@modelcontextprotocol/client@2.4.0` in `ts/node_modules` (npm ci from the lock)."""
    out = _run(npx_command("command -v node"), f"npx -p {NODE_SPEC}")
    node = Path(out.strip().splitlines()[-1])
    lock = TS_DIR / "package-lock.json"
    stamp = TS_DIR / "node_modules" / _STAMP
    with install_lock():
        wanted = _digest((TS_DIR / "package.json").read_bytes(), lock.read_bytes() if lock.exists() else b"")
        if not (stamp.exists() and stamp.read_text() == wanted):
            if lock.exists():
                _run(npx_command("npm ci --no-audit --no-fund"), "npm ci", cwd=TS_DIR)
            else:  # first time only: writes the lock, which is then committed
                install = f"npm install --save-exact --no-audit --no-fund {TS_PACKAGE}@{TS_VERSION}"
                _run(npx_command(install), "npm install", cwd=TS_DIR)
                wanted = _digest((TS_DIR / "package.json").read_bytes(), lock.read_bytes())
            stamp.write_text(wanted)
    installed = json.loads((TS_DIR / "node_modules" / TS_PACKAGE / "package.json").read_text())["version"]
    if installed != TS_VERSION:
        raise InstallFailed(f"{TS_PACKAGE} {installed} installed, the matrix pins {TS_VERSION}")
    return NodeRuntime(node)


def ensure_fastmcp() -> Path:
    """The FastMCP venv's interpreter, (re)built from the pinned requirements when they changed."""
    python = FASTMCP_VENV / "bin" / "python"
    stamp = FASTMCP_VENV / _STAMP
    with install_lock():
        wanted = _digest(FASTMCP_REQUIREMENTS.read_bytes(), sys.version.encode())
        if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
            shutil.rmtree(FASTMCP_VENV, ignore_errors=True)
            _run([sys.executable, "-m", "venv", FASTMCP_VENV], "python -m venv")
            pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            _run([*pip, "-r", FASTMCP_REQUIREMENTS], "pip install fastmcp")
            stamp.write_text(wanted)
    return python


def ensure_aisdk() -> tuple[Path, str]:
    """Node 22 and `@ai-sdk/mcp` in `aisdk/node_modules` (npm ci from the committed lock); the node
    binary and the installed version."""
    out = _run(npx_command("command -v node"), f"npx -p {NODE_SPEC}")
    node = Path(out.strip().splitlines()[-1])
    stamp = AISDK_DIR / "node_modules" / _STAMP
    with install_lock():
        lock = AISDK_DIR / "package-lock.json"
        wanted = _digest((AISDK_DIR / "package.json").read_bytes(), lock.read_bytes())
        if not (stamp.exists() and stamp.read_text() == wanted):
            _run(npx_command("npm ci --no-audit --no-fund"), "npm ci (aisdk)", cwd=AISDK_DIR)
            stamp.write_text(wanted)
    installed = json.loads((AISDK_DIR / "node_modules" / AISDK_PACKAGE / "package.json").read_text())["version"]
    if installed != AISDK_VERSION:
        raise InstallFailed(f"{AISDK_PACKAGE} {installed} installed, the matrix pins {AISDK_VERSION}")
    return node, str(installed)


def find_python(version: str) -> Path:
    """An interpreter of `version` (fast-agent needs 3.12): on PATH, or one pyenv installed."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [p / "bin" / "python" for p in sorted(root.glob(f"{version}.*"), reverse=True)]
    if (found := shutil.which(f"python{version}")) is not None:
        candidates.append(Path(found))  # may be a pyenv shim for a version that is not active: tried last
    for candidate in candidates:
        try:
            ran = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            continue
        if ran.returncode == 0 and ran.stdout.startswith(f"Python {version}."):
            return candidate
    raise PeerUnavailable(f"Python {version} is not installed (fast-agent needs it): pyenv install {version}")


def ensure_fastagent() -> Path:
    """fast-agent's own venv (Python 3.12), (re)built from the pinned requirements when they changed."""
    python = FASTAGENT_VENV / "bin" / "python"
    stamp = FASTAGENT_VENV / _STAMP
    base = find_python(FASTAGENT_PYTHON)
    with install_lock():
        wanted = _digest(FASTAGENT_REQUIREMENTS.read_bytes(), str(base).encode())
        if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
            shutil.rmtree(FASTAGENT_VENV, ignore_errors=True)
            _run([base, "-m", "venv", FASTAGENT_VENV], f"python{FASTAGENT_PYTHON} -m venv")
            pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            _run([*pip, "-r", FASTAGENT_REQUIREMENTS], "pip install fast-agent-mcp")
            stamp.write_text(wanted)
    return python


# -- running a foreign client ------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """What one client run saw: the negotiated version, the final result and every question."""

    protocol_version: str | None
    is_error: bool
    text: str
    asked: list[str]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        return cls(data["protocolVersion"], bool(data["isError"]), str(data["text"]), list(data["asked"]))


def parse_report(stdout: str, stderr: str, returncode: int) -> Report:
    """The client's one JSON line; anything else fails with the client's full output."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    context = f"exit {returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    if not lines:
        raise AssertionError(f"the client printed no report; {context}")
    data = json.loads(lines[-1])
    if "error" in data or returncode != 0:
        raise AssertionError(f"the client failed: {data.get('error')}; {context}")
    return Report.from_json(data)
