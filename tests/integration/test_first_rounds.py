"""What identifies a first round (`mrtr._host.identity`), on both hosts, in process over HTTP.

Each host serves a one-round `pay` flow (one counted step) from its own HTTP app with a replay
guard on Redis (and with it the joining of first rounds). The
same request is POSTed twice, one after the other: it is joined (the step runs once, both get
the same answer) when a stamped request id, an idempotency key, or the principal with the same
body identifies it, and runs twice otherwise. The kill and the balancer are in
tests/fleet/test_resend.py.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from fastmcp import FastMCP
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

import mrtr
import mrtr.fastmcp
from mrtr._wire import IDEMPOTENCY_KEY
from tests.support.flowkit import SHARED_KEY
from tests.support.redis_proc import RedisProcess
from tests.support.storekit import REDIS_URL, drop_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.needs_redis]


@dataclass
class Served:
    """A host's HTTP app in process, and how many times the step ran."""

    http: httpx2.AsyncClient
    runs: list[str] = field(default_factory=list)

    async def call(
        self,
        base: int,
        *,
        headers: dict[str, str] | None = None,
        meta: dict[str, Any] | None = None,
        rpc_id: int = 2,
        tool: str = "pay",
    ) -> dict[str, Any]:
        envelope = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        params = {"name": tool, "arguments": {"base": base}, "_meta": envelope | (meta or {})}
        body = {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}
        sent = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": tool,
        } | (headers or {})
        response = await self.http.post("/mcp", content=json.dumps(body).encode(), headers=sent)
        text = response.text
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and '"id"' in line)
        reply: dict[str, Any] = json.loads(text)
        return reply


def _build(kind: str, guard: Any, runs: list[str], security: RequestStateSecurity, **options: Any) -> Any:
    async def charge(base: int) -> int:
        runs.append(secrets.token_hex(2))
        if base < 0:
            await asyncio.sleep(0.5)  # long enough for a copy to give up waiting
        return base + len(runs) * 1000  # a second run answers differently: a merge shows

    async def pay(base: int, ctx: mrtr.FlowContext) -> int:
        return await ctx.step("charge", charge, base)

    async def quote(base: int, ctx: mrtr.FlowContext) -> int:
        return base * 2  # no step: nothing a resend could run twice

    if kind == "mcpserver":
        flows: Any = mrtr.Flows(MCPServer("ident", request_state_security=security), replay_guard=guard, **options)
        flows.tool()(pay)
        flows.tool()(quote)
        return flows.streamable_http_app()
    flows = mrtr.fastmcp.Flows(FastMCP("ident", request_state_security=security), replay_guard=guard, **options)
    flows.tool()(pay)
    flows.tool()(quote)
    return flows.http_app()


Serve = Callable[..., Any]


@pytest.fixture(params=["mcpserver", "fastmcp"])
async def serve(request: pytest.FixtureRequest) -> AsyncIterator[Serve]:
    """`serve(**options)`: a host of this kind with a fresh Redis namespace, as an async context."""
    kind: str = request.param
    namespaces: list[str] = []

    def make(
        principal: str | None = None,
        max_wait: float = 30.0,
        url: str = REDIS_URL,
        on_outage: str = "fail_closed",
        **options: Any,
    ) -> Any:
        import contextlib

        @contextlib.asynccontextmanager
        async def served() -> AsyncIterator[Served]:
            namespace = f"ident_{secrets.token_hex(4)}"
            namespaces.append(namespace)
            security = RequestStateSecurity(keys=[SHARED_KEY], bind_principal=lambda ctx: principal)
            runs: list[str] = []
            # The guard's own ledger on Redis (no task store: nothing here runs as a task).
            guard = mrtr.open_guard(url, namespace=namespace, max_wait=max_wait, on_outage=on_outage)
            app = _build(kind, guard, runs, security, **options)
            transport = httpx2.ASGITransport(app=app)
            async with (
                app.router.lifespan_context(app),
                httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http,
            ):
                yield Served(http, runs)

        return served()

    yield make
    for namespace in namespaces:
        await drop_namespace("redis", namespace)


