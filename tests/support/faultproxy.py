"""A round-robin HTTP proxy for tests that injects the faults a real balancer passes on.

Like HAProxy without stickiness it sends each request to the next upstream in turn; an
upstream that refuses the connection becomes a 502, and one that dies mid-answer cuts the
client's connection mid-answer. On top, a test can queue faults per JSON-RPC method:

- "502": answer 502 without asking any upstream (a gateway error);
- "reset": start a 200 event stream and cut the connection before any event (a dropped answer);
- "lose": forward the request, let the upstream answer, then send the client a 502 instead
  (the request took effect but its answer was lost);
- "method_not_found": answer with a JSON-RPC -32601 error, as a server that lacks the method does.

Built on Starlette + uvicorn (server side) and httpx (upstream side); 127.0.0.1 only. Every
request is logged with its JSON-RPC method, params, upstream and what happened to it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

FaultKind = Literal["502", "reset", "lose", "method_not_found"]
_HOP_BY_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass
class Fault:
    method: str
    kind: FaultKind
    remaining: int = 1
    where: Callable[[dict[str, Any]], bool] | None = None
    """Only requests whose params pass this test get the fault."""


@dataclass(frozen=True)
class Exchange:
    """One request through the proxy: what it was, where it went, what the client got."""

    http_method: str
    method: str | None
    params: dict[str, Any]
    upstream: str | None
    outcome: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FaultProxy:
    upstreams: list[str]
    url: str = ""
    faults: list[Fault] = field(default_factory=list)
    pinned: dict[str | None, int] = field(default_factory=dict)
    """JSON-RPC method (None: no body, e.g. the legacy GET stream; "(response)": a client's answer)
    -> index of the upstream that always gets it; other requests go round robin."""
    log: list[Exchange] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _http: httpx2.AsyncClient = field(default_factory=lambda: httpx2.AsyncClient(timeout=httpx2.Timeout(30.0)))

    def inject(
        self, method: str, kind: FaultKind, times: int = 1, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        self.faults.append(Fault(method, kind, times, where))

    def calls(self, method: str) -> list[Exchange]:
        return [e for e in self.log if e.method == method]

    def _take_fault(self, method: str | None, params: dict[str, Any]) -> FaultKind | None:
        for fault in self.faults:
            if fault.method == method and fault.remaining > 0 and (fault.where is None or fault.where(params)):
                fault.remaining -= 1
                return fault.kind
        return None

    def _record(
        self, request: Request, method: str | None, params: dict[str, Any], upstream: str | None, outcome: str
    ) -> int:
        self.log.append(Exchange(request.method, method, params, upstream, outcome, dict(request.headers)))
        return len(self.log) - 1

    def _settle(self, index: int, outcome: str) -> None:
        self.log[index] = replace(self.log[index], outcome=outcome)

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        method, params = _jsonrpc_summary(body)
        fault = self._take_fault(method, params)
        log = partial(self._record, request, method, params)
        if fault == "502":
            log(None, "injected 502")
            return PlainTextResponse("injected bad gateway", status_code=502)
        if fault == "method_not_found":
            log(None, "injected -32601")
            request_id = json.loads(body).get("id")
            error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}}
            return JSONResponse(error)
        if fault == "reset":
            log(None, "injected reset")
            return StreamingResponse(_cut(), media_type="text/event-stream")
        turn = self.pinned[method] if method in self.pinned else next(self._turn)
        upstream = self.upstreams[turn % len(self.upstreams)]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        outbound = self._http.build_request(request.method, upstream, content=body, headers=headers)
        entry = log(upstream, "awaiting the upstream")  # logged now: the client may give up before the answer
        try:
            answer = await self._http.send(outbound, stream=True)
        except httpx2.TransportError as error:
            self._settle(entry, f"502 ({type(error).__name__})")
            return PlainTextResponse("upstream unreachable", status_code=502)
        if fault == "lose":
            await answer.aread()
            await answer.aclose()
            self._settle(entry, "answer lost (502)")
            return PlainTextResponse("answer lost", status_code=502)
        self._settle(entry, f"forwarded {answer.status_code}")
        reply_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
        return StreamingResponse(_relay(answer), status_code=answer.status_code, headers=reply_headers)


async def _relay(answer: httpx2.Response) -> AsyncIterator[bytes]:
    """Pass the upstream's bytes on; if it dies mid-answer, the error cuts the client's connection too."""
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    finally:
        await answer.aclose()


async def _cut() -> AsyncIterator[bytes]:
    yield b": connection about to drop\n\n"
    raise ConnectionResetError("injected reset")


def _jsonrpc_summary(body: bytes) -> tuple[str | None, dict[str, Any]]:
    try:
        message = json.loads(body) if body else None
    except ValueError:
        return None, {}
    if not isinstance(message, dict):
        return None, {}
    if "method" not in message:
        return "(response)", {}
    params = message.get("params")
    return str(message["method"]), params if isinstance(params, dict) else {}


@asynccontextmanager
async def running_proxy(upstreams: list[str]) -> AsyncIterator[FaultProxy]:
    """Serve a `FaultProxy` over `upstreams` on a free 127.0.0.1 port, in this event loop."""
    proxy = FaultProxy(list(upstreams))
    app = Starlette(routes=[Route("/mcp", proxy.handle, methods=["GET", "POST", "DELETE"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off", timeout_graceful_shutdown=1))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or serving.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            raise RuntimeError("fault proxy did not start")
        proxy.url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        async with proxy._http:
            yield proxy
    finally:
        server.should_exit = True
        server.force_exit = True
        await asyncio.wait_for(serving, timeout=5)
        sock.close()
