"""What a host's lifespan tells its task engine, observed without replacing the engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def observe_engine(engine: Any, note: Callable[[str], None] | None = None) -> list[str]:
    """The calls the host makes to `engine` from now on, in order: "start" (`ensure_running`),
    "close"; each is also passed to `note` (a server in a process of its own writes them down)."""
    events: list[str] = []
    start, close = engine.ensure_running, engine.close

    def record(what: str) -> None:
        events.append(what)
        if note is not None:
            note(what)

    def ensure_running() -> None:
        record("start")
        start()

    async def closed() -> None:
        record("close")
        await close()

    engine.ensure_running, engine.close = ensure_running, closed
    return events


__all__ = ["observe_engine"]
