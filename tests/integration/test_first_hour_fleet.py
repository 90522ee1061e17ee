"""The first hour with mrtr, fleet traps (issue 10): one instance works, two must too.

Start-up warnings for a process-local state key and the default task store; a staged key
rotation across two instances; legacy clients over HTTP behind round-robin and sticky routing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from tests.support.flowkit import Driver, accept, manual_client, new_server, served, text_of

pytestmark = pytest.mark.anyio


class Slot(BaseModel):
    ok: bool


# -- Fleet traps: start-up warnings, staged key rotation -----------------------------------------------------


def test_a_server_without_a_shared_key_warns_at_start_up(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mrtr"):
        mrtr.Flows(MCPServer("booking"))
        mrtr.Flows(new_server("booking-with-keys"))
    assert [r.getMessage() for r in caplog.records if r.name == "mrtr.fleet"] == [
        "mrtr: server 'booking' has no request_state_security, so its requestState is sealed with a key only this "
        "process holds: a second instance (or this one after a restart) rejects every flow in flight with "
        "'Invalid or expired requestState', after the user answered; and durable task records are stored unsealed "
        "(nothing to seal them with). Give every instance the same key ring: "
        "MCPServer(..., request_state_security=RequestStateSecurity(keys=[...]))"
    ]


def test_the_default_task_store_warns_that_other_hosts_cannot_see_it(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("MRTR_STATE_DIR", str(tmp_path / "state"))  # the per-user state directory
    flows = mrtr.Flows(new_server())
    with caplog.at_level(logging.WARNING, logger="mrtr"):

        @flows.tool(task="optional")
        async def nightly(ctx: mrtr.FlowContext) -> str:
            return "ok"

    path = tmp_path / "state" / "tasks-flows-under-test.db"
    assert path.parent.is_dir() and list((tmp_path / "work").iterdir()) == [], "nothing in the working directory"
    assert [r.getMessage() for r in caplog.records if r.name == "mrtr.fleet"] == [
        f"mrtr: durable tasks use the default store, a SQLite file ({path}) on this host: instances on other "
        "hosts cannot see its tasks. Give the fleet one shared store: Flows(server, store=mrtr.open_store(url)), and "
        "Flows(require_shared_store=True) to refuse to start without one"
    ]


def keyed_instance(*keys: bytes) -> MCPServer:
    """One instance of the fleet: same name, its own key ring."""
    server = MCPServer("rotating", request_state_security=RequestStateSecurity(keys=list(keys)))
    flows = mrtr.Flows(server)

    @flows.tool()
    async def two_questions(ctx: mrtr.FlowContext) -> str:
        first = await ctx.elicit("First?", Slot)
        second = await ctx.elicit("Second?", Slot)
        return f"{first.ok} {second.ok}"

    return server


async def round_across(start: MCPServer, finish: MCPServer) -> str:
    """Round 1 on `start`, rounds 2-3 on `finish` (a load balancer's choice, mid-rotation); the outcome's text."""
    async with manual_client(start) as one, manual_client(finish) as other:
        call = Driver(one, "two_questions")
        await call.send()
        call.client = other
        try:
            await call.send({key: accept(ok=True) for key in call.asked})
            result = await call.send({key: accept(ok=True) for key in call.asked})
        except MCPError as exc:
            return f"{exc.error.code}: {exc.error.message}"
    assert isinstance(result, t.CallToolResult)
    return text_of(result)


async def test_prepending_the_new_key_breaks_a_rolling_rotation() -> None:
    old, new = os.urandom(32), os.urandom(32)
    # The README's old advice ("rotate by prepending"), half rolled out: A has [new, old], B still [old].
    assert (
        await round_across(keyed_instance(new, old), keyed_instance(old)) == "-32602: Invalid or expired requestState"
    )


async def test_a_staged_key_rotation_never_breaks_a_flow_in_flight() -> None:
    old, new = os.urandom(32), os.urandom(32)
    # Stage 1 rolls out `[old, new]` (the new key second: it opens, it does not seal) next to `[old]`.
    assert (await round_across(keyed_instance(old, new), keyed_instance(old))) == "True True"
    assert (await round_across(keyed_instance(old), keyed_instance(old, new))) == "True True"
    # Stage 2 rolls out `[new, old]` next to `[old, new]`: every instance opens what any other sealed.
    assert (await round_across(keyed_instance(new, old), keyed_instance(old, new))) == "True True"
    assert (await round_across(keyed_instance(old, new), keyed_instance(new, old))) == "True True"
    # Stage 3, one state TTL later, drops the old key; only state the new key sealed is still in flight.
    assert (await round_across(keyed_instance(new, old), keyed_instance(new))) == "True True"


# -- Legacy clients over HTTP need a sticky (or single, stateful) deployment ---------------------------------


class Balancer(httpx2.AsyncBaseTransport):
    """A load balancer in the client's HTTP stack: round-robin, or sticky by `Mcp-Session-Id`."""

    def __init__(self, ports: list[int], *, sticky: bool) -> None:
        self.ports = ports
        self.sticky = sticky
        self.turn = 0
        self.by_session: dict[str, int] = {}
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = request.headers.get("mcp-session-id")
        if self.sticky and session in self.by_session:
            port = self.by_session[session]
        else:
            port = self.ports[self.turn % len(self.ports)]
            self.turn += 1
        request.url = request.url.copy_with(port=port)
        request.headers["host"] = f"127.0.0.1:{port}"
        response = await self.inner.handle_async_request(request)
        if new := response.headers.get("mcp-session-id"):
            self.by_session.setdefault(new, port)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def legacy_fleet_instance() -> MCPServer:
    flows = mrtr.Flows(server := new_server("legacy-fleet"))

    @flows.tool()
    async def confirm(ctx: mrtr.FlowContext) -> str:
        return f"confirmed: {(await ctx.elicit('Go?', Slot)).ok}"

    return server


async def legacy_call_through(balancer: Balancer, url: str) -> str:
    async def yes(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return accept(ok=True)

    try:
        async with httpx2.AsyncClient(transport=balancer, trust_env=False, timeout=10.0) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="legacy", elicitation_callback=yes) as client:  # type: ignore[arg-type]
                return text_of(await client.call_tool("confirm", {}))
    except Exception as exc:  # the SDK reports it from inside its task groups
        return " | ".join(_leaves(exc))


def _leaves(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [text for inner in exc.exceptions for text in _leaves(inner)]
    return [str(exc)]


async def test_legacy_clients_over_http_need_a_sticky_deployment() -> None:
    async with served(legacy_fleet_instance()) as one, served(legacy_fleet_instance()) as two:
        ports = [httpx2.URL(one).port, httpx2.URL(two).port]
        round_robin = await legacy_call_through(Balancer(ports, sticky=False), one)  # type: ignore[list-item]
        sticky = await legacy_call_through(Balancer(ports, sticky=True), one)  # type: ignore[list-item]
    assert round_robin == "Session not found"
    assert sticky == "confirmed: True"
