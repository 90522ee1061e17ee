"""`ctx.report_progress` inline: the request's progress notifications, in both protocol eras, on both hosts.

The same call a durable task turns into its status message (tests/fleet/test_task_progress.py)
is, inline, the SDK's (or FastMCP's) `report_progress`: a `notifications/progress` for the
client's progress token. A flow re-runs from the top every round; what it reported before the
round's frontier is not sent again.
"""

from __future__ import annotations

from typing import Any

import httpx2
import mcp_types as t
import pytest
from fastmcp import Context, FastMCP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
import mrtr.fastmcp
from mrtr._engine.progress import STATUS_MAX_CHARS, status_text
from tests.support.flowkit import SHARED_KEY, new_server, served, text_of

pytestmark = pytest.mark.anyio


class Go(BaseModel):
    go: bool


async def _yes(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"go": True})


def _sdk_server() -> Any:
    server = new_server("progress-inline")
    flows = mrtr.Flows(server)

    @flows.tool()
    async def halves(ctx: mrtr.FlowContext) -> str:
        await ctx.report_progress(1, 2, "first half")
        ok = await ctx.elicit("Go on?", Go)
        await ctx.report_progress(2, 2, "second half")
        return f"went on: {ok.go}"

    return server


def _fastmcp_server() -> Any:
    mcp: FastMCP[Any] = FastMCP("progress-inline", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(mcp)

    @flows.tool()
    async def halves(ctx: Context) -> str:
        await ctx.report_progress(1, 2, "first half")
        ok = await ctx.elicit("Go on?", response_type=Go)
        await ctx.report_progress(2, 2, "second half")
        return f"went on: {ok.data.go}"  # type: ignore[union-attr]

    return mcp


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_inline_progress_reaches_the_client_once_per_report_in_both_eras(mode: str) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async with Client(_sdk_server(), mode=mode, elicitation_callback=_yes) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        result = await client.call_tool("halves", {}, progress_callback=progress)
    assert text_of(result) == "went on: True"
    # 2026-07-28 runs the flow twice (a round for the form, then the rest): "first half" is not sent again.
    assert seen == [(1, 2, "first half"), (2, 2, "second half")]


async def test_fastmcps_report_progress_is_the_flows_on_fastmcp() -> None:
    seen: list[str | None] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async with (
        served(_fastmcp_server()) as url,
        httpx2.AsyncClient(trust_env=False, timeout=20.0) as http,
        Client(streamable_http_client(url, http_client=http), elicitation_callback=_yes) as client,  # type: ignore[arg-type]
    ):
        result = await client.call_tool("halves", {}, progress_callback=progress)
    assert text_of(result) == "went on: True"
    assert seen == ["first half", "second half"], seen  # each once, although the flow ran twice


def test_a_status_message_is_the_message_else_the_count() -> None:
    assert status_text(2, 3, "chunk 2 of 3") == "chunk 2 of 3"
    assert status_text(2, 3, None) == "2 of 3"
    assert status_text(0.5, None, None) == "0.5"
    long = status_text(1, None, "x" * 10_000)
    assert len(long) == STATUS_MAX_CHARS and long.endswith("…")
