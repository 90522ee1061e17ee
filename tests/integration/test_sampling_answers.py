"""Sampling and roots answers are checked against the wire schema of the protocol version in use (issue #35).

A 2026-07-28 (and 2025-11-25) sampling answer may carry a *list* of content blocks, and
FastMCP's client sends one for tool use. Such an answer is taken as it is, in both eras. An
answer no valid client sends is a -32602 naming its `inputResponses` key, the field, and what
the field must hold. It is never asked again: there is no person to ask, and the client's
code would send the same answer again until the round cap.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

import mrtr
from mrtr._engine.asks import MalformedAnswer, client_result
from tests.support.flowkit import Driver, manual_client, new_server

pytestmark = pytest.mark.anyio

LOOKUP = t.Tool(name="lookup", input_schema={"type": "object", "properties": {"q": {"type": "string"}}})


def sampling_server() -> Any:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def plan(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.sample("Plan it", max_tokens=50, tools=[LOOKUP])
        return (
            " ".join(
                f"{block.type}:{block.name}" if isinstance(block, t.ToolUseContent) else block.type
                for block in answer.content_as_list
            )
            + f" ({answer.stop_reason})"
        )

    @flows.tool()
    async def note(ctx: mrtr.FlowContext) -> str:
        return await ctx.sample_text("One line", max_tokens=20)

    @flows.tool()
    async def folders(ctx: mrtr.FlowContext) -> str:
        return ",".join(str(root.uri) for root in await ctx.list_roots())

    return server


def tool_use_answer() -> t.CreateMessageResultWithTools:
    return t.CreateMessageResultWithTools(
        role="assistant",
        content=[
            t.TextContent(type="text", text="checking"),
            t.ToolUseContent(type="tool_use", id="u1", name="lookup", input={"q": "x"}),
        ],
        model="llm",
        stop_reason="toolUse",
    )


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_list_of_content_blocks_is_a_valid_answer_in_both_eras(mode: str) -> None:
    asked: list[t.CreateMessageRequestParams] = []

    async def llm(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResultWithTools:
        asked.append(params)
        return (
            tool_use_answer()
            if params.tools
            else t.CreateMessageResultWithTools(
                role="assistant", content=[t.TextContent(type="text", text="one block")], model="llm"
            )
        )

    capabilities = t.SamplingCapability(tools=t.SamplingToolsCapability())
    client = Client(sampling_server(), mode=mode, sampling_callback=llm, sampling_capabilities=capabilities)
    async with client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        planned = await client.call_tool("plan", {})
        noted = await client.call_tool("note", {})
    assert planned.content[0].text == "text tool_use:lookup (toolUse)"  # type: ignore[union-attr]
    assert noted.content[0].text == "one block"  # type: ignore[union-attr]  # a one-block list, taken as the block
    assert len(asked) == 2  # each asked once: not re-asked until the round cap
    assert asked[0].tools is not None and asked[0].tools[0].name == "lookup"


async def test_a_malformed_sampling_answer_is_an_error_naming_its_key_and_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with manual_client(sampling_server()) as client:
        call = Driver(client, "note")
        await call.send()
        (key,) = call.asked
        assert key.startswith("sample_")
        with caplog.at_level(logging.DEBUG), pytest.raises(MCPError) as raised:
            # An ElicitResult's shape passes the SDK's edge check, but answers no sampling request.
            await call.send({key: {"action": "accept", "content": {}}})
    # the client's mistake: one INFO line with the reason, no traceback
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    [line] = [r for r in caplog.records if r.levelno == logging.INFO and r.name.startswith("mrtr")]
    assert line.getMessage() == f"flow note: refused the client's request: {raised.value.error.message}"
    error = raised.value.error
    assert error.code == -32602
    assert error.message == (
        f"inputResponses[{key!r}] is not a valid sampling/createMessage result under 2026-07-28: content must be "
        "a text, image, audio, tool_use or tool_result content block, or a list of them (a list is valid since "
        "2025-11-25) (got {})"
    )
    assert error.data is not None and {k: v for k, v in error.data.items() if k != "expected"} == {
        "inputKey": key,
        "method": "sampling/createMessage",
        "field": "content",
    }


async def test_a_malformed_roots_answer_is_an_error_too() -> None:
    async with manual_client(sampling_server()) as client:
        call = Driver(client, "folders")
        await call.send()
        (key,) = call.asked
        with pytest.raises(MCPError) as raised:
            await call.send({key: {"action": "accept"}})
    assert raised.value.error.code == -32602
    assert f"inputResponses[{key!r}] is not a valid roots/list result under 2026-07-28: roots must be" in (
        raised.value.error.message
    )
    assert raised.value.error.data["field"] == "roots"  # type: ignore[index]


def test_answers_are_checked_against_their_protocol_versions_schema() -> None:
    listed = {"role": "assistant", "model": "m", "content": [{"type": "text", "text": "a"}]}
    assert client_result("k", "sampling/createMessage", listed, "2026-07-28")["content"] == [
        {"type": "text", "text": "a"}
    ]
    assert client_result("k", "sampling/createMessage", listed, "2025-11-25")["content"] == [
        {"type": "text", "text": "a"}
    ]
    with pytest.raises(
        MalformedAnswer, match=r"under 2025-11-25: role must be \"user\" or \"assistant\" \(got 'bot'\)"
    ):
        client_result("k", "sampling/createMessage", listed | {"role": "bot"}, "2025-11-25")
    with pytest.raises(MalformedAnswer, match=r"model must be a string naming the model \(missing\)"):
        client_result("k", "sampling/createMessage", {"role": "assistant", "content": listed["content"]})


# -- a ctx call never awaited (issue #35) ----------------------------------------------------------


async def test_a_ctx_call_never_awaited_is_an_error_naming_the_call() -> None:
    from tests.support.flowkit import sampled

    server = new_server()
    flows = mrtr.Flows(server)
    handed: list[Any] = []

    @flows.tool()
    async def forgot(ctx: mrtr.FlowContext) -> str:
        ctx.sample_text("One line", max_tokens=5)  # type: ignore[unused-coroutine]  # the bug under test
        return "done"

    @flows.tool()
    async def handed_on(ctx: mrtr.FlowContext) -> str:
        line = ctx.sample_text("Another line", max_tokens=5)
        await ctx.step("keep", handed.append, line)
        return "kept"

    @flows.tool()
    async def used(ctx: mrtr.FlowContext) -> str:
        roots = ctx.list_roots()
        return str(len(roots))  # type: ignore[arg-type]  # TypeError: the coroutine has no len()

    @flows.tool()
    async def returned(ctx: mrtr.FlowContext) -> str:
        return ctx.sample_text("Last line", max_tokens=5)  # type: ignore[return-value]

    async def llm(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return sampled("never asked")

    errors = {}
    async with Client(server, sampling_callback=llm, list_roots_callback=None) as client:
        for tool in ("forgot", "handed_on", "used", "returned"):
            with pytest.raises(MCPError) as raised:
                await client.call_tool(tool, {})
            errors[tool] = raised.value.error.message
    assert errors == {
        "forgot": "flow 'forgot': ctx.sample_text('One line') was never awaited, so it did nothing (the flow got a "
        "coroutine object, not its value); write `await ctx.sample_text('One line')`",
        "handed_on": "step 'keep' was handed ctx.sample_text('Another line'), a coroutine: that call was never "
        "awaited, so it did nothing; write `await ctx.sample_text('Another line')` and pass its value",
        "used": "flow 'used': ctx.list_roots() was never awaited, so it did nothing (the flow got a coroutine object, "
        "not its value); write `await ctx.list_roots()`",
        "returned": "flow 'returned' returned ctx.sample_text('Last line') unawaited; write "
        "`return await ctx.sample_text('Last line')`",
    }
    assert handed == []


async def test_a_reasked_form_says_why_in_the_forms_words() -> None:
    from typing import Literal

    from pydantic import BaseModel, Field

    class Order(BaseModel):
        quantity: int = Field(title="How many")
        colour: Literal["red", "blue"]
        note: str

    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def order(ctx: mrtr.FlowContext) -> str:
        return str(await ctx.elicit("Order?", Order))

    async with manual_client(server) as client:
        call = Driver(client, "order")
        await call.send()
        (key,) = call.asked
        await call.send({key: {"action": "accept", "content": {"quantity": "lots", "colour": "green"}}})
        again = call.asked[key]
    assert again.params.message == (  # type: ignore[union-attr]
        "Order?\n\n(Asked again: How many must be a whole number; Colour must be one of: red, blue; Note is required.)"
    )


async def test_an_answer_that_no_answer_type_fits_is_named_at_the_edge_on_both_hosts() -> None:
    """The SDK's own check (before any handler) would say only `Invalid request parameters`.

    Sent as raw JSON-RPC: the official client validates what it sends, so it cannot send these.
    """
    from fastmcp import FastMCP
    from mcp.server.request_state import RequestStateSecurity

    import mrtr.fastmcp
    from tests.support.flowkit import SHARED_KEY, served

    fast: FastMCP[Any] = FastMCP("fm-edge", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    fast_flows = mrtr.fastmcp.Flows(fast)

    @fast_flows.tool()
    async def note(ctx: mrtr.FlowContext) -> str:
        return await ctx.sample_text("One line", max_tokens=20)

    async def bare_call(url: str, tool: str, answers: dict[str, Any]) -> dict[str, Any]:
        import httpx2

        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": tool,
                "arguments": {},
                "inputResponses": answers,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
                },
            },
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": tool,
        }
        async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
            response = await http.post(url, json=body, headers=headers)
        error: dict[str, Any] = response.json()["error"]
        return error

    text_missing = {"role": "assistant", "model": "m", "content": {"type": "text"}}
    async with served(sampling_server()) as plain_url, served(fast) as fast_url:
        for url, tool in ((plain_url, "note"), (fast_url, "note")):
            error = await bare_call(url, tool, {"sample_0123456789": text_missing})
            assert error["code"] == -32602
            assert error["message"].startswith(
                "inputResponses['sample_0123456789'] is not a valid sampling/createMessage result under 2026-07-28: "
                "content must be a text, image, audio, tool_use or tool_result content block"
            ), error
            assert error["data"]["inputKey"] == "sample_0123456789" and error["data"]["field"] == "content"
            bad_action = await bare_call(url, tool, {"mine": {"action": "maybe"}})
            assert bad_action["message"].startswith(
                "inputResponses['mine'] is not a valid elicitation/create result under 2026-07-28: action must be "
                '"accept", "decline" or "cancel"'
            ), bad_action
