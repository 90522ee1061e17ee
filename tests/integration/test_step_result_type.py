"""Issue 27, item 8: a step whose value does not match its return annotation is named as such.

Not a raw pydantic `ValidationError` in the log and "Error executing tool ..." at the client:
a tool error that names the step, the value and the annotation, first run and replay alike.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as t
import pytest
from mcp import Client
from pydantic import BaseModel

import mrtr
from tests.support.flowkit import new_server, text_of

pytestmark = pytest.mark.anyio


class Ok(BaseModel):
    ok: bool = True


class Plan(BaseModel):
    name: str
    seats: int


def fetch_total() -> int:
    return "12 EUR"  # type: ignore[return-value]  # the bug under test


def fetch_plan() -> Plan:
    return {"name": "team"}  # type: ignore[return-value]  # no seats


async def yes(context: Any, params: Any) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"ok": True})


def make_flows() -> mrtr.Flows:
    flows = mrtr.Flows(new_server("step-types"))

    @flows.tool()
    async def total(ctx: mrtr.FlowContext) -> str:
        value = await ctx.step("total", fetch_total)
        return f"total {value}"

    @flows.tool()
    async def plan(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("Go on?", Ok)  # the step runs in round 2, after a replay
        value = await mrtr.step("plan", fetch_plan)
        return value.name

    return flows


async def test_a_mismatched_step_value_is_a_tool_error_naming_step_value_and_annotation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flows = make_flows()
    with caplog.at_level(logging.INFO):
        async with Client(flows.server, elicitation_callback=yes) as client:
            result = await client.call_tool("total", {})
            assert result.is_error
            assert text_of(result) == (
                "Error executing tool total: step 'total' returned str '12 EUR', which does not match its return "
                "annotation int: Input should be a valid integer, unable to parse string as an integer"
            )

            result = await client.call_tool("plan", {})  # the official client runs both rounds
            assert result.is_error
            assert text_of(result) == (
                "Error executing tool plan: step 'plan' returned dict {'name': 'team'}, which does not match its "
                "return annotation Plan: seats: Field required"
            )
    assert isinstance(mrtr.StepResultError("x", step="s"), TypeError)
    for record in caplog.records:
        assert "ValidationError" not in record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()  # an anticipated error: no crash
        assert record.exc_info is None, record.getMessage()  # no traceback
