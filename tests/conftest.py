"""Shared pytest settings: mrtr runs flows as asyncio tasks, so every async test uses asyncio."""

from collections.abc import Iterator

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """A real Temporal dev server for the session (`tests/support/temporalkit.py`); started on first use."""
    from tests.support.temporalkit import in_ci, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        if in_ci():
            pytest.fail(f"{reason}; CI must run the Temporal tests, not skip them")
        pytest.skip(reason)
    from mrtr.temporal._devserver import dev_server

    with dev_server() as address:  # fails loudly (with the server's log) if it cannot start
        yield address
