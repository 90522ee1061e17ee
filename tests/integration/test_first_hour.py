"""The first hour with mrtr: every trap a newcomer hit (issue 10) fails early, with an error that names the fix.

Each test is one bullet of the issue's "Why", with the error text asserted exactly.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import mcp_types as t
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr.client import CreatedTask, TasksClient, update_task
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import ROOT_DIR, Driver, accept, manual_client, new_server, task_state, text_of

pytestmark = pytest.mark.anyio


class Slot(BaseModel):
    ok: bool


async def _unused(*args: Any) -> Any:
    raise AssertionError("answers are given by hand")


def task_client(server: Any) -> Client:
    """Declares every capability and the tasks extension; the test answers through `tasks/update`."""
    return Client(
        server,
        extensions=[TasksClient(_unused)],
        elicitation_callback=_unused,
        sampling_callback=_unused,
        list_roots_callback=_unused,
    )


async def answer_task_until_done(client: Client, task_id: str, *, limit: int = 40) -> tuple[dict[str, Any], int]:
    """Answer every question the task asks (yes to each) until it ends; returns the task and the answers sent."""
    sent = 0
    async with asyncio.timeout(20):
        while sent < limit:
            task = await task_state(client.session, task_id)
            if task["status"] in ("completed", "failed", "cancelled"):
                return task, sent
            if task["status"] == "input_required":
                answers = {key: {"action": "accept", "content": {"ok": True}} for key in task["inputRequests"]}
                await update_task(client.session, task_id, answers)
                sent += len(answers)
                while await _still_asking(client, task_id, answers):
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.01)
    raise AssertionError(f"the task was still asking after {sent} answers")


async def _still_asking(client: Client, task_id: str, answered: dict[str, Any]) -> bool:
    """Whether the task still waits on the questions just answered (it may already ask new ones)."""
    task = await task_state(client.session, task_id)
    return task["status"] == "input_required" and task["inputRequests"].keys() == answered.keys()


# -- Durable tasks ignore max_rounds; a question that changes after it was answered ------------------------


def clock_server(**options: Any) -> Any:
    server = new_server("first-hour")
    flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), task_poll_interval=0.02, **options)

    @flows.tool(task="optional")
    async def book(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit(f"Slot at {time.time():.6f}?", Slot)  # the newcomer's bug: a clock in the question
        return f"booked: {answer.ok}"

    @flows.tool(task="optional")
    async def survey(ctx: mrtr.FlowContext) -> str:
        for i in range(50):  # a legitimate flow that simply asks more than the cap allows
            await ctx.elicit(f"Question {i}?", Slot)
        return "done"

    return server


async def test_an_inline_question_that_changes_after_every_answer_is_nondeterminism_not_a_round_cap() -> None:
    async with manual_client(clock_server(max_rounds=8)) as client:
        call = Driver(client, "book")
        await call.send()
        await call.send({key: accept(ok=True) for key in call.asked})  # one rewording: asked again, no error
        with pytest.raises(MCPError) as caught:
            await call.send({key: accept(ok=True) for key in call.asked})
    error = caught.value.error
    assert len(call.rounds) == 2, "caught after two wasted answers, not after max_rounds"
    assert error.code == -32603 and error.data["reason"] == "nondeterministic_flow"
    assert error.message.startswith("flow 'book' asked elicit 'Slot at ")
    assert error.message.endswith(
        "instead of the question just answered ("
        f"{next(iter(call.asked))!r}), twice in a row: the question changes between runs. Compute its changing "
        "parts (clocks, random values, I/O) in a ctx.step so every replay asks the same"
    )


async def test_a_task_whose_question_changes_fails_as_nondeterminism_after_two_answers() -> None:
    async with task_client(clock_server(max_rounds=8)) as client:
        created = await client.session.call_tool("book", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        task, sent = await answer_task_until_done(client, created.task_id)
    assert sent == 2, f"the task should stop after the second wasted answer, not after {sent}"
    assert task["status"] == "failed"
    assert task["error"]["code"] == -32603 and task["error"]["data"]["reason"] == "nondeterministic_flow"
    assert "twice in a row: the question changes between runs" in task["error"]["message"]


async def test_a_task_has_its_own_round_cap_not_the_inline_one() -> None:
    """Issue 46: `tasks/update` has no client cap, so a task stops at `task_max_rounds`, not at `max_rounds`."""
    server = clock_server(max_rounds=8, task_max_rounds=12)
    async with manual_client(server) as client:
        call = Driver(client, "survey")
        await call.send()
        with pytest.raises(MCPError) as inline:
            for _ in range(10):
                await call.send({key: accept(ok=True) for key in call.asked})
    async with task_client(server) as client:
        created = await client.session.call_tool("survey", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        task, sent = await answer_task_until_done(client, created.task_id)
    assert len(call.rounds) == 8, "inline, eight rounds of questions and not one more"
    assert sent == 12, "as a task, twelve"
    assert inline.value.error.data == {"reason": "too_many_rounds", "flow": "survey", "maxRounds": 8, "roundsUsed": 8}
    assert inline.value.error.message == (
        "flow 'survey' reached its round cap: it asked for client input in 8 rounds, the most max_rounds=8 allows, "
        "and asked again. To go on, declare the io.modelcontextprotocol/tasks extension (FlowClient(tasks=True), "
        "or mcp.Client with mrtr.client.TasksClient) and call again: past the cap the call continues as a durable "
        "task, whose tasks/get and tasks/update have no round cap. Or raise max_rounds= on the server and the "
        "client's own cap with it (the official mcp.Client stops after input_required_max_rounds=10 by default)"
    )
    assert task["status"] == "failed"
    assert task["error"] == {
        "code": -32602,
        "message": "flow 'survey' reached its round cap: it asked for client input in 12 rounds, the most a task "
        "may (task_max_rounds=12), and asked again. The server can raise task_max_rounds= (Flows or the tool "
        "decorator) if the flow legitimately asks more",
        "data": {"reason": "too_many_rounds", "flow": "survey", "maxRounds": 12, "roundsUsed": 12},
    }


async def test_a_task_obeys_its_deadline_exactly_as_an_inline_flow() -> None:
    async with task_client(clock_server(deadline=1.0)) as client:
        created = await client.session.call_tool("survey", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        async with asyncio.timeout(10):
            while (task := await task_state(client.session, created.task_id))["status"] != "input_required":
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.1)  # the user answers after the flow's deadline
        await update_task(
            client.session,
            created.task_id,
            {k: {"action": "accept", "content": {"ok": True}} for k in task["inputRequests"]},
        )
        task, _ = await answer_task_until_done(client, created.task_id)
    assert task["status"] == "failed"
    assert task["error"] == {
        "code": -32602,
        "message": "flow 'survey' passed its 1s deadline; start the call again without state",
        "data": {"reason": "flow_expired", "flow": "survey"},
    }


# -- A wrong or missing ctx annotation; FlowContext under @server.tool() ------------------------------------


def test_an_unannotated_ctx_is_refused_at_registration() -> None:
    flows = mrtr.Flows(new_server())
    with pytest.raises(mrtr.FlowDefinitionError) as caught:

        @flows.tool()
        async def rename(title: str, ctx) -> str:  # type: ignore[no-untyped-def]
            return title

    assert str(caught.value) == (
        "flow 'rename': parameter 'ctx' has no annotation, so it would be published as a required argument of "
        "the tool; annotate it `ctx: mrtr.FlowContext`"
    )


def test_the_sdks_context_in_place_of_flow_context_is_refused_at_registration() -> None:
    flows = mrtr.Flows(new_server())
    with pytest.raises(mrtr.FlowDefinitionError) as caught:

        @flows.tool()
        async def rename(title: str, ctx: Context) -> str:  # type: ignore[type-arg]
            return title

    assert str(caught.value) == (
        "flow 'rename': parameter 'ctx' is annotated with the SDK's Context; a flow takes `ctx: mrtr.FlowContext` "
        "(the SDK's Context is still there, as `ctx.request`)"
    )


def test_a_flow_without_flow_context_is_refused_at_registration() -> None:
    flows = mrtr.Flows(new_server())
    with pytest.raises(mrtr.FlowDefinitionError) as caught:

        @flows.prompt()
        async def hello(name: str) -> str:
            return name

    assert str(caught.value) == (
        "flow 'hello' has no FlowContext parameter; add `ctx: mrtr.FlowContext` to its signature (a function "
        "that never asks or steps is a plain tool: register it with the server's own decorator)"
    )


def test_flow_context_under_the_sdks_decorator_names_the_right_one() -> None:
    server = new_server()
    with pytest.raises(TypeError) as caught:

        @server.tool()
        async def rename(title: str, ctx: mrtr.FlowContext) -> str:
            return title

    assert str(caught.value) == (
        "a mrtr.FlowContext parameter only works in a flow: register the function with @flows.tool() "
        "(or @flows.prompt() / @flows.resource(), where flows = mrtr.Flows(server)), not @server.tool()"
    )


# -- Form schemas: checked at registration; Enum, Literal, optional, defaults and formats supported ----------


class Room(enum.StrEnum):
    SMALL = "small"
    LARGE = "large"


class Floor(enum.IntEnum):
    GROUND = 0


class Meeting(BaseModel):
    room: Room
    day: datetime.date
    length: Literal["30m", "60m"] = "30m"
    extras: list[Room] = []
    note: str | None = None


class ByFloor(BaseModel):
    floor: Floor


PLAIN_DICT_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}


def test_a_dict_schema_fails_at_registration_not_at_call_time() -> None:
    flows = mrtr.Flows(new_server())
    with pytest.raises(mrtr.FlowDefinitionError) as caught:

        @flows.tool()
        async def dict_schema(ctx: mrtr.FlowContext) -> str:
            answer = await ctx.elicit("Name?", PLAIN_DICT_SCHEMA)  # type: ignore[type-var]
            return str(answer)

    line = dict_schema_line()
    assert str(caught.value) == (
        f"flow 'dict_schema', line {line}: ctx.elicit takes a pydantic model class as its schema, not dict "
        "{'type': 'object', 'properties': {'name': {'type': 'string'}}}; declare `class Answer(BaseModel): ...` "
        "and pass Answer"
    )


def dict_schema_line() -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(source, 1) if 'await ctx.elicit("Name?", PLAIN_DICT_SCHEMA)' in text)


def test_a_field_no_form_can_show_fails_at_registration_and_lists_what_works() -> None:
    flows = mrtr.Flows(new_server())
    with pytest.raises(mrtr.FlowDefinitionError) as caught:

        @flows.tool()
        async def pick_floor(ctx: mrtr.FlowContext) -> str:
            return str((await ctx.elicit("Floor?", ByFloor)).floor)

    assert str(caught.value).endswith(
        ": ByFloor.floor renders as {'enum': [0], 'type': 'integer', 'title': 'Floor'}, which no elicitation form "
        "can show; form fields may be str (also date, datetime, EmailStr, AnyUrl: string formats), int, float, "
        "bool, a Literal or Enum/StrEnum of strings (a choice), or a list of those (several choices); any of them "
        "optional with a default"
    )
    assert str(caught.value).startswith("flow 'pick_floor', line ")


async def test_enum_literal_optional_defaults_and_formats_work_end_to_end() -> None:
    flows = mrtr.Flows(server := new_server())

    @flows.tool()
    async def book_room(ctx: mrtr.FlowContext) -> str:
        meeting = await ctx.elicit("Which room, when?", Meeting)
        assert isinstance(meeting.room, Room) and isinstance(meeting.day, datetime.date)
        return f"{meeting.room.value} on {meeting.day.isoformat()} for {meeting.length}, extras {meeting.extras}"

    async with manual_client(server) as client:
        call = Driver(client, "book_room")
        await call.send()
        ((key, request),) = call.asked.items()
        schema = request.params.requested_schema
        assert schema["properties"] == {
            "room": {"enum": ["small", "large"], "type": "string", "title": "Room"},
            "day": {"format": "date", "title": "Day", "type": "string"},
            "length": {"default": "30m", "enum": ["30m", "60m"], "title": "Length", "type": "string"},
            "extras": {
                "default": [],
                "items": {"enum": ["small", "large"], "type": "string"},
                "title": "Extras",
                "type": "array",
            },
            "note": {"title": "Note", "type": "string"},
        }
        assert schema["required"] == ["room", "day"]
        done = await call.send({key: accept(room="large", day="2026-11-24", extras=["small"])})
    assert not done.is_error and text_of(done) == "large on 2026-11-24 for 30m, extras [<Room.SMALL: 'small'>]"


# -- Capabilities a flow needs, checked in round 1 --------------------------------------------------------


async def test_a_flow_that_declares_sampling_fails_in_round_one_not_after_an_answer() -> None:
    flows = mrtr.Flows(server := new_server())

    @flows.tool(requires=["elicitation", "sampling"])
    async def summarize_slot(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("Which slot?", Slot)
        summary = await ctx.sample("Summarize the slot", max_tokens=20)
        return str(summary.content)

    async with manual_client(server, sampling=False) as client:
        call = Driver(client, "summarize_slot")
        with pytest.raises(MCPError) as caught:
            await call.send()
    assert call.rounds == [], "nothing was asked"
    assert caught.value.error.code == -32021
    assert caught.value.error.message == (
        "This call needs the client capability 'sampling', which the request did not declare"
    )
    assert caught.value.error.data == {"requiredCapabilities": {"sampling": {}}}


# -- Steps that hide things -------------------------------------------------------------------------------


class Booking(BaseModel):
    id: str


def step_server() -> MCPServer:
    flows = mrtr.Flows(server := new_server())

    def charge(amount: int) -> str:
        if amount > 100:
            raise ToolError(f"card declined for {amount} EUR")  # meant for the user: passes through
        raise ValueError("gateway password is hunter2")  # a crash: its text stays in the server log

    @flows.tool()
    async def pay(amount: int, ctx: mrtr.FlowContext) -> str:
        await ctx.elicit(f"Pay {amount} EUR?", Slot)
        return await ctx.step("charge", charge, amount)

    @flows.tool()
    async def reserve(ctx: mrtr.FlowContext) -> str:
        booking = await ctx.step("reserve", lambda: Booking(id="b-1"))  # no return annotation
        when = await ctx.step("when", lambda: datetime.datetime(2026, 11, 24, 9, 30))
        return f"{booking!r} at {when!r}"

    return server


async def test_a_steps_tool_error_reaches_the_client_and_a_crash_does_not() -> None:
    async with manual_client(step_server()) as client:
        declined = Driver(client, "pay", {"amount": 500})
        await declined.send()
        declined_result = await declined.send({key: accept(ok=True) for key in declined.asked})
        crashed = Driver(client, "pay", {"amount": 5})
        await crashed.send()
        crashed_result = await crashed.send({key: accept(ok=True) for key in crashed.asked})
    assert isinstance(declined_result, t.CallToolResult) and declined_result.is_error
    assert text_of(declined_result) == "Error executing tool pay: card declined for 500 EUR"
    assert isinstance(crashed_result, t.CallToolResult) and crashed_result.is_error
    assert text_of(crashed_result) == "Error executing tool pay"


async def test_an_unannotated_step_whose_value_changes_type_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mrtr"):
        async with manual_client(step_server()) as client:
            result = await Driver(client, "reserve").send()
    assert isinstance(result, t.CallToolResult)
    assert text_of(result) == "{'id': 'b-1'} at '2026-11-24T09:30:00'"
    assert [r.getMessage() for r in caplog.records if r.name == "mrtr.steps"] == [
        "step 'reserve' returned Booking Booking(id='b-1'), but the flow gets its JSON form back ({'id': 'b-1'}), "
        "on every round; annotate the step function's return type (e.g. `-> Booking`) to get the same type back",
        "step 'when' returned datetime datetime.datetime(2026, 11, 24, 9, 30), but the flow gets its JSON form "
        "back ('2026-11-24T09:30:00'), on every round; annotate the step function's return type (e.g. "
        "`-> datetime`) to get the same type back",
    ]


async def test_a_reasked_question_tells_the_user_why() -> None:
    async with manual_client(step_server()) as client:
        call = Driver(client, "pay", {"amount": 5})
        await call.send()
        ((key, _),) = call.asked.items()
        await call.send({key: accept(ok="not a yes or no")})
        ((again_key, again),) = call.asked.items()
    assert again_key == key
    assert again.params.message == "Pay 5 EUR?\n\n(Asked again: Ok must be yes or no.)"
    # The message is the channel: 2026-07-28 gives an input request's params no `_meta`, and the SDK sieves it out.
    assert again.params.meta is None


# -- Invisible and untyped --------------------------------------------------------------------------------


async def test_each_round_says_what_it_did_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="mrtr"):
        async with manual_client(step_server()) as client:
            call = Driver(client, "pay", {"amount": 500})
            await call.send()
            ((key, _),) = call.asked.items()
            await call.send({key: accept(ok=True)})
    said = [
        (r.name, r.getMessage()) for r in caplog.records if r.name.startswith("mrtr") and r.levelno == logging.DEBUG
    ]
    messages = [m for _, m in said]
    assert {name for name, _ in said} >= {"mrtr.engine", "mrtr.replay"}
    assert any(m.startswith("flow pay (") and m.endswith(f"round 1 ends waiting for ['{key}']") for m in messages)
    assert any(m.endswith(f"this run settled, waiting for ['{key}']") for m in messages)
    assert f"flow pay: the answer to '{key}' was accepted and journaled" in messages
    assert any(m.endswith("this run raised ToolError: card declined for 500 EUR") for m in messages)


def test_mrtr_ships_its_types() -> None:
    assert resources.files("mrtr").joinpath("py.typed").is_file()


async def test_a_schema_only_known_at_call_time_still_fails_with_the_fix_not_a_crash() -> None:
    flows = mrtr.Flows(server := new_server())
    schemas: list[Any] = [PLAIN_DICT_SCHEMA]

    @flows.tool()
    async def dict_schema(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("Name?", schemas[0])  # not a name registration can resolve
        return str(answer)

    async with manual_client(server) as client:
        with pytest.raises(MCPError) as caught:
            await Driver(client, "dict_schema").send()
    assert caught.value.error.code == -32603 and caught.value.error.data["reason"] == "invalid_flow"
    assert caught.value.error.message.startswith("ctx.elicit takes a pydantic model class as its schema, not dict ")


TYPED_FLOW = """
from typing import assert_type
from pydantic import BaseModel
from mcp_types import CreateMessageResult
import mrtr

