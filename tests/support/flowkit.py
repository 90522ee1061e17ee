"""Helpers for driving flows round by round with the official `mcp.Client` as the peer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

ROOT_DIR = Path(__file__).resolve().parents[2]
"""The repository's root (examples/, README.md)."""
SHARED_KEY = os.urandom(32)


def new_server(name: str = "flows-under-test", key: bytes = SHARED_KEY) -> MCPServer:
    return MCPServer(name, request_state_security=RequestStateSecurity(keys=[key]))


def accept(**content: Any) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content=content)


def sampled(text: str) -> t.CreateMessageResult:
    return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=text), model="test-model")


def roots(*uris: str) -> t.ListRootsResult:
    return t.ListRootsResult(roots=[t.Root(uri=u, name=u.rsplit("/", 1)[-1]) for u in uris])


async def _no_elicit(context: Any, params: Any) -> t.ElicitResult:  # declares the capability only
    raise AssertionError("rounds are driven by hand")


async def _no_sample(context: Any, params: Any) -> t.CreateMessageResult:
    raise AssertionError("rounds are driven by hand")


async def _no_roots(context: Any) -> t.ListRootsResult:
    raise AssertionError("rounds are driven by hand")


def manual_client(server: Any, *, elicitation: bool = True, sampling: bool = True, roots: bool = True) -> Client:
    """A 2026-07-28 in-process client that declares capabilities but whose rounds we drive."""
    return Client(
        server,
        elicitation_callback=_no_elicit if elicitation else None,
        sampling_callback=_no_sample if sampling else None,
        list_roots_callback=_no_roots if roots else None,
    )


class Driver:
    """Drives one tool call round by round and keeps what each round returned."""

    def __init__(self, client: Client, tool: str, arguments: dict[str, Any] | None = None) -> None:
        self.client = client
        self.tool = tool
        self.arguments = arguments or {}
        self.state: str | None = None
        self.rounds: list[t.InputRequiredResult] = []

    async def send(self, responses: dict[str, Any] | None = None) -> t.CallToolResult | t.InputRequiredResult:
        result = await self.client.session.call_tool(
            self.tool,
            self.arguments,
            input_responses=responses,
            request_state=self.state,
            allow_input_required=True,
        )
        if isinstance(result, t.InputRequiredResult):
            self.rounds.append(result)
            self.state = result.request_state
        return result

    @property
    def asked(self) -> dict[str, t.InputRequest]:
        return dict(self.rounds[-1].input_requests or {})

    def key_where(self, predicate: Callable[[t.InputRequest], bool]) -> str:
        keys = [k for k, r in self.asked.items() if predicate(r)]
        assert len(keys) == 1, f"expected one matching ask, got {keys} in {self.asked}"
        return keys[0]

    def key_for_message(self, fragment: str) -> str:
        return self.key_where(lambda r: r.method == "elicitation/create" and fragment in r.params.message)


def text_of(result: t.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, t.TextContent))


@contextlib.asynccontextmanager
async def served(server: Any) -> AsyncIterator[str]:
    """Serve `server` (an `MCPServer`, or a `FastMCP` through its `http_app()`) over streamable HTTP
    from this test's own event loop; yields its URL.

    A real uvicorn on 127.0.0.1 with a real socket, so rounds cross HTTP exactly as they do
    in production, while the test can still count side effects in memory.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    app = server.streamable_http_app() if isinstance(server, MCPServer) else server.http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    runner = uvicorn.Server(config)
    serving = asyncio.get_running_loop().create_task(runner.serve(sockets=[sock]))
    try:
        while not runner.started:
            if serving.done():
                await serving
                raise RuntimeError("uvicorn did not start")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        runner.should_exit = True
        await asyncio.wait_for(serving, 10)
        sock.close()


@contextlib.asynccontextmanager
async def connect(server: MCPServer, transport: str, **options: Any) -> AsyncIterator[Client]:
    """A manual 2026-07-28 client (see `manual_client`) in memory or over real HTTP."""
    if transport == "memory":
        async with manual_client(server, **options) as client:
            yield client
        return
    async with served(server) as url, httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        client = manual_client(streamable_http_client(url, http_client=http), **options)  # type: ignore[arg-type]
        async with client:
            yield client


async def task_state(session: Any, task_id: str) -> dict[str, Any]:
    """`tasks/get` as the JSON the server sent (camelCase), for assertions on the wire."""
    from mrtr.client import get_task

    return (await get_task(session, task_id)).model_dump(by_alias=True, mode="json", exclude_none=True)
