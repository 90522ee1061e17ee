"""A `task="required"` tool refused to a caller that cannot hold a task says what that caller can do.

- 2026-07-28 without the tasks extension: declare it (-32021, `requiredCapabilities`).
- 2025-11-25 (a session cannot declare an extension): it needs protocol 2026-07-28, a newer
  client (-32022, `data: {supported, requested}`), on both hosts alike.
- A seed dialect that cannot carry tasks (`sketch`, `saga`): the same -32022, naming the dialect.
  Seed 001's `draft` wire carries tasks: it is told to send the call as one (`params.task`).
"""

from __future__ import annotations

from typing import Any

import httpx2
import mcp_types as t
import pytest
from fastmcp import FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError

import mrtr
import mrtr.fastmcp
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import SHARED_KEY, new_server, served

pytestmark = pytest.mark.anyio


class _FlowsApp:
    """`Flows`' own app (with the dialects' endpoints mounted), as `served` takes one."""

    def __init__(self, flows: mrtr.Flows) -> None:
        self.flows = flows

    def http_app(self) -> Any:
        return self.flows.streamable_http_app()


def _server(host: str, **options: Any) -> Any:
    if host == "mcpserver":
        server = new_server("task-only")
        flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), **options)
    else:
        server = FastMCP("task-only", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
        flows = mrtr.fastmcp.Flows(server, store=SQLiteStore(":memory:"), **options)

    @flows.tool(task="required")
    async def nightly(ctx: mrtr.FlowContext) -> str:
        return "ran"

    return _FlowsApp(flows) if options.get("dialects") else server


@pytest.mark.parametrize("host", ["mcpserver", "fastmcp"])
async def test_an_older_session_is_told_it_needs_protocol_2026_07_28(host: str) -> None:
    async with (
        served(_server(host)) as url,
        httpx2.AsyncClient(trust_env=False, timeout=20.0) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,  # type: ignore[arg-type]
    ):
        assert client.protocol_version == "2025-11-25"
        with pytest.raises(MCPError) as caught:
            await client.call_tool("nightly", {})
    error = caught.value.error
    assert error.code == t.UNSUPPORTED_PROTOCOL_VERSION
    assert error.data == {"supported": ["2026-07-28"], "requested": "2025-11-25"}
    assert "needs protocol 2026-07-28" in error.message and "2025-11-25" in error.message
    assert "declare" not in error.message and 'extension"' not in error.message


async def test_a_2026_client_without_the_extension_is_told_to_declare_it() -> None:
    async with Client(_server("mcpserver")) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("nightly", {})
    assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert caught.value.error.data == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    assert "declare the io.modelcontextprotocol/tasks extension" in caught.value.error.message


async def test_seed_dialects_that_cannot_carry_tasks_are_told_the_same() -> None:
    headers = {"Accept": "application/json, text/event-stream"}
    async with (
        served(_server("mcpserver", dialects=["sketch", "draft", "saga"])) as url,
        httpx2.AsyncClient(trust_env=False, timeout=20.0) as http,
    ):

        async def send(path: str, method: str) -> dict[str, Any]:
            message = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"name": "nightly", "arguments": {}}}
            response = await http.post(url + path, json=message, headers=headers)
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body["error"]

        sketch = await send("/sketch", "tools/call")
        saga = await send("", "tools/callSaga")
        draft = await send("/draft", "tools/call")
    for error, dialect in ((sketch, "sketch"), (saga, "saga")):
        assert error["code"] == t.UNSUPPORTED_PROTOCOL_VERSION, error
        assert error["data"] == {"supported": ["2026-07-28"], "requested": f"{dialect} (a seed dialect)"}
        assert f"the {dialect!r} seed dialect, which cannot carry tasks" in error["message"]
    assert draft["code"] == t.MISSING_REQUIRED_CLIENT_CAPABILITY and "params.task" in draft["message"], draft
