"""A store that does not answer, as callers see it: one retryable error, one log line per burst.

Every public coroutine of a store class decorated with `store_boundary` is bounded in time
and has the driver's "the store is not there" errors (refused or dropped connections,
timeouts, a pool that found no connection, a server starting up or read-only after a
failover, SQLite's "database is locked") turned into `mrtr.StoreUnavailable`, which names
the store and reaches a client as a retryable JSON-RPC error instead of an "Internal
server error", an `isError` tool result or a traceback.

This is the one place that knows which driver errors are transient, so no method body
needs its own try/except; the store's scripts, SQL and keys stay as they are.

Logging is for the operator, not per call: the first failure of a burst is one WARNING
line, a burst that lasts repeats one line with its count at most every `_REPEAT` seconds,
and the first success after it says how long it lasted and how many calls failed. No
traceback (formatting one costs milliseconds, and through a rich handler much more, on an
instance whose every request is failing at once). Each failure also counts in the
`mrtr.store.errors` metric.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from mrtr._errors import StoreUnavailable
from mrtr._telemetry import metrics

logger = logging.getLogger("mrtr.store")

CALL_TIMEOUT = 10.0
"""Seconds one store call may take before it fails as `StoreUnavailable` (each driver has
shorter timeouts of its own; this bounds what they do not, e.g. a connection that stalls)."""

_REPEAT = 30.0  # seconds between two "still unavailable" lines of one burst
_SETTLE = 1.0  # seconds without a failure before a success ends the burst

C = TypeVar("C", bound=type)


class Burst:
    """One store's current run of failures, for logging it once (see the module docstring)."""

    def __init__(self, store: str, *, settle: float = _SETTLE) -> None:
        self.store = store
        self.settle = settle
        self.since: float | None = None
        self.failed = 0
        self._last_failure = 0.0
        self._logged_at = 0.0
        self._logged_count = 0

    def failure(self, exc: BaseException) -> None:
        error_type = type(exc).__name__
        metrics.store_error(self.store, error_type)
        now = self._last_failure = time.monotonic()
        self.failed += 1
        if self.since is None:
            self.since = self._logged_at = now
            self._logged_count = 1
            logger.warning(
                "task store %s unavailable (%s: %s); calls that need it get a retryable error until it answers",
                self.store,
                error_type,
                _short(exc),
            )
        elif now - self._logged_at >= _REPEAT:
            logger.warning(
                "task store %s still unavailable: %d failed calls in %.0f s (last: %s: %s)",
                self.store,
                self.failed,
                now - self.since,
                error_type,
                _short(exc),
            )
            self._logged_at, self._logged_count = now, self.failed

    def success(self) -> None:
        if self.since is None:
            return
        if time.monotonic() - self._last_failure < self.settle:
            return  # a store going down fails some calls and not others for a moment: one burst
        logger.warning(
            "task store %s answers again after %.1f s; %d calls failed meanwhile",
            self.store,
            time.monotonic() - self.since,
            self.failed,
        )
        self.since, self.failed = None, 0


_bursts: dict[str, Burst] = {}


def burst(store: str) -> Burst:
    """The process-wide burst tracker of one kind of store (`redis`, `postgresql`, `sqlite`)."""
    found = _bursts.get(store)
    if found is None:
        found = _bursts[store] = Burst(store)
    return found


class ThrottledLog(logging.Filter):
    """Let one record of each message template through per `_REPEAT` seconds (a driver's own
    per-connection lines while its server is down, e.g. psycopg's pool's "error connecting")."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[object, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.exc_info:
            return True
        now = time.monotonic()
        if now - self._last.get(record.msg, -_REPEAT) < _REPEAT:
            return False
        self._last[record.msg] = now
        return True


def throttle_logger(name: str) -> None:
    """Install `ThrottledLog` on the logger `name` once (idempotent)."""
    target = logging.getLogger(name)
    if not any(isinstance(f, ThrottledLog) for f in target.filters):
        target.addFilter(ThrottledLog())


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else "no detail"


def store_boundary(
    store: str,
    transient: Callable[[BaseException], bool],
    *,
    timeout: float = CALL_TIMEOUT,
    skip: frozenset[str] = frozenset({"close", "open"}),
) -> Callable[[C], C]:
    """Class decorator: every public `async def` of the class raises `StoreUnavailable(store)`
    for an error `transient` accepts, and for a call still unanswered after `timeout` s."""

    def decorate(cls: C) -> C:
        for name, fn in list(vars(cls).items()):
            if name.startswith("_") or name in skip or not inspect.iscoroutinefunction(fn):
                continue
            setattr(cls, name, _bounded(store, fn, transient, timeout))
        return cls

    return decorate


def _bounded(
    store: str,
    fn: Callable[..., Coroutine[Any, Any, Any]],
    transient: Callable[[BaseException], bool],
    timeout: float,
) -> Callable[..., Coroutine[Any, Any, Any]]:
    tracker = burst(store)

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(timeout):
                result = await fn(*args, **kwargs)
        except StoreUnavailable:
            raise
        except TimeoutError as exc:
            tracker.failure(exc)
            raise StoreUnavailable(store, f"no answer within {timeout:g} s") from exc
        except Exception as exc:
            if not transient(exc):
                raise
            tracker.failure(exc)
            raise StoreUnavailable(store, _short(exc)) from exc
        tracker.success()
        return result

    return call


__all__ = ["CALL_TIMEOUT", "Burst", "ThrottledLog", "burst", "store_boundary", "throttle_logger"]
