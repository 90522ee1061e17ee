"""How one run of a task flow starts and where it ended, as every engine records it.

Shared by the lease runtime and the Temporal engine, so both read a task the same way
(`prologue`: the journal and capabilities decoded, the deadline checked) and a flow's value,
its tool errors and its protocol errors reach the wire exactly alike whichever engine ran it
(`settle`): a value becomes the tool's `CallToolResult`; a tool error (or the user's refusal)
completes the task with `isError`, as the call would have; a protocol error fails it with
that JSON-RPC error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, CallToolResult, ClientCapabilities, InputRequiredResult, TextContent

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal, JournalFormatError, JournalFromNewerVersion
from mrtr._engine.run import Outcome, as_protocol_error, check_deadline, close_round, wire_asks
from mrtr._engine.spec import FlowSpec
from mrtr._errors import FlowError, InputRefused
from mrtr._telemetry import tracing
from mrtr._wire import InputRequests, Wait, iso
from mrtr.tasks._seam import ConvertResult

logger = tracing.get_logger("mrtr.tasks.outcome")


@dataclass
class Settled:
    """The task state a run ends in: `input_required`, `completed`, `failed`, or `working` parked
    on durable waits (`waiting`: timers and events; `wake_at`: the earliest due time, if any)."""

    status: str
    input_requests: InputRequests = field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    waiting: list[Wait] = field(default_factory=list)
    status_message: str | None = None

    @property
    def wake_at(self) -> float | None:
        """When a parked run must run again at the latest (None: only an event wakes it)."""
        dues = [until for w in self.waiting if (until := w["until"]) is not None]
        return min(dues) if dues else None

    def changes(self) -> dict[str, Any]:
        """The `TaskRecord` fields this outcome sets."""
        fields: dict[str, Any] = {
            "status": self.status,
            "input_requests": self.input_requests,
            "waiting": self.waiting,
            "status_message": self.status_message,
        }
        if self.result is not None:
            fields["result"] = self.result
        if self.error is not None:
            fields["error"] = self.error
        return fields


def prologue(
    spec: FlowSpec, task_id: str, journal: str, capabilities: dict[str, Any]
) -> tuple[Journal, ClientCapabilities | None] | Settled:
    """What a run of the task starts from: its journal and the creating request's capabilities,
    or the `failed` state a task that cannot run at all ends in.

    A record this server cannot read (e.g. written by an incompatible version) fails once,
    clearly, rather than have every instance retry it forever; a flow past its deadline fails
    as inline (counted from the first round, never renewed).

    Raises:
        JournalFromNewerVersion: A newer mrtr wrote the journal: leave the task to an instance
            that can read it (never failed: nothing is wrong with it).
    """
    try:
        decoded = journal_codec.decode(journal)
        declared = ClientCapabilities.model_validate(capabilities) if capabilities else None
    except JournalFromNewerVersion:
        raise
    except (JournalFormatError, ValueError) as exc:
        logger.error("task %s: unreadable record: %s", task_id, exc)
        return Settled(
            "failed", error={"code": INTERNAL_ERROR, "message": "this server cannot read the task's journal"}
        )
    try:
        check_deadline(spec, decoded)
    except FlowError as exc:
        return Settled("failed", error=as_protocol_error(spec, exc).error.model_dump(mode="json", exclude_none=True))
    return decoded, declared


def settle(spec: FlowSpec, convert: ConvertResult, outcome: Outcome, task_id: str) -> Settled:
    """The state `outcome` leaves the task in (counts the round when it parks, as inline)."""
    if outcome.parked and not outcome.replay.parked and outcome.waiting:
        # Waits only: not a round (the client is not asked); the task stays `working`.
        outcome.replay.journal.pending = {}
        return Settled("working", waiting=outcome.waiting, status_message=describe_waits(outcome.waiting))
    if outcome.parked:
        try:
            close_round(spec, outcome.replay, task=True)  # task_max_rounds and a changing question
        except FlowError as exc:
            outcome.parked, outcome.error = False, exc
    if outcome.parked:
        asks = {
            key: request.model_dump(mode="json", by_alias=True, exclude_none=True)
            for key, request in wire_asks(outcome.replay).items()
        }
        return Settled("input_required", input_requests=asks, waiting=outcome.waiting)
    error = outcome.error
    if isinstance(error, FlowError):
        error = as_protocol_error(spec, error)
    if error is None:
        return Settled("completed", result=wire(convert(outcome.value)))
    if isinstance(error, MCPError):  # a protocol error: the task fails with it
        return Settled("failed", error=error.error.model_dump(mode="json", exclude_none=True))
    # a tool error: the task completes with isError, as the call would have
    if isinstance(error, InputRefused | ToolError):
        text = str(error)
    else:
        logger.error("task %s: flow %r raised", task_id, spec.name, exc_info=error)
        text = f"Error executing tool {spec.name}"
    return Settled(
        "completed", result=wire(CallToolResult(content=[TextContent(type="text", text=text)], is_error=True))
    )


def describe_waits(waiting: Sequence[Wait]) -> str:
    """The `statusMessage` of a task parked on waits: what it waits for, and until when."""
    parts = []
    for wait in waiting:
        until = wait.get("until")
        when = f" until {iso(until)}" if until is not None else ""
        if wait.get("kind") == "timer":
            parts.append(f"sleeping{when}")
        else:
            parts.append(f"waiting for event {wait.get('name')!r}" + (f" (timeout{when})" if when else ""))
    return "; ".join(parts)


def wire(result: CallToolResult | InputRequiredResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


__all__ = ["Settled", "describe_waits", "prologue", "settle", "wire"]
