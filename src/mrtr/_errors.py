"""What can go wrong in a flow, as exceptions a flow author (or client) can catch by name.

Two families:

- `InputRefused` (`Declined`, `Cancelled`): the *user* said no. Flow code may catch these
  and branch; uncaught, they end the call as a tool error with a readable message.
- `FlowError`: the *flow* cannot go on (broken determinism, limits). These become precise
  JSON-RPC errors on the wire, never a stack trace.

And one control-flow signal, `FlowSuspended`, which flow code never needs to catch.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR


class InputRefused(Exception):
    """The client answered an elicitation with something other than `accept`."""

    action: str = "refused"

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key
        self.question = message

    def __str__(self) -> str:
        return f"The user {self.action} the request: {self.question}"


class Declined(InputRefused):
    """The user explicitly declined (`action: "decline"`)."""

    action = "declined"


class Cancelled(InputRefused):
    """The user dismissed the request without choosing (`action: "cancel"`)."""

    action = "cancelled"


class FlowError(Exception):
    """A flow cannot continue; carries a stable `reason` code for the wire."""

    reason: str = "flow_error"


class NondeterminismError(FlowError):
    """Replaying the flow took a different path than the journal recorded.

    Code between asks must be deterministic; clocks, randomness and I/O go through
    `ctx.step` so their results are journaled and replayed, not recomputed.
    """

    reason = "nondeterministic_flow"


class FlowDefinitionError(FlowError):
    """The flow uses the API in a way that can never work (e.g. a reused explicit key)."""

    reason = "invalid_flow"


class StateTooLarge(FlowError):
    """The sealed `requestState` would exceed the configured cap."""

    reason = "request_state_too_large"


class TooManyRounds(FlowError):
    """The flow asked the client more times than its round cap allows.

    On the wire (-32602) its `data` names the cap and the rounds used (`maxRounds`,
    `roundsUsed`) beside the reason, so a client can say how far the call got.
    """

    reason = "too_many_rounds"

    def __init__(self, message: str, *, max_rounds: int | None = None, rounds_used: int | None = None) -> None:
        super().__init__(message)
        self.max_rounds = max_rounds
        self.rounds_used = rounds_used

    @property
    def data(self) -> dict[str, int]:
        """What the wire error's `data` adds to its reason: the cap and the rounds used."""
        return {
            key: value
            for key, value in (("maxRounds", self.max_rounds), ("roundsUsed", self.rounds_used))
            if value is not None
        }


class FlowExpired(FlowError):
    """The flow's overall deadline (counted from its first round) has passed."""

    reason = "flow_expired"


class StepResultError(ToolError, TypeError):
    """A step's value does not match its function's return annotation (a bug in the step or its annotation).

    A `ToolError`, so the call ends as a tool error that names the step, the value and the
    annotation (not a bare pydantic `ValidationError`, not a generic "Error executing tool").
    """

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message)
        self.step = step


class EventTimeout(ToolError, TimeoutError):
    """`ctx.wait_for_event(name, timeout=...)` reached its timeout before the event came.

    A `ToolError` (uncaught, the task completes with `isError` and this message) and a
    `TimeoutError`, so `except TimeoutError` catches it as it would `asyncio.timeout`'s.
    """

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(f"no event {name!r} arrived within {timeout:g}s")
        self.name = name
        self.timeout = timeout


class EventNotDelivered(Exception):
    """`Flows.send_event` (or `mrtr tasks event`) could not deliver: `reason` says why.

    `"unknown_task"` (no such task, or past its TTL), `"task_finished"` (completed, failed or
    cancelled: nothing will ever wait again), `"busy"` (kept losing a race; send again),
    `"sealed"` (the task's record is sealed at rest and the sender holds no key that opens it).
    """

    def __init__(self, message: str, *, reason: str, task_id: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.task_id = task_id


STORE_UNAVAILABLE = "store_unavailable"
"""`StoreUnavailable`'s `data.reason`."""


class StoreUnavailable(MCPError):
    """The task store (or the replay guard's ledger) did not answer: retry the same call shortly.

    On the wire: JSON-RPC error -32603 whose message names the store and says "retry", with
    `data = {"reason": "store_unavailable", "store": "redis" | "postgresql" | "sqlite",
    "retryable": true}` (the replay guard says `"reason": "replay_guard_unavailable"`). A
    client that sees `data.retryable` may send the same request again: nothing it asked for
    was done (or, for a write that may have landed, doing it again is safe). `FlowClient`
    retries these by itself. Raised by mrtr's stores at their boundary, from the driver's
    connection, timeout and "database is locked" errors (kept as `__cause__`).
    """

    def __init__(self, store: str, detail: str = "", *, reason: str = STORE_UNAVAILABLE, **data: Any) -> None:
        message = f"the task store ({store}) is unavailable; retry in a few seconds"
        super().__init__(
            code=INTERNAL_ERROR,
            message=message,
            data={"reason": reason, "store": store, "retryable": True, **data},
        )
        self.store = store
        self.detail = detail

    def __reduce__(self) -> Any:  # picklable, as exceptions crossing processes are expected to be
        return (type(self), (self.store, self.detail))


class FlowSuspended(BaseException):
    """The round has ended: this run of the flow is unwinding and may not ask, step or journal.

    Raised by every `ctx` call made after the round settled — typically from a `finally`
    or `except` block running because the flow is being cancelled at the end of a round.
    The flow runs again from the top next round, and its real end comes then. A
    `BaseException`, like `asyncio.CancelledError`, so `except Exception` does not swallow it.
    """

    def __init__(self, flow: str) -> None:
        super().__init__(
            f"flow {flow!r} is suspended until the client answers; ctx calls made while it unwinds do nothing"
        )


__all__ = [
    "Cancelled",
    "Declined",
    "EventNotDelivered",
    "EventTimeout",
    "FlowDefinitionError",
    "FlowError",
    "FlowExpired",
    "FlowSuspended",
    "InputRefused",
    "NondeterminismError",
    "StateTooLarge",
    "StepResultError",
    "StoreUnavailable",
    "TooManyRounds",
]
