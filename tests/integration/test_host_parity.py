"""One library, two hosts: `mrtr.Flows` (the SDK's `MCPServer`) and `mrtr.fastmcp.Flows` behave alike.

Every test here runs on both hosts. Both `Flows` are adapters over one host core
(`mrtr._host`), so each option, default, registration error and runtime error must be the
same on both: the same keyword with the same default, the same exception type with the same
message, the same wire error. Where a host cannot serve an option (the seed dialects on
FastMCP), it refuses it with a `FlowDefinitionError` that says why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import typing
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
import mrtr.fastmcp
from mrtr._host.options import FlowOptions, FlowsOptions, HostOptions, ToolOptions
from tests.support.flowkit import SHARED_KEY, served, text_of
from tests.support.hostkit import observe_bus, observe_engine
from tests.support.storekit import REDIS_URL, drop_namespace

pytestmark = pytest.mark.anyio

HOSTS = ["mcpserver", "fastmcp"]


@dataclass
class Host:
    """One host under test: builds a server and its `Flows` with the given options."""

    kind: str

    def server(self, key: bytes | None = SHARED_KEY) -> Any:
        security = RequestStateSecurity(keys=[key]) if key is not None else None
        name = f"parity-{self.kind}"
        if self.kind == "mcpserver":
            return MCPServer(name, request_state_security=security)
        return FastMCP(name, request_state_security=security)

    def flows(self, server: Any = None, **options: Any) -> Any:
        server = self.server() if server is None else server
        cls = mrtr.Flows if self.kind == "mcpserver" else mrtr.fastmcp.Flows
        return cls(server, **options)


@pytest.fixture(params=HOSTS)
def host(request: pytest.FixtureRequest) -> Host:
    return Host(request.param)


class Approval(BaseModel):
    ok: bool


# -- options: the same keywords, defaults and meanings ----------------------------------------------------


def test_both_flows_take_every_option_of_one_definition() -> None:
    """Both constructors are typed `**options: Unpack[FlowsOptions]`: one list of keywords."""
    for cls in (mrtr.Flows, mrtr.fastmcp.Flows):
        hints = typing.get_type_hints(cls.__init__, include_extras=True)
        assert str(hints["options"]).endswith("Unpack[mrtr._host.options.FlowsOptions]"), cls
    assert set(FlowsOptions.__annotations__) == {f for f in HostOptions.__dataclass_fields__}


@pytest.mark.parametrize("option", sorted(HostOptions.__dataclass_fields__))
def test_every_option_is_accepted_with_its_default_on_both_hosts(host: Host, option: str) -> None:
    default = HostOptions.__dataclass_fields__[option].default
    if option == "dialects" and host.kind == "fastmcp":
        return  # the default, (), is accepted; any dialect is refused (below)
    flows = host.flows(**{option: default})
    assert flows._core.options == HostOptions(), "the default given explicitly is the default"


def test_a_misspelt_option_is_the_same_type_error_on_both_hosts() -> None:
    messages = set()
    for kind in HOSTS:
        with pytest.raises(TypeError) as caught:
            Host(kind).flows(max_round=3)
        messages.add(str(caught.value))
    (message,) = messages
    assert "['max_round']" in message and "max_rounds" in message


def test_decorators_take_the_same_flow_options_on_both_hosts(host: Host) -> None:
    flows = host.flows(max_rounds=4, deadline=60)
    options: FlowOptions = {"requires": ["elicitation"], "max_rounds": 7, "deadline": 30.0, "max_state_bytes": 4096}

    @flows.tool(task="optional", mrtr_first=True, **options)
    async def job(ctx: mrtr.FlowContext) -> str:
        return "done"

    @flows.prompt(**options)
    async def brief(topic: str, ctx: mrtr.FlowContext) -> str:
        return topic

    @flows.resource("notes://{name}", **options)
    async def note(name: str, ctx: mrtr.FlowContext) -> str:
        return name

    @flows.tool()
    async def plain(ctx: mrtr.FlowContext) -> str:
        return "p"

    for name in ("job", "brief", "note"):
        spec = flows.specs[name]
        assert (spec.limits.max_rounds, spec.limits.deadline, spec.limits.max_state_bytes) == (7, 30.0, 4096)
        assert spec.requires == ("elicitation",)
    assert flows.specs["job"].task == "optional" and flows.specs["job"].mrtr_first
    assert flows.specs["plain"].limits.max_rounds == 4 and flows.specs["plain"].limits.deadline == 60


def test_the_public_face_is_the_same_on_both_hosts() -> None:
    faces = []
    for cls in (mrtr.Flows, mrtr.fastmcp.Flows):
        faces.append({name for name in dir(cls) if not name.startswith("_")} - {"http_app", "streamable_http_app"})
    assert (
        faces[0]
        == faces[1]
        == {
            "bus",
            "instance_name",
            "prompt",
            "replay_guard",
            "resource",
            "runtime",
            "send_event",
            "shedder",
            "specs",
            "tool",
        }
    )


# -- registration errors: the same type and message ----------------------------------------------------------


def _same_error(register: Callable[[Any], object]) -> tuple[type[BaseException], str]:
    """The error `register(flows)` raises, the same on both hosts."""
    seen = []
    for kind in HOSTS:
        flows = Host(kind).flows()
        with pytest.raises(Exception) as caught:
            register(flows)
        seen.append((type(caught.value), str(caught.value)))
    assert seen[0] == seen[1], seen
    return seen[0]


def test_a_bare_decorator_is_the_same_error() -> None:
    async def job(ctx: mrtr.FlowContext) -> str:
        return "x"

    kind, message = _same_error(lambda flows: flows.tool(job))
    assert kind is TypeError and message == "use @flows.tool(...) with parentheses"


def test_a_bad_task_value_is_the_same_error() -> None:
    kind, message = _same_error(lambda flows: flows.tool(task=True))
    assert kind is ValueError and "task=True is not mrtr's" in message


# -- per-flow options: one definition, checked by name at registration on both hosts -------------------------

_KINDS: dict[str, Callable[..., Any]] = {
    "tool": lambda flows, **options: flows.tool(**options),
    "prompt": lambda flows, **options: flows.prompt(**options),
    "resource": lambda flows, **options: flows.resource("notes://{name}", **options),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_misspelt_flow_option_is_the_same_type_error_before_the_framework_sees_it(kind: str) -> None:
    error, message = _same_error(lambda flows: _KINDS[kind](flows, max_round=3))
    names = sorted(ToolOptions.__optional_keys__ if kind == "tool" else FlowOptions.__optional_keys__)
    assert error is TypeError
    assert message == (
        f"flows.{kind}() got unexpected option(s) ['max_round']; mrtr's options for a {kind} are {names}, "
        f"and the server's own {kind}() keywords are accepted too"
    )


@pytest.mark.parametrize("kind", ["prompt", "resource"])
@pytest.mark.parametrize("option", [{"task": "required"}, {"mrtr_first": True}, {"task": "never", "mrtr_first": False}])
def test_a_tool_only_option_on_a_prompt_or_resource_is_the_same_type_error(kind: str, option: dict[str, Any]) -> None:
    error, message = _same_error(lambda flows: _KINDS[kind](flows, **option))
    assert error is TypeError
    assert message == (
        f"flows.{kind}() got option(s) {sorted(option)} that a {kind} does not take; "
        f"mrtr's options for a {kind} are {sorted(FlowOptions.__optional_keys__)}"
    )


def test_every_flow_option_is_defined_once_and_tools_alone_take_task_options() -> None:
    tool_only = {"task", "mrtr_first", "task_max_rounds"}
    assert set(ToolOptions.__optional_keys__) - set(FlowOptions.__optional_keys__) == tool_only
    hints = {
        d: str(typing.get_type_hints(getattr(mrtr.Flows, d), include_extras=True)["flow"])
        for d in ("tool", "prompt", "resource")
    }
    assert hints["tool"].endswith("Unpack[mrtr._host.options.ToolOptions]")
    assert hints["prompt"] == hints["resource"] and hints["prompt"].endswith("Unpack[mrtr._host.options.FlowOptions]")


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_every_valid_flow_option_is_accepted_on_both_hosts(host: Host, kind: str) -> None:
    flows = host.flows()
    options: dict[str, Any] = {"requires": ["sampling"], "max_rounds": 2, "deadline": 5.0, "max_state_bytes": 2048}
    if kind == "tool":
        options |= {"task": "optional", "mrtr_first": True, "task_max_rounds": 40}

    async def flow(name: str, ctx: mrtr.FlowContext) -> str:
        return name

    _KINDS[kind](flows, **options)(flow)
    spec = flows.specs["flow"]
    assert (spec.requires, spec.limits.max_rounds, spec.limits.deadline) == (("sampling",), 2, 5.0)
    assert spec.limits.max_state_bytes == 2048
    assert (spec.task, spec.mrtr_first) == (("optional", True) if kind == "tool" else ("never", False))
    assert spec.limits.task_max_rounds == (40 if kind == "tool" else 1000)


async def test_fastmcps_own_keywords_still_reach_fastmcp() -> None:
    flows = Host("fastmcp").flows()

    @flows.tool(title="Ship it", tags={"ops"}, max_rounds=2)
    async def ship(ctx: mrtr.FlowContext) -> str:
        return "shipped"

    @flows.prompt(description="A brief", tags={"docs"})
    async def brief(ctx: mrtr.FlowContext) -> str:
        return "b"

    tool, prompt = await flows.mcp.get_tool("ship"), await flows.mcp.get_prompt("brief")
    assert tool is not None and tool.title == "Ship it" and tool.tags == {"ops"}
    assert prompt is not None and prompt.description == "A brief" and prompt.tags == {"docs"}
    assert flows.specs["ship"].limits.max_rounds == 2


def test_a_sync_function_is_the_same_error() -> None:
    def job(ctx: mrtr.FlowContext) -> str:
        return "x"

    kind, message = _same_error(lambda flows: flows.tool()(job))
    assert kind is TypeError and message == "flow 'job' must be an async function (it awaits the client)"


def test_an_unknown_capability_is_the_same_error() -> None:
    async def job(ctx: mrtr.FlowContext) -> str:
        return "x"

    kind, message = _same_error(lambda flows: flows.tool(requires=["telepathy"])(job))
    assert kind is ValueError and message.startswith("flow 'job': requires='telepathy' is not a capability")


def test_a_bad_limit_is_the_same_error() -> None:
    async def job(ctx: mrtr.FlowContext) -> str:
        return "x"

    kind, message = _same_error(lambda flows: flows.prompt(max_rounds=0)(job))
    assert kind is ValueError and message == "max_rounds must be at least 1"


def test_star_args_are_the_same_error() -> None:
    async def job(ctx: mrtr.FlowContext, *rest: str) -> str:
        return "x"

    kind, message = _same_error(lambda flows: flows.tool()(job))
    assert kind is TypeError and message == "flow 'job': *args/**kwargs cannot become a schema"


def test_a_plain_function_is_the_same_error() -> None:
    async def hello(name: str) -> str:
        return name

    kind, message = _same_error(lambda flows: flows.prompt()(hello))
    assert kind is mrtr.FlowDefinitionError and message.startswith("flow 'hello' has no FlowContext parameter")
    assert "register it with the server's own decorator" in message


def test_a_form_no_client_can_render_is_the_same_error() -> None:
    class Nested(BaseModel):
        inner: Approval

    async def job(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("Nested?", Nested)
        return "x"

    kind, message = _same_error(lambda flows: flows.tool()(job))
    assert kind is mrtr.FlowDefinitionError and message.startswith("flow 'job', line")


def test_an_unannotated_ctx_is_a_definition_error_naming_what_each_host_takes(host: Host) -> None:
    flows = host.flows()
    with pytest.raises(mrtr.FlowDefinitionError) as caught:

        @flows.tool()
        async def rename(title: str, ctx) -> str:  # type: ignore[no-untyped-def]
            return title

    message = str(caught.value)
    assert (
        message.startswith("flow 'rename': parameter 'ctx' has no annotation") and "`ctx: mrtr.FlowContext`" in message
    )
    assert ("`ctx: fastmcp.Context`" in message) is (host.kind == "fastmcp"), "FastMCP also takes its own Context"


def test_the_seed_dialects_are_mcpserver_only_and_fastmcp_says_why() -> None:
    mrtr.Flows(Host("mcpserver").server(), dialects=["sketch"])
    with pytest.raises(mrtr.FlowDefinitionError, match="endpoints and middleware of the SDK's own HTTP app"):
        mrtr.fastmcp.Flows(Host("fastmcp").server(), dialects=["sketch"])


# -- start-up checks and defaults ------------------------------------------------------------------------------


def test_require_shared_key_refuses_the_same_way(host: Host) -> None:
    with pytest.raises(mrtr.FlowDefinitionError, match="has no shared request_state_security"):
        host.flows(host.server(key=None), require_shared_key=True)


def test_require_shared_store_refuses_a_local_file_and_no_store(host: Host, tmp_path: Any) -> None:
    with pytest.raises(mrtr.FlowDefinitionError, match=r"default SQLite file 'mrtr-tasks\.db'"):
        host.flows(require_shared_store=True)
    with pytest.raises(mrtr.FlowDefinitionError, match="a SQLiteStore"):
        host.flows(store=mrtr.SQLiteStore(str(tmp_path / "t.db")), require_shared_store=True)


def test_require_shared_store_takes_a_shared_store(host: Host) -> None:
    flows = host.flows(store=mrtr.open_store(REDIS_URL, namespace=f"parity_{secrets.token_hex(4)}"))
    assert flows.runtime is not None


def test_the_replay_guard_is_on_by_default_with_a_shared_store(host: Host, caplog: pytest.LogCaptureFixture) -> None:
    store = mrtr.open_store(REDIS_URL, namespace=f"parity_{secrets.token_hex(4)}")
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        flows = host.flows(store=store, require_shared_store=True)
    assert flows.replay_guard is not None and flows.replay_guard.ledger is store
    assert flows.replay_guard.state_ttl == float(RequestStateSecurity(keys=[SHARED_KEY]).ttl)
    assert any("single-use fleet-wide" in r.getMessage() for r in caplog.records)


def test_replay_guard_false_opts_out_with_a_start_up_line(host: Host, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        flows = host.flows(store=mrtr.open_store(REDIS_URL, namespace="parity_off"), replay_guard=False)
    assert flows.replay_guard is None
    (line,) = [r for r in caplog.records if "without a replay guard" in r.getMessage()]
    assert "Flows(replay_guard=False)" in line.getMessage()


def test_no_guard_without_a_shared_store_and_true_says_what_it_needs(host: Host, tmp_path: Any) -> None:
    assert host.flows().replay_guard is None
    assert host.flows(store=mrtr.SQLiteStore(str(tmp_path / "t.db"))).replay_guard is None
    with pytest.raises(mrtr.FlowDefinitionError, match="records rounds in the shared store"):
        host.flows(replay_guard=True)


def test_a_task_flow_without_a_context_is_one_step_on_both_hosts(host: Host, tmp_path: Any) -> None:
    flows = host.flows(store=mrtr.SQLiteStore(str(tmp_path / "t.db")))

    @flows.tool(task="optional")
    async def nightly(n: int) -> int:
        return n + 1

    @flows.tool(task="optional")
    async def stepped(n: int) -> int:  # it steps itself: its body is the flow, not one step
        return int(await mrtr.step("add", lambda: n + 1))

    assert flows.specs["nightly"].fn is not nightly, "wrapped as one step"
    assert flows.specs["stepped"].fn is stepped


@pytest.mark.parametrize("sealed", [True, False])
async def test_task_records_are_sealed_at_rest_unless_opted_out_on_both_hosts(
    host: Host, sealed: bool, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from mrtr._engine.journal import Journal
    from mrtr.tasks._seam import TaskCall

    store = mrtr.SQLiteStore(str(tmp_path / "t.db"))
    with caplog.at_level(logging.DEBUG, logger="mrtr.fleet"):
        flows = host.flows(store=store, seal_at_rest=sealed)

        @flows.tool(task="required")
        async def remember(note: str, ctx: mrtr.FlowContext) -> str:
            return await ctx.step("keep", lambda: note)

        spec = flows.runtime.flows["remember"][0]
        started = await flows.runtime.start(TaskCall(spec, {"note": "NOTE42"}, None, Journal.start()))
        await flows.runtime.close()
    raw = await store.load(started.task_id, time.time())
    await store.close()
    assert raw is not None and raw.flow == "remember"
    assert raw.sealed is sealed and ("NOTE42" in raw.to_json()) is not sealed
    plain_lines = [r for r in caplog.records if "in plain text (Flows(seal_at_rest=False))" in r.getMessage()]
    assert len(plain_lines) == (0 if sealed else 1), "opting out is said once at start-up"


async def test_without_a_shared_key_task_records_stay_plain_on_both_hosts(host: Host, tmp_path: Any) -> None:
    """A key only this process holds would leave the records unreadable after a restart: nothing is sealed."""
    from mrtr._engine.journal import Journal
    from mrtr.tasks._seam import TaskCall

    store = mrtr.SQLiteStore(str(tmp_path / "t.db"))
    flows = host.flows(host.server(key=None), store=store)

    @flows.tool(task="required")
    async def remember(note: str, ctx: mrtr.FlowContext) -> str:
        return await ctx.step("keep", lambda: note)

    started = await flows.runtime.start(
        TaskCall(flows.runtime.flows["remember"][0], {"note": "N1"}, None, Journal.start())
    )
    await flows.runtime.close()
    raw = await store.load(started.task_id, time.time())
    await store.close()
    assert raw is not None and not raw.sealed and raw.arguments == {"note": "N1"}


# -- runtime: the same wire, over real HTTP ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _serving(host: Host) -> AsyncIterator[tuple[str, list[str]]]:
    """`host` with the same flows as the other, served by a real uvicorn on 127.0.0.1."""
    flows = host.flows(max_rounds=2)
    ran: list[str] = []

    @flows.tool()
    async def ask_thrice(ctx: mrtr.FlowContext) -> str:
        for i in range(3):
            await ctx.elicit(f"Again {i}?", Approval)
        return "never"

    @flows.tool()
    async def refusing(ctx: mrtr.FlowContext) -> str:
        await ctx.step("side", lambda: ran.append("side"))
        answer = await ctx.elicit("Go?", Approval)
        return f"went: {answer.ok}"

    @flows.prompt()
    async def brief(topic: str, ctx: mrtr.FlowContext) -> str:
        await ctx.elicit(f"Brief on {topic}?", Approval)
        return topic

    server = flows.server if host.kind == "mcpserver" else flows.mcp
    async with served(server) as url:
        yield url, ran


async def _decline(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="decline")


async def _accept(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"ok": True})


async def _outcomes(url: str) -> dict[str, Any]:
    """What a client sees of each runtime error, as comparable data."""
    seen: dict[str, Any] = {}
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, elicitation_callback=_accept) as client:  # type: ignore[arg-type]
            with pytest.raises(MCPError) as caught:
                await client.call_tool("ask_thrice", {})
            seen["too_many_rounds"] = (caught.value.error.code, caught.value.error.message, caught.value.error.data)
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool("refusing", {}, request_state="not-a-sealed-state")
            seen["tampered_state"] = caught.value.error.code
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, elicitation_callback=_decline) as client:  # type: ignore[arg-type]
            result = await client.call_tool("refusing", {})
            # Each framework words its own tool errors: the SDK prefixes "Error executing tool <name>: ".
            seen["declined_tool"] = (result.is_error, text_of(result).removeprefix("Error executing tool refusing: "))
            with pytest.raises(MCPError) as caught:
                await client.get_prompt("brief", {"topic": "x"})
            seen["declined_prompt"] = (caught.value.error.code, caught.value.error.message, caught.value.error.data)
    return seen


async def test_runtime_errors_are_the_same_on_both_hosts(caplog: pytest.LogCaptureFixture) -> None:
    seen: dict[str, dict[str, Any]] = {}
    for kind in HOSTS:
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            async with _serving(Host(kind)) as (url, ran):
                seen[kind] = await _outcomes(url)
        assert ran == ["side"], "the step before the refused ask ran once (the tampered call ran nothing)"
        # Every one of these is the client's doing: no ERROR, and no traceback above DEBUG, on either host.
        loud = [r for r in caplog.records if r.levelno >= logging.ERROR or (r.exc_info and r.levelno > logging.DEBUG)]
        assert not loud, (kind, [(r.name, r.levelname, r.getMessage()) for r in loud])
    mcpserver = seen["mcpserver"]
    assert mcpserver["too_many_rounds"][0] == -32602
    assert mcpserver["too_many_rounds"][2] == {
        "reason": "too_many_rounds",
        "flow": "ask_thrice",
        "maxRounds": 2,
        "roundsUsed": 2,
    }
    assert "asked for client input in 2 rounds, the most max_rounds=2 allows" in mcpserver["too_many_rounds"][1]
    assert mcpserver["tampered_state"] == -32602
    assert mcpserver["declined_tool"][0] is True and "decline" in mcpserver["declined_tool"][1].lower()
    assert mcpserver["declined_prompt"][0] == -32602 and mcpserver["declined_prompt"][2]["reason"] == "input_declined"
    assert seen["fastmcp"] == mcpserver


async def test_instance_name_stamps_every_response_of_the_app_flows_builds_on_both_hosts() -> None:
    """`mrtr call` names the instance that answered each round, on a FastMCP fleet too."""
    for kind in HOSTS:
        flows = Host(kind).flows(instance_name=f"{kind}-1")
        app = flows.streamable_http_app() if kind == "mcpserver" else flows.http_app()
        transport = httpx2.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http,
        ):
            response = await http.get("/mcp")
        assert response.headers.get("x-mrtr-instance") == f"{kind}-1", (kind, response.status_code)


# -- the lifecycle contract: the worker and the fleet bus run however the server is served -----------------


def _apps(host: Host, flows: Any) -> dict[str, Callable[[], Any]]:
    if host.kind == "mcpserver":
        return {"server.streamable_http_app()": flows.server.streamable_http_app, "flows": flows.streamable_http_app}
    return {"mcp.http_app()": flows.mcp.http_app, "flows": flows.http_app}


@pytest.mark.parametrize("way", ["server", "flows"])
async def test_an_apps_lifespan_starts_and_stops_the_worker_once_on_both_hosts(
    host: Host, way: str, tmp_path: Any
) -> None:
    flows = host.flows(store=mrtr.SQLiteStore(tmp_path / "tasks.db"))
    events = observe_engine(flows.runtime)
    build = _apps(host, flows)["flows" if way == "flows" else next(iter(_apps(host, flows)))]
    app = build()
    async with app.router.lifespan_context(app):
        assert events == ["start"], "entered once, even where Flows' app wraps the server's"
    assert events == ["start", "close"]


@pytest.mark.needs_redis
async def test_an_apps_lifespan_starts_and_stops_the_fleet_bus_and_the_worker_on_both_hosts(host: Host) -> None:
    namespace = f"lifecycle_{secrets.token_hex(4)}"
    flows = host.flows(store=mrtr.open_store(REDIS_URL, namespace=namespace))
    try:
        events = observe_engine(flows.runtime)
        observe_bus(flows.bus, events)
        app = _apps(host, flows)["flows"]()
        async with app.router.lifespan_context(app):
            assert events == ["bus start", "start"], "subscribed before serving, then the worker"
        assert events == ["bus start", "start", "close", "bus close"]
    finally:
        await drop_namespace("redis", namespace)


async def test_nested_lifespans_share_one_start_and_one_stop(host: Host, tmp_path: Any) -> None:
    """An in-process client per connection, or two apps of one server: the last one out stops the worker."""
    flows = host.flows(store=mrtr.SQLiteStore(tmp_path / "tasks.db"))
    events = observe_engine(flows.runtime)
    async with flows._core.running():
        async with flows._core.running():
            assert events == ["start"]
        assert events == ["start"]
    assert events == ["start", "close"]
    async with flows._core.running():  # served again: started again
        assert events == ["start", "close", "start"]


_SERVE = """
import asyncio, sys
from pathlib import Path

