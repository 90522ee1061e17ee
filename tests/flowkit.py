"""Helpers for driving flows round by round with the official `mcp.Client` as the peer."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mcp_types as t
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

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


def manual_client(server: MCPServer, *, elicitation: bool = True, sampling: bool = True, roots: bool = True) -> Client:
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
