"""Prompts, resources, URL elicitation and the legacy era: the same flow code everywhere."""

from __future__ import annotations

from collections import Counter
from typing import Any

import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from tests.support.flowkit import accept, manual_client, new_server, roots, sampled

pytestmark = pytest.mark.anyio


class Topic(BaseModel):
    topic: str


def surfaces_server(runs: Counter[str]):
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.prompt(description="A prompt that asks what it should be about")
    async def brief(audience: str, ctx: mrtr.FlowContext) -> str:
        topic = await ctx.elicit(f"Brief for {audience} about what?", Topic)
        return f"Write a brief for {audience} about {topic.topic}."

    @flows.resource("notes://{project}/summary", mime_type="text/markdown")
    async def summary(project: str, ctx: mrtr.FlowContext) -> str:
        folders = await ctx.list_roots()
        runs["summary"] += 1
        return f"# {project}\n" + "\n".join(str(r.uri) for r in folders)

    @flows.resource("notes://today")
    async def today(ctx: mrtr.FlowContext) -> dict[str, Any]:
        mood = await ctx.sample("How is the user today? One word.", max_tokens=5)
        return {"mood": mood.content.text}

    @flows.tool()
    async def connect_github(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit_url("Authorize mrtr on GitHub", f"https://example.invalid/oauth?state={ctx.flow_id}")
        return "authorized"

    return server


async def test_prompt_flow_takes_rounds() -> None:
    server = surfaces_server(Counter())
    async with manual_client(server) as client:
        listed = await client.list_prompts()
        assert [a.name for a in listed.prompts[0].arguments or []] == ["audience"]
        first = await client.session.get_prompt("brief", {"audience": "execs"}, allow_input_required=True)
        assert isinstance(first, t.InputRequiredResult)
        (key,) = first.input_requests or {}
        done = await client.session.get_prompt(
            "brief",
            {"audience": "execs"},
            input_responses={key: accept(topic="MRTR")},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, t.GetPromptResult)
        assert done.messages[0].content.text == "Write a brief for execs about MRTR."


async def test_template_and_fixed_uri_resources_take_rounds() -> None:
    runs: Counter[str] = Counter()
    server = surfaces_server(runs)
    async with manual_client(server) as client:
        templates = await client.list_resource_templates()
        assert [x.uri_template for x in templates.resource_templates] == ["notes://{project}/summary"]
        listed = await client.list_resources()
        assert [str(r.uri) for r in listed.resources] == ["notes://today"]

        first = await client.session.read_resource("notes://mrtr/summary", allow_input_required=True)
        assert isinstance(first, t.InputRequiredResult)
        assert [r.method for r in (first.input_requests or {}).values()] == ["roots/list"]
        (key,) = first.input_requests or {}
        done = await client.session.read_resource(
            "notes://mrtr/summary",
            input_responses={key: roots("file:///repo")},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, t.ReadResourceResult)
        assert done.contents[0].text == "# mrtr\nfile:///repo"
        assert done.contents[0].mime_type == "text/markdown"
        assert runs["summary"] == 1

        first = await client.session.read_resource("notes://today", allow_input_required=True)
        assert isinstance(first, t.InputRequiredResult)
        (key,) = first.input_requests or {}
        done = await client.session.read_resource(
            "notes://today",
            input_responses={key: sampled("sunny")},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, t.ReadResourceResult)
        assert '"mood": "sunny"' in done.contents[0].text

        # A fixed-URI flow's state is bound to its URI like any other.
        with pytest.raises(MCPError) as caught:
            await client.session.read_resource("notes://today", request_state="v1.forged", allow_input_required=True)
        assert caught.value.error.code == t.INVALID_PARAMS


async def test_url_elicitation_is_consent_only() -> None:
    server = surfaces_server(Counter())
    async with manual_client(server) as client:
        first = await client.session.call_tool("connect_github", {}, allow_input_required=True)
        assert isinstance(first, t.InputRequiredResult)
        ((key, request),) = (first.input_requests or {}).items()
        assert request.params.mode == "url"
        assert request.params.url.startswith("https://example.invalid/oauth?state=")
        done = await client.session.call_tool(
            "connect_github",
            {},
            input_responses={key: t.ElicitResult(action="accept")},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, t.CallToolResult) and done.content[0].text == "authorized"


async def test_legacy_era_prompts_resources_and_refusals() -> None:
    runs: Counter[str] = Counter()
    server = surfaces_server(runs)
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> t.ElicitResult:
        asked.append(params.message)
        if params.mode == "url":
            return t.ElicitResult(action="decline")
        return accept(topic="tasks")

    async def on_sample(context: Any, params: Any) -> t.CreateMessageResult:
        return sampled("calm")

    async def on_roots(context: Any) -> t.ListRootsResult:
        return roots("file:///legacy")

    async with Client(
        server,
        mode="legacy",
        elicitation_callback=on_elicit,
        sampling_callback=on_sample,
        list_roots_callback=on_roots,
    ) as client:
        assert client.protocol_version < "2026-07-28"
        prompt = await client.get_prompt("brief", {"audience": "devs"})
        assert prompt.messages[0].content.text == "Write a brief for devs about tasks."
        summary = await client.read_resource("notes://x/summary")
        assert summary.contents[0].text == "# x\nfile:///legacy"
        today = await client.read_resource("notes://today")
        assert '"mood": "calm"' in today.contents[0].text
        refused = await client.call_tool("connect_github", {})
        assert refused.is_error and "The user declined the request" in refused.content[0].text
    assert asked == ["Brief for devs about what?", "Authorize mrtr on GitHub"]


async def test_legacy_client_without_capability_gets_32021() -> None:
    server = surfaces_server(Counter())
    async with Client(server, mode="legacy") as client:
        with pytest.raises(MCPError) as caught:
            await client.get_prompt("brief", {"audience": "devs"})
        assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_url_elicitation_needs_the_url_capability() -> None:
    server = surfaces_server(Counter())
    async with manual_client(server, elicitation=False) as client:
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool("connect_github", {}, allow_input_required=True)
        assert caught.value.error.data == {"requiredCapabilities": {"elicitation": {"url": {}}}}


def test_registration_errors_are_clear() -> None:
    flows = mrtr.Flows(new_server())
    with pytest.raises(TypeError, match="parentheses"):
        flows.tool(lambda: None)  # type: ignore[arg-type]

    def not_async(ctx: mrtr.FlowContext) -> str:
        return "x"

    with pytest.raises(TypeError, match="must be an async function"):
        flows.tool()(not_async)
    with pytest.raises(TypeError, match="explicit key"):
        from mrtr._engine.asks import elicit_ask

        elicit_ask("x", Topic, None, True)
