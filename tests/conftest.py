"""Shared pytest settings: mrtr runs flows as asyncio tasks, so every async test uses asyncio."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
