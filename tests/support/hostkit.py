"""What a host's lifespan tells its task engine and its fleet bus, observed without replacing either."""

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


def observe_bus(bus: Any, events: list[str]) -> None:
    """Add the host's calls to a fleet bus to `events`: "bus start" (`start`), "bus close"."""
    start, close = bus.start, bus.close

    async def started(timeout: float = 10.0) -> None:
        events.append("bus start")
        await start(timeout=timeout)

    async def closed() -> None:
        events.append("bus close")
        await close()

    bus.start, bus.close = started, closed


__all__ = ["observe_bus", "observe_engine"]
