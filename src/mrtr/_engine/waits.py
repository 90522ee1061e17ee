"""Durable waits as the engine sees them: timers and events a task's flow parks on.

`ctx.sleep` and `ctx.wait_for_event` journal a wait entry under a key of their own
(`@sleep`, `@event.<name>`, numbered like steps, per branch): first its due time, then,
once it resolves, how (`done`, and the event's id and payload, or `timeout`). A journaled
resolution replays at once; a new one is taken only when the flow is quiescent (every
branch parked, no step running), exactly where the run that first took it stood, so a
flow that waits on several things at once (`ctx.gather`, `asyncio.wait`) replays the same
way it first ran. A wait that cannot resolve parks its branch like an unanswered ask; a run
that settles with waits only leaves the task `working`, parked until the earliest due time
or a matching event (the task engine's part: `WaitSource`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from datetime import timedelta
from typing import Any, NotRequired, Protocol, TypedDict

from mrtr._errors import FlowDefinitionError

TIMER = "@sleep"
EVENT_PREFIX = "@event."
CALLBACK_PREFIX = "@callback."

_EVENT_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class WaitState(TypedDict):
    """A durable wait as its journal step holds it: when it falls due, and, once resolved, how.

    Journaled with the due time first (so a replay waits for the same moment), then again with
    `done` when a timer fires, an event arrives (`id`, `data`) or an event's timeout passes
    (`timeout`). What `ctx.sleep` and `ctx.wait_for_event` read back.
    """

    due: float | None
    """Epoch seconds it falls due (None: an event with no timeout)."""
    done: NotRequired[int]
    """1 once resolved; absent while it waits."""
    id: NotRequired[str]
    """The delivered event's id."""
    data: NotRequired[Any]
    """The delivered event's payload."""
    timeout: NotRequired[int]
    """1: the event's timeout passed first."""


class WaitSource(Protocol):
    """What a durable task's engine lends one run of its flow: the clock, its events, its URLs."""

    def now(self) -> float:
        """Epoch seconds on the engine's clock (the store's, for the lease runtime)."""
        ...

    def take_event(self, name: str, taken: Collection[str]) -> tuple[str, Any] | None:
        """The oldest delivered event `name` whose id is not in `taken`, as (id, payload)."""
        ...

    def callback_url(self, name: str, expires_at: float) -> str:
        """A sealed, single-use URL that delivers a POSTed JSON body as event `name` to this task."""
        ...


def seconds(delay: float | timedelta, what: str) -> float:
    """`delay` as a finite, non-negative number of seconds."""
    value = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite, non-negative number of seconds or a timedelta, not {delay!r}")
    return value


def check_event_name(name: str) -> str:
    """Event names travel in URLs, journal keys and the CLI: a short, plain token."""
    if not isinstance(name, str) or not _EVENT_NAME.match(name):
        raise ValueError(f"event name {name!r} must be 1-64 characters of letters, digits, '_', '.', ':' or '-'")
    return name


def needs_task(flow: str, what: str) -> FlowDefinitionError:
    return FlowDefinitionError(
        f"flow {flow!r}: ctx.{what}() waits durably, so it runs only in a durable task: register the flow "
        "with @flows.tool(task='required') (or task='optional', called by a client that declares the tasks "
        "extension); an ordinary call cannot park on a timer or an event"
    )


def taken_events(steps: dict[str, tuple[str, Any]]) -> set[str]:
    """Ids of the events this journal's waits already consumed."""
    return {
        value["id"]
        for key, (_, value) in steps.items()
        if EVENT_PREFIX in key and isinstance(value, dict) and "id" in value
    }


__all__ = [
    "CALLBACK_PREFIX",
    "EVENT_PREFIX",
    "TIMER",
    "WaitSource",
    "WaitState",
    "check_event_name",
    "needs_task",
    "seconds",
    "taken_events",
]