import mrtr
import mrtr.fastmcp
from tests.support.hostkit import observe_bus, observe_engine

way, tmp, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
events = tmp / "events"

def note(what):
    with events.open("a") as file:
        file.write(what + "\\n")

if way.startswith("mcpserver"):
    from mcp.server.mcpserver import MCPServer
    server = MCPServer("lifecycle")
    flows = mrtr.Flows(server, store=mrtr.SQLiteStore(tmp / "tasks.db"))
else:
    from fastmcp import FastMCP
    server = FastMCP("lifecycle")
    flows = mrtr.fastmcp.Flows(server, store=mrtr.SQLiteStore(tmp / "tasks.db"))
observe_engine(flows.runtime, note)
if way == "mcpserver-stdio":
    server.run()
elif way == "mcpserver-http":
    server.run("streamable-http", port=port)
else:
    asyncio.run(server.run_http_async(show_banner=False, port=port, log_level="warning"))
"""


@pytest.mark.spawns
@pytest.mark.parametrize("way", ["mcpserver-stdio", "mcpserver-http", "fastmcp-http"])
def test_running_the_server_starts_and_stops_the_worker(way: str, tmp_path: Any) -> None:
    """`server.run()` (stdio, streamable HTTP) and FastMCP's `run_http_async()`, each in a process of its
    own: the worker starts with the server and stops when it is told to stop (stdin closes, Ctrl-C)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    events = tmp_path / "events"
    command = [sys.executable, "-c", _SERVE, way, str(tmp_path), str(port)]
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(
        command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        if way != "mcpserver-stdio":  # stdio ends at once (its stdin is empty); HTTP serves until told to stop
            deadline = time.monotonic() + 30
            while not (events.exists() and "start" in events.read_text()):
                assert process.poll() is None and time.monotonic() < deadline, process.stderr
                time.sleep(0.05)
            # Ctrl-C: FastMCP's `run_http_async` leaves its own lifespan (where extensions' run) only when
            # interrupted; after SIGTERM uvicorn re-raises the signal, and the process dies mid-teardown.
            process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert events.read_text().split() == ["start", "close"], stderr.decode()[-2000:]


# -- protocol_versions=: serve only the versions listed -----------------------------------------------------


def _leaves(group: BaseExceptionGroup[Any]) -> list[Any]:
    return [leaf for e in group.exceptions for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]


def _versions_server(host: Host, versions: list[str]) -> Any:
    flows = host.flows(protocol_versions=versions)

    @flows.tool()
    async def hello(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("Go?", Approval)
        return f"hello {answer.ok}"

    return flows.server if host.kind == "mcpserver" else flows.mcp


async def test_protocol_versions_serves_only_2026_07_28_on_both_hosts(host: Host) -> None:
    async with served(_versions_server(host, ["2026-07-28"])) as url, httpx2.AsyncClient(trust_env=False) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, elicitation_callback=_accept) as modern:  # type: ignore[arg-type]
            assert modern.protocol_version == "2026-07-28"
            assert text_of(await modern.call_tool("hello", {})) == "hello True"
        refused: list[MCPError] = []
        try:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="legacy", elicitation_callback=_accept):  # type: ignore[arg-type]
                pass
        except* MCPError as group:  # the SDK's transport task group wraps the handshake's error
            refused += _leaves(group)
    (error,) = refused
    assert error.error.code == t.UNSUPPORTED_PROTOCOL_VERSION
    assert error.error.data == {"supported": ["2026-07-28"], "requested": "2025-11-25"}