class Confirm(BaseModel):
    yes: bool

def plan(service: str, replicas: int) -> list[str]:
    return [service] * replicas

async def fetch(url: str) -> bytes:
    return url.encode()

async def flow(ctx: mrtr.FlowContext) -> None:
    ok, risk = await ctx.gather(ctx.elicit("Apply?", Confirm), ctx.sample("Risk?", max_tokens=9))
    assert_type(ok, Confirm)
    assert_type(risk, CreateMessageResult)
    assert_type(await ctx.step("plan", plan, "web", 2), list[str])
    assert_type(await ctx.step("fetch", fetch, "https://example.org"), bytes)
"""


def test_gather_and_step_are_typed_for_mypy_strict(tmp_path: Path) -> None:
    from mypy import api

    module = tmp_path / "typed_flow.py"
    module.write_text(TYPED_FLOW)
    # The project's own cache, which `make test` fills (mypy on src) before pytest runs: mrtr, mcp
    # and pydantic are read from it (~2 s) instead of checked afresh (~20 s); the module here is new.
    cache = ROOT_DIR / ".mypy_cache"
    out, err, status = api.run(["--strict", "--cache-dir", str(cache), str(module)])
    assert status == 0, out + err


async def test_the_round_caps_agree_with_the_official_client_so_mrtr_says_why_first() -> None:
    """Item 2 of issue 27: a loop flow on the official client's defaults stops with mrtr's message, not its."""
    server = new_server("loop")
    flows = mrtr.Flows(server)

    class Item(BaseModel):
        name: str

    @flows.tool()
    async def expenses(ctx: mrtr.FlowContext) -> int:
        items = [await ctx.elicit(f"Line item {i}?", Item) for i in range(12)]
        return len(items)

    async def fill(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return accept(name="taxi")

    async with Client(server, elicitation_callback=fill) as client:  # input_required_max_rounds: its default, 10
        with pytest.raises(MCPError) as caught:
            await client.call_tool("expenses", {})
    assert caught.value.error.data["reason"] == "too_many_rounds"
    assert "input_required_max_rounds=10" in caught.value.error.message


async def test_sample_text_returns_the_completion_as_text() -> None:
    server = new_server("sampler")
    flows = mrtr.Flows(server)

    @flows.tool()
    async def haiku(ctx: mrtr.FlowContext) -> str:
        return await ctx.sample_text("A haiku about queues", max_tokens=40)

    async with Client(server, sampling_callback=lambda context, params: _sampled("queues wait in line")) as client:
        result = await client.call_tool("haiku", {})
    assert result.content[0].text == "queues wait in line"


async def _sampled(text: str) -> t.CreateMessageResult:
    return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=text), model="m")


def test_require_shared_key_refuses_to_start_without_a_key_ring() -> None:
    with pytest.raises(mrtr.FlowDefinitionError, match="require_shared_key"):
        mrtr.Flows(MCPServer("no-key"), require_shared_key=True)
    mrtr.Flows(new_server("keyed"), require_shared_key=True)  # a key ring: starts
