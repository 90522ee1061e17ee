"""`--bus URL` on the commands that change tasks: their changes reach the fleet bus, as the runtime's do."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from mrtr.cli._errors import Unreachable, UsageError

if TYPE_CHECKING:
    from mrtr.buses import BrokerBus

_FLUSH_WAIT = 5.0


@contextlib.asynccontextmanager
async def fleet_bus(url: str | None, namespace: str | None) -> AsyncIterator[BrokerBus | None]:
    """The fleet bus `--bus` names (None without one); on the way out, waits until what was
    published has reached the broker (a few seconds at most), then closes it."""
    if not url:
        yield None
        return
    from mrtr.buses import open_bus

    try:
        bus = open_bus(url, namespace=namespace)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"cannot open the bus: {exc}") from None
    try:
        try:
            await bus.start(timeout=_FLUSH_WAIT)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"cannot connect to the bus {url}: {exc or 'timed out'}") from None
        yield bus
        deadline = time.monotonic() + _FLUSH_WAIT
        while bus.sent < bus.published and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await bus.close()


__all__ = ["fleet_bus"]