async def test_a_stamped_request_id_joins_a_resend_and_nothing_else(serve: Serve) -> None:
    async with serve() as host:
        first = await host.call(1, headers={"x-request-id": "req-1"})
        again = await host.call(1, headers={"x-request-id": "req-1"})
        assert first == again and first["result"]["content"][0]["text"] == "1001"
        assert len(host.runs) == 1
        other = await host.call(1, headers={"x-request-id": "req-2"})  # a new client request
        assert other["result"]["content"][0]["text"] == "2001"
        unstamped = [await host.call(1), await host.call(1)]  # byte-identical bodies, nothing else
        assert [u["result"]["content"][0]["text"] for u in unstamped] == ["3001", "4001"]
        reused = await host.call(5, headers={"x-request-id": "req-1"})
        assert reused["error"]["code"] == -32602
        assert reused["error"]["data"]["reason"] == "request_id_reused"
    assert len(host.runs) == 4


async def test_the_header_is_configurable_and_can_be_off(serve: Serve) -> None:
    async with serve(request_id_header="X-Amzn-Trace-Id") as host:
        await host.call(1, headers={"x-amzn-trace-id": "t-1"})
        await host.call(1, headers={"x-amzn-trace-id": "t-1"})
        await host.call(1, headers={"x-request-id": "r-1"})
        await host.call(1, headers={"x-request-id": "r-1"})
    assert len(host.runs) == 3, "the configured header joins, X-Request-ID is then not read"
    async with serve(request_id_header=None) as host:
        await host.call(1, headers={"x-request-id": "r-1"})
        await host.call(1, headers={"x-request-id": "r-1"})
    assert len(host.runs) == 2


async def test_an_idempotency_key_joins_a_resend_whatever_the_stamp(serve: Serve) -> None:
    key = {IDEMPOTENCY_KEY: secrets.token_urlsafe(12)}
    async with serve() as host:
        first = await host.call(1, meta=key, headers={"x-request-id": "a"})
        again = await host.call(1, meta=key, headers={"x-request-id": "b"}, rpc_id=9)  # the caller's own retry
        assert first["result"] == again["result"]
    assert len(host.runs) == 1


async def test_the_principal_with_the_body_joins_only_the_same_request(serve: Serve) -> None:
    async with serve(principal="alice") as host:
        first = await host.call(1)
        again = await host.call(1)  # the same request (JSON-RPC id 2) resent
        assert first == again
        assert len(host.runs) == 1
        await host.call(1, rpc_id=3)  # the same user's next call in the session
        await host.call(2)  # other arguments
    assert len(host.runs) == 3
    async with serve(principal="bob") as other:
        await other.call(1)
    assert len(other.runs) == 1


async def test_a_copy_that_cannot_wait_long_enough_gets_a_retryable_error(serve: Serve) -> None:
    stamp = {"x-request-id": "slow-1"}
    async with serve(max_wait=0.1) as host:
        replies = await asyncio.gather(host.call(-1, headers=stamp), host.call(-1, headers=stamp))
        first, copy = sorted(replies, key=lambda reply: "error" in reply)  # whichever claimed it first
        assert first["result"]["content"][0]["text"] == "999"
        assert copy["error"]["code"] == -32603
        assert copy["error"]["data"] == {"reason": "request_in_flight", "flow": "pay", "retryable": True}
        assert (await host.call(-1, headers=stamp))["result"] == first["result"], "its retry gets the answer"
    assert len(host.runs) == 1


@pytest.mark.spawns
@pytest.mark.parametrize("outage", ["fail_closed", "degrade"])
async def test_a_first_round_during_a_store_outage_is_the_flows_choice(
    serve: Serve, outage: str, tmp_path: Any
) -> None:
    """`replay_guard_outage`: refused retryable before its first step (a round with no step still
    answers: it has nothing to run twice), or run at once without joining."""
    if RedisProcess.binary() is None:
        pytest.skip("redis-server is not installed (a private Redis is killed here)")
    with RedisProcess(tmp_path) as private:
        async with serve(url=private.url, on_outage=outage) as host:
            assert "result" in await host.call(1, headers={"x-request-id": "before"})
            private.kill()
            during = await host.call(2, headers={"x-request-id": "during"})
            if outage == "fail_closed":
                assert during["error"]["code"] == -32603 and during["error"]["data"]["retryable"] is True
                assert len(host.runs) == 1
                quoted = await host.call(21, headers={"x-request-id": "quote-during"}, tool="quote")
                assert quoted["result"]["content"][0]["text"] == "42", quoted
            else:
                assert during["result"]["content"][0]["text"] == "2002"
                assert len(host.runs) == 2
            private.start()
            after = await host.call(3, headers={"x-request-id": "after"})
            assert "result" in after, after
            assert after == await host.call(3, headers={"x-request-id": "after"}), "joined again once the store is back"