async def test_protocol_versions_serves_only_2025_11_25_on_both_hosts(host: Host) -> None:
    versions = ["2025-11-25"]
    async with served(_versions_server(host, versions)) as url, httpx2.AsyncClient(trust_env=False) as http:
        # A 2026-07-28 request gets the spec's version-mismatch answer: HTTP 400, -32022, supported/requested.
        envelope = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "server/discover",
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": envelope}}
        refused = await http.post(url, json=body, headers=headers)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == t.UNSUPPORTED_PROTOCOL_VERSION
        assert error["data"] == {"supported": versions, "requested": "2026-07-28"}
        # An auto-negotiating client is told where to go, and falls back to the handshake.
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, elicitation_callback=_accept) as client:  # type: ignore[arg-type]
            assert client.protocol_version == "2025-11-25"
            assert text_of(await client.call_tool("hello", {})) == "hello True"


def test_a_bad_protocol_versions_list_is_the_same_error() -> None:
    for versions, message in (([], "serves nothing"), (["2026-13-01"], "unknown version"), ("2026-07-28", "a list")):
        seen = set()
        for kind in HOSTS:
            with pytest.raises(ValueError, match=message) as caught:
                Host(kind).flows(protocol_versions=versions)
            seen.add(str(caught.value))
        assert len(seen) == 1, seen


def test_dialects_need_2026_07_28_served() -> None:
    with pytest.raises(mrtr.FlowDefinitionError, match="seed dialects are served as 2026-07-28"):
        Host("mcpserver").flows(dialects=["sketch"], protocol_versions=["2025-11-25"])
