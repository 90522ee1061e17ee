"""Form constraints on the SDK host: said in words, refused answers capped, uncarriable keywords refused."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

import mrtr
from mrtr._engine.asks import MAX_REJECTED, render_form_schema
from tests.support.flowkit import Driver, manual_client, new_server

pytestmark = pytest.mark.anyio


class Seat(BaseModel):
    row: int = Field(ge=1, le=40, description="Row")
    code: str = Field(pattern=r"^[A-F]$", json_schema_extra={"x-widget": "letter"})


def test_constraints_are_said_in_the_description_and_keywords_stay() -> None:
    fields = render_form_schema(Seat)["properties"]
    assert fields["row"]["description"] == "Row (at least 1; at most 40)" and fields["row"]["minimum"] == 1
    assert fields["code"]["description"] == "Must match the pattern ^[A-F]$" and fields["code"]["pattern"] == "^[A-F]$"


def test_a_keyword_no_form_can_carry_is_refused_when_the_form_is_built() -> None:
    class Account(BaseModel):
        user: str = Field(json_schema_extra={"not": {"const": "root"}})

    with pytest.raises(TypeError, match="field 'user' has the constraint 'not'"):
        render_form_schema(Account)


async def test_an_answer_refused_three_times_ends_the_call_naming_the_field() -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def book(ctx: mrtr.FlowContext) -> str:
        seat = await ctx.elicit("Which seat?", Seat)
        return f"{seat.row}{seat.code}"

    wrong: dict[str, Any] = {"action": "accept", "content": {"row": 12, "code": "Z"}}
    async with manual_client(server) as client:
        call = Driver(client, "book")
        await call.send()
        key = call.key_for_message("Which seat?")
        for _ in range(MAX_REJECTED - 1):
            await call.send({key: wrong})
            assert "Asked again: Code must match pattern" in call.asked[key].params.message  # type: ignore[union-attr]
        with pytest.raises(MCPError, match="refused 3 times in a row: Code must match pattern") as caught:
            await call.send({key: wrong})
    assert caught.value.error.data == {
        "reason": "answer_refused",
        "inputKey": key,
        "why": "Code must match pattern '^[A-F]$'",
        "attempts": 3,
    }
