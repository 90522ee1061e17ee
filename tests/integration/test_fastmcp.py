"""`mrtr.fastmcp`: FastMCP 3.x-era flows (`ctx.elicit/sample/list_roots`) and `FlowContext` flows on FastMCP 4.

Served by a real uvicorn on 127.0.0.1 (`mcp.http_app()`), driven by the official `mcp.Client`
in both protocol eras; side effects counted in memory.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import httpx2
import mcp_types as t
import pytest
from fastmcp import Context, FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs it for a TypedDict form on Python < 3.12

import mrtr
import mrtr.fastmcp
from tests.support.flowkit import SHARED_KEY, served

pytestmark = pytest.mark.anyio


@dataclass
class Person:
    name: str
    age: int


class Address(TypedDict):
    city: str


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Approval(BaseModel):
    ok: bool


def fastmcp_app(runs: Counter[str], seen: list[Any]) -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("fm-under-test", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(mcp, max_rounds=25)  # eleven asks, one at a time

    @flows.tool(description="3.x-era code: only the decorator changed", tags={"trips"})
    async def plan_trip(city: str, ctx: Context) -> str:
        go = await ctx.elicit(f"Go to {city}?", response_type=bool)
        if not isinstance(go, AcceptedElicitation) or not go.data:
            return f"not going ({go.action})"
        who = await ctx.elicit("Who travels?", response_type=Person)
        where = await ctx.elicit("Address?", response_type=Address)
        level = await ctx.elicit("Class?", response_type=["economy", "business"])
        size = await ctx.elicit("Luggage?", response_type=Size)
        mood = await ctx.elicit("Mood?", response_type=Literal["calm", "excited"])
        seats = await ctx.elicit("Seats?", response_type=[["aisle", "window"]])
        priority = await ctx.elicit("Priority?", response_type={"low": {"title": "Low"}, "high": {"title": "High"}})
        count = await ctx.elicit("How many bags?", response_type=int)
        booking = await mrtr.step("book", lambda: runs.update(["book"]) or f"B-{city}")
        note = await ctx.sample(f"One line about {city}", system_prompt="be brief", temperature=0.2, max_tokens=30)
        roots = await ctx.list_roots()
        await mrtr.step("email", lambda: runs.update(["email"]))
        seen.extend([who.data, where.data, level.data, size.data, mood.data, seats.data, priority.data, count.data])
        return f"{booking} {note.text} {len(roots)} {type(ctx).__name__}"

    @flows.tool()
    async def pay(amount: int, ctx: mrtr.FlowContext) -> str:
        approval = await ctx.elicit(f"Pay {amount}?", Approval)
        await ctx.step("charge", lambda: runs.update(["charge"]))
        return f"paid {amount}: {approval.ok}"

    @flows.prompt()
    async def brief(topic: str, ctx: Context) -> str:
        who = await ctx.elicit(f"Brief about {topic} for whom?", response_type=str)
        return f"Write about {topic} for {who.data if isinstance(who, AcceptedElicitation) else 'nobody'}."

    @flows.resource("notes://{name}")
    async def note(name: str, ctx: mrtr.FlowContext) -> str:
        approval = await ctx.elicit(f"Show {name}?", Approval)
        return f"note {name}: {approval.ok}"

    return mcp


ANSWERS: dict[str, Any] = {
    "Go to Lisbon?": {"value": True},
    "Who travels?": {"name": "Ada", "age": 36},
    "Address?": {"city": "Porto"},
    "Class?": {"value": "business"},
    "Luggage?": {"value": "large"},
    "Mood?": {"value": "calm"},
    "Seats?": {"value": ["window"]},
    "Priority?": {"value": "high"},
    "How many bags?": {"value": 2},
    "Pay 7?": {"ok": True},
    "Brief about tasks for whom?": {"value": "devs"},
    "Show x?": {"ok": True},
}


async def answer(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    assert isinstance(params, t.ElicitRequestFormParams)
    message = params.message.split("\n\n")[0]
    if message == "Go to Oslo?":
        return t.ElicitResult(action="decline")
    return t.ElicitResult(action="accept", content=ANSWERS[message])


async def complete(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
    assert params.system_prompt == "be brief" and params.max_tokens == 30
    return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="sunny"), model="m")


async def roots(context: Any) -> t.ListRootsResult:
    return t.ListRootsResult(roots=[t.Root(uri="file:///trips")])


@pytest.mark.parametrize("mode", ["modern", "legacy"])
async def test_fastmcp_3x_tool_runs_unchanged_and_each_step_runs_once(mode: str) -> None:
    runs: Counter[str] = Counter()
    seen: list[Any] = []
    mcp = fastmcp_app(runs, seen)
    async with served(mcp) as url, httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        transport = streamable_http_client(url, http_client=http)
        options: dict[str, Any] = {"mode": "legacy"} if mode == "legacy" else {}
        async with Client(
            transport,  # type: ignore[arg-type]
            elicitation_callback=answer,
            sampling_callback=complete,
            list_roots_callback=roots,
            input_required_max_rounds=25,  # eleven asks, one at a time (the official client's default is 10)
            **options,
        ) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(listed["plan_trip"].input_schema["properties"]) == {"city"}  # ctx is no argument
            result = await client.call_tool("plan_trip", {"city": "Lisbon"})
            assert not result.is_error, result
            assert result.content[0].text == "B-Lisbon sunny 1 FlowsContext"
            declined = await client.call_tool("plan_trip", {"city": "Oslo"})
            assert declined.content[0].text == "not going (decline)"
            paid = await client.call_tool("pay", {"amount": 7})
            assert paid.content[0].text == "paid 7: True"
            prompt = await client.get_prompt("brief", {"topic": "tasks"})
            assert prompt.messages[0].content.text == "Write about tasks for devs."
            shown = await client.read_resource("notes://x")
            assert shown.contents[0].text == "note x: True"
    assert runs == Counter(book=1, email=1, charge=1)
    assert seen == [Person("Ada", 36), {"city": "Porto"}, "business", Size.LARGE, "calm", ["window"], "high", 2]


async def test_an_answer_that_does_not_fit_the_response_type_is_asked_again() -> None:
    mcp: FastMCP[Any] = FastMCP("fm-reask", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(mcp)

    @flows.tool()
    async def age(ctx: Context) -> str:
        given = await ctx.elicit("Age?", response_type=int)
        return f"age {given.data if isinstance(given, AcceptedElicitation) else None}"

    asked: list[str] = []

    async def sloppy(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        asked.append(params.message)
        return t.ElicitResult(action="accept", content={"value": "old" if len(asked) == 1 else 41})

    async with served(mcp) as url, Client(streamable_http_client(url), elicitation_callback=sloppy) as client:
        result = await client.call_tool("age", {})
    assert result.content[0].text == "age 41"
    assert asked == ["Age?", "Age?\n\n(Asked again: The answer must be a whole number.)"]  # not pydantic's report


async def test_a_server_without_a_shared_key_warns_at_start_up(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mrtr"):
        mrtr.fastmcp.Flows(FastMCP("no-key"))
        mrtr.fastmcp.Flows(FastMCP("keyed", request_state_security=RequestStateSecurity(keys=[SHARED_KEY])))
    warnings = [r.getMessage() for r in caplog.records if r.name == "mrtr.fleet"]
    assert len(warnings) == 1 and "server 'no-key' has no request_state_security" in warnings[0]
    assert "FastMCP(..., request_state_security=" in warnings[0], "the fix names the host's own constructor"


async def test_fastmcp_tasks_option_is_refused_clearly() -> None:
    flows = mrtr.fastmcp.Flows(FastMCP("tasks", request_state_security=RequestStateSecurity(keys=[SHARED_KEY])))
    with pytest.raises(ValueError, match="fastmcp-tasks"):
        flows.tool(task=True)  # type: ignore[arg-type]  # FastMCP's task=, not mrtr's


async def test_mrtr_step_outside_a_flow_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="inside a flow"):
        await mrtr.step("x", lambda: None)


@pytest.mark.parametrize("style", ["fastmcp", "mrtr"])
async def test_a_durable_task_on_fastmcp_asks_through_tasks_update_and_steps_once(style: str) -> None:
    from mrtr.client import TaskSnapshot, tasks_client
    from mrtr.stores import SQLiteStore

    runs: Counter[str] = Counter()
    mcp: FastMCP[Any] = FastMCP("fm-tasks", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(mcp, store=SQLiteStore(":memory:"), task_poll_interval=0.05)

    if style == "fastmcp":

        @flows.tool(task="optional")
        async def publish(job: str, ctx: Context) -> str:
            data = await mrtr.step("fetch", lambda: runs.update(["fetch"]) or f"DATA({job})")
            ok = await ctx.elicit(f"Publish {data}?", response_type=bool)
            if not isinstance(ok, AcceptedElicitation) or not ok.data:
                return "not published"
            await mrtr.step("publish", lambda: runs.update(["publish"]))
            return f"published {data}"

    else:

        @flows.tool(task="optional")
        async def publish(job: str, ctx: mrtr.FlowContext) -> str:
            data = await ctx.step("fetch", lambda: runs.update(["fetch"]) or f"DATA({job})")
            ok = await ctx.elicit(f"Publish {data}?", Approval)
            if not ok.ok:
                return "not published"
            await ctx.step("publish", lambda: runs.update(["publish"]))
            return f"published {data}"

    statuses: list[str] = []

    async def yes(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        content = {"value": True} if style == "fastmcp" else {"ok": True}
        return t.ElicitResult(action="accept", content=content)

    def status(snapshot: TaskSnapshot) -> None:
        statuses.append(snapshot.status)

    async with served(mcp) as url, httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        transport = streamable_http_client(url, http_client=http)
        async with tasks_client(transport, elicitation_callback=yes, on_status=status) as client:
            capabilities = client.session.server_capabilities
            assert capabilities is not None and "io.modelcontextprotocol/tasks" in (capabilities.extensions or {})
            result = await client.call_tool("publish", {"job": "j1"})
    assert not result.is_error, result
    assert result.content[0].text == "published DATA(j1)"
    assert "input_required" in statuses and statuses[-1] == "completed"
    assert runs == Counter(fetch=1, publish=1)


async def test_flows_are_ordinary_fastmcp_components_middleware_and_tags_included() -> None:
    from fastmcp.server.middleware import Middleware, MiddlewareContext

    seen: list[str] = []

    class Watch(Middleware):
        async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
            seen.append(context.message.name)
            return await call_next(context)

    mcp: FastMCP[Any] = FastMCP("fm-mw", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    mcp.add_middleware(Watch())
    flows = mrtr.fastmcp.Flows(mcp)

    @flows.tool(tags={"money"}, description="Pay after approval")
    async def pay(amount: int, ctx: mrtr.FlowContext) -> str:
        approval = await ctx.elicit(f"Pay {amount}?", Approval)
        return f"paid {amount}: {approval.ok}"

    tool = await mcp.get_tool("pay")
    assert tool is not None and tool.tags == {"money"} and tool.description == "Pay after approval"
    async with served(mcp) as url, Client(streamable_http_client(url), elicitation_callback=answer) as client:
        result = await client.call_tool("pay", {"amount": 7})
    assert result.content[0].text == "paid 7: True"
    assert seen == ["pay", "pay"]  # FastMCP's middleware sees every round of the flow


async def test_a_server_with_another_tasks_extension_refuses_mrtr_task_flows() -> None:
    from fastmcp.server.extensions import ServerExtension

    class OtherTasks(ServerExtension):
        identifier = "io.modelcontextprotocol/tasks"

    mcp: FastMCP[Any] = FastMCP("fm-other", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    mcp.add_extension(OtherTasks())
    flows = mrtr.fastmcp.Flows(mcp)
    with pytest.raises(mrtr.FlowDefinitionError, match=r"already has a io\.modelcontextprotocol/tasks extension"):

        @flows.tool(task="optional")
        async def job(ctx: mrtr.FlowContext) -> str:
            return "done"


async def test_the_fastmcp_example_runs_as_documented() -> None:
    import importlib.util
    import sys

    from tests.support.flowkit import ROOT_DIR

    spec = importlib.util.spec_from_file_location("fastmcp_trips", ROOT_DIR / "examples" / "fastmcp_trips.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its dataclass looks its module up
    spec.loader.exec_module(example)

    async def fill(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        assert isinstance(params, t.ElicitRequestFormParams)
        content = {"value": True} if params.message == "Go to Rome?" else {"name": "Ada", "bags": 1}
        return t.ElicitResult(action="accept", content=content)

    async def sample(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="eternal"), model="m")

    async with (
        served(example.mcp) as url,
        Client(
            streamable_http_client(url), elicitation_callback=fill, sampling_callback=sample, list_roots_callback=roots
        ) as client,
    ):
        result = await client.call_tool("plan_trip", {"city": "Rome"})
    assert result.content[0].text == "B-Rome-Ada: eternal (1 roots)"


async def test_task_notifications_on_fastmcp_let_the_client_follow_without_polling() -> None:
    from mrtr.client import FlowClient
    from mrtr.stores import SQLiteStore

    mcp: FastMCP[Any] = FastMCP("fm-listen", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(mcp, store=SQLiteStore(":memory:"), task_poll_interval=5.0)  # polling would be slow

    @flows.tool(task="optional")
    async def publish(job: str, ctx: mrtr.FlowContext) -> str:
        ok = await ctx.elicit(f"Publish {job}?", Approval)
        return f"published {job}: {ok.ok}"

    methods: list[str] = []

    async def yes(params: t.ElicitRequestParams) -> t.ElicitResult:
        return t.ElicitResult(action="accept", content={"ok": True})

    async with served(mcp) as url, httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:

        async def record(request: httpx2.Request) -> None:
            if request.method == "POST":
                import json

                methods.append(json.loads(request.content).get("method", ""))

        http.event_hooks["request"].append(record)
        async with FlowClient(url, elicit=yes, tasks=True, http_client=http) as client:
            result = await client.call_tool("publish", {"job": "j"})
    assert result.content[0].text == "published j: True"
    # Every state came as a `notifications/tasks` on the listen stream: no `tasks/get` poll at all.
    assert methods == ["server/discover", "tools/call", "subscriptions/listen", "tasks/update"]


async def test_fastmcp_tasks_wait_for_callbacks_and_events() -> None:
    """Durable waits on FastMCP: `ctx.flow.callback_url` served as a FastMCP custom route, `flows.send_event`."""
    from mrtr.client import tasks_client
    from mrtr.stores._sqlite import SQLiteStore

    mcp: FastMCP[Any] = FastMCP("fm-waits", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(
        mcp, store=SQLiteStore(":memory:"), task_poll_interval=0.05, public_url="http://placeholder.test"
    )
    hooks: list[str] = []

    async def never(*args: Any) -> Any:
        raise AssertionError("this flow asks nothing")

    @flows.tool(task="required")
    async def build(ctx: Context) -> str:
        assert isinstance(ctx, mrtr.fastmcp.FlowsContext)  # FastMCP's Context, as mrtr serves it
        hook = await ctx.flow.callback_url("ci")
        await mrtr.step("hand-out", hooks.append, hook)
        verdict = await ctx.flow.wait_for_event("ci")
        extra = await ctx.flow.wait_for_event("note")
        return f"{verdict['status']} / {extra}"

    async with served(mcp) as url, httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        base = url.removesuffix("/mcp")
        async with tasks_client(streamable_http_client(url, http_client=http), elicitation_callback=never) as client:
            call = asyncio.ensure_future(client.call_tool("build", {}))
            while not hooks:
                await asyncio.sleep(0.02)
            (hook,) = hooks
            task_id = hook.split("/mrtr/events/")[1].split("/")[0]
            await flows.send_event(task_id, "note", "from the server")  # before its wait: kept
            response = await http.post(hook.replace("http://placeholder.test", base), json={"status": "passed"})
            assert response.status_code == 202, response.text
            result = await asyncio.wait_for(call, 10)
    assert result.content[0].text == "passed / from the server"
