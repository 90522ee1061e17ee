"""What a registered flow is, and what an instance lends the engine to run it.

Plain data and small protocols, imported by every layer (engine, task runtime, guard,
shedding, tracing) and importing none of them: the engine depends on these shapes, never
on the services behind them (Temporal-style inversion), so no module imports back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mcp_types import ClientCapabilities

from mrtr._engine.asks import Capability
from mrtr._engine.journal import Journal
from mrtr._wire import CreateTaskResult

TaskSupport = Literal["never", "optional", "required"]

TASK_MAX_ROUNDS = 1000
"""Default cap on a durable task's rounds of client input (inline rounds before it became a task
included). A task's rounds cost the client no round trip it caps (`tasks/get` and `tasks/update`
have no per-call limit) and its journal lives in the store, not in `requestState`, so the cap
is not the inline 10: it only stops a flow that asks forever (a loop that never ends, a
question that never settles), well before the task's deadline and TTL would."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-flow limits. The deadline counts from the flow's first round and never renews."""

    max_rounds: int = 10
    """Rounds of client input an inline call may take (each is a round trip the client caps)."""
    deadline: float = 3600.0
    max_state_bytes: int = 64 * 1024
    task_max_rounds: int = TASK_MAX_ROUNDS
    """Rounds of client input a durable task may take (see `TASK_MAX_ROUNDS`); never fewer than
    `max_rounds` (`task_rounds`)."""

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        if self.task_max_rounds < 1:
            raise ValueError("task_max_rounds must be at least 1")
        if not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ValueError("deadline must be a positive number of seconds")
        if self.max_state_bytes < 256:
            raise ValueError("max_state_bytes below 256 cannot hold a sealed journal")

    @property
    def task_rounds(self) -> int:
        """A task's cap: `task_max_rounds`, or the inline cap where a flow raised that higher."""
        return max(self.task_max_rounds, self.max_rounds)


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """A registered flow: the user's function and how to call it. Data only, no services."""

    name: str
    fn: Callable[..., Any]
    ctx_param: str | None
    limits: Limits
    audience: str
    task: TaskSupport = "never"
    mrtr_first: bool = False
    """Task calls ask inline (MRTR rounds) until the first step or `continue_as_task()`."""
    requires: tuple[Capability, ...] = ()
    """Client capabilities every request must declare (checked before the flow runs)."""
    wrap_context: Callable[[Any], Any] | None = None
    """What the flow's context parameter receives, made from its `FlowContext` (FastMCP's `Context`
    for 3.x-style flows); None: the `FlowContext` itself."""
    strict: bool = False
    """Log every replay of the body at WARNING (not DEBUG): code outside `ctx.step` runs again."""

    @property
    def request_param(self) -> str:
        """Where the SDK injects its `Context`: the flow's own ctx parameter, or a hidden one."""
        return self.ctx_param or "mrtr_request"


class TaskStarter(Protocol):
    """Turns a call into a durable task: the host's side of the task seam (`mrtr.tasks._start.HostStarter`,
    which reads the request into the task's creator for whichever task engine serves)."""

    async def start(
        self,
        spec: FlowSpec,
        arguments: Mapping[str, Any],
        capabilities: ClientCapabilities | None,
        journal: Journal,
        request: Any = None,
    ) -> CreateTaskResult:
        """Create the task durably and start it; returns its `CreateTaskResult`.

        `request` is the call's SDK `ServerRequestContext`, handed over explicitly: the task
        belongs to its principal, and its `mrtr/idempotencyKey` names the task (None: no request,
        an unowned task without a key).
        """
        ...


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """A call that became a durable task: how a request ends in place of the flow's value.

    `result` is the task's `CreateTaskResult`. Each host hands it to its tasks extension in the
    framework's own way (the SDK lets an `MCPError` through its tool wrapper; FastMCP passes a
    `ToolResult` through untouched).
    """

    result: CreateTaskResult


class ShedCheck(Protocol):
    def check(self, replay: Any) -> None:
        """Raise to end the round here, handing it back as state only (the instance is overloaded)."""
        ...


__all__ = [
    "TASK_MAX_ROUNDS",
    "FlowSpec",
    "Limits",
    "ShedCheck",
    "TaskStarted",
    "TaskStarter",
    "TaskSupport",
]
