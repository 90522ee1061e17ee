"""Claude Code, pinned, installed once per machine under a cache directory (npm, no global install).

`ensure_claude_code()` returns the `claude` executable of `@anthropic-ai/claude-code@VERSION`,
installed with `npm install --prefix` under `~/.cache/mrtr/claude-code-VERSION` (or
`$MRTR_CACHE/claude-code-VERSION`): one install shared by every run and worktree, outside
the repository. A second caller waits on a file lock for the first one's install. npm picks
the platform's native binary (an optional dependency); the package asks for Node >= 22 in its
`engines` but runs nothing on Node itself once installed, so npm's engine warning on an older
Node is harmless.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PACKAGE = "@anthropic-ai/claude-code"
VERSION = "2.1.332"
INSTALL_TIMEOUT = 600.0


class Unavailable(RuntimeError):
    """Claude Code cannot be installed here (no npm, or the registry cannot be reached): the reason."""


def cache_dir() -> Path:
    base = Path(os.environ.get("MRTR_CACHE") or Path.home() / ".cache" / "mrtr")
    return base / f"claude-code-{VERSION}"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".install.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _version_of(claude: Path) -> str | None:
    try:
        done = subprocess.run([str(claude), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.split(" ", 1)[0].strip() if done.returncode == 0 else None


def ensure_claude_code() -> Path:
    """The pinned `claude` executable, installed on first use.

    Raises:
        Unavailable: npm is missing, or `npm install` failed (its output says why: most often
            the registry could not be reached).
    """
    directory = cache_dir()
    claude = directory / "node_modules" / ".bin" / "claude"
    with _locked(directory):
        if claude.exists() and _version_of(claude) == VERSION:
            return claude
        npm = shutil.which("npm")
        if npm is None:
            raise Unavailable("npm (Node.js) is not installed, so Claude Code cannot be installed")
        argv = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(directory), f"{PACKAGE}@{VERSION}"]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, stdin=subprocess.DEVNULL, check=False
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"`npm install {PACKAGE}@{VERSION}` gave no result in {INSTALL_TIMEOUT:g}s") from None
        if done.returncode != 0:
            raise Unavailable(f"`npm install {PACKAGE}@{VERSION}` failed ({done.returncode}): {done.stderr[-800:]}")
        found = _version_of(claude)
        if found != VERSION:
            raise Unavailable(f"{claude} reports version {found!r} after installing {VERSION}")
        return claude


__all__ = ["PACKAGE", "VERSION", "Unavailable", "cache_dir", "ensure_claude_code"]
