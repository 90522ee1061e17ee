"""Cold installs a session will need, built in a background thread from the moment it is collected.

On a fresh clone the foreign clients' venvs (`tests/external/interop/peers.py`) and fastmcp-tasks'
venv (`benchmarks/fastmcp_tasks.py`) each take from half a minute to over a minute to build,
while the tests before the ones that need them run. Every builder is idempotent and holds a file
lock while it builds, so building early only moves the wait: the test that needs a venv calls the
same builder, which waits for the lock and finds the venv built, or builds it itself and reports
its own error if the early attempt failed. Node packages are not fetched early: concurrent `npx`
runs of one package can race in npm's cache.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection

__all__ = ["start"]

INTEROP = "tests/external/test_interop.py::"
BENCHMARKS = "tests/fleet/test_benchmarks_run.py::"


def _builders(nodeids: Collection[str]) -> list[Callable[[], object]]:
    def needed(prefix: str) -> bool:
        return any(nodeid.startswith(prefix) for nodeid in nodeids)

    builders: list[Callable[[], object]] = []
    if needed(f"{INTEROP}test_fastmcp_client") or needed(f"{INTEROP}test_fast_agent"):
        from tests.external.interop import peers

        builders += [peers.ensure_fastmcp, peers.ensure_fastagent]
    if needed(f"{BENCHMARKS}test_fastmcp_tasks_quick"):
        from benchmarks.fastmcp_tasks import ensure_venv

        builders.append(ensure_venv)
    return builders


def start(nodeids: Collection[str]) -> threading.Thread | None:
    """Build what the selected tests will need, in a daemon thread; None when they need nothing."""
    builders = _builders(nodeids)
    if not builders:
        return None

    def build() -> None:
        for builder in builders:
            with contextlib.suppress(Exception):  # the test that needs it calls the builder again and says why
                builder()

    thread = threading.Thread(target=build, name="mrtr-test-prefetch", daemon=True)
    thread.start()
    return thread
