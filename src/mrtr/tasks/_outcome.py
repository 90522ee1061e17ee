"""Where one run of a task flow ended, as the task state every engine records.

Shared by the lease runtime and the Temporal engine, so a flow's value, its tool errors and
its protocol errors reach the wire exactly alike whichever engine ran it: a value becomes
the tool's `CallToolResult`; a tool error (or the user's refusal) completes the task with
`isError`, as the call would have; a protocol error fails it with that JSON-RPC error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, InputRequiredResult, TextContent

from mrtr._engine import tracing
from mrtr._engine.engine import Outcome, as_protocol_error, close_round, wire_asks
from mrtr._engine.spec import FlowSpec
from mrtr._errors import FlowError, InputRefused
from mrtr.tasks._seam import ConvertResult

logger = tracing.get_logger("mrtr.tasks.outcome")


@dataclass
class Settled:
    """The task state a run ends in: `input_required`, `completed` or `failed`."""

    status: str
    input_requests: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    def changes(self) -> dict[str, Any]:
        """The `TaskRecord` fields this outcome sets."""
        fields: dict[str, Any] = {"status": self.status, "input_requests": self.input_requests}
        if self.result is not None:
            fields["result"] = self.result
        if self.error is not None:
            fields["error"] = self.error
        return fields


def settle(spec: FlowSpec, convert: ConvertResult, outcome: Outcome, task_id: str) -> Settled:
    """The state `outcome` leaves the task in (counts the round when it parks, as inline)."""
    if outcome.parked:
        try:
            close_round(spec, outcome.replay)  # max_rounds and a changing question, as inline
        except FlowError as exc:
            outcome.parked, outcome.error = False, exc
    if outcome.parked:
        asks = {
            key: request.model_dump(mode="json", by_alias=True, exclude_none=True)
            for key, request in wire_asks(outcome.replay).items()
        }
        return Settled("input_required", input_requests=asks)
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


def wire(result: CallToolResult | InputRequiredResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


__all__ = ["Settled", "settle", "wire"]
