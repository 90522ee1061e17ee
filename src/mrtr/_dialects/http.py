"""The dialects on streamable HTTP: their endpoints, and recognising them on `/mcp`.

How a dialect is recognised is the project's contract (`spec/dialects.md`):

- `/mcp/sketch`, `/mcp/draft`: one endpoint per message-level shape (their first requests
  are the same bytes, so only the URL can tell them apart);
- on `/mcp`: an `initialize` naming `2026-06-XX` (incomplete) or declaring
  `capabilities.experimental["mrtr/dialect"] = {"name": "sketch" | "draft"}`, a request
  carrying `MCP-Protocol-Version: 2026-06-XX`, or the saga's own methods.

Every dialect request is stateless: what `initialize` declared (capabilities, client info,
the dialect) is sealed into the `Mcp-Session-Id` the server hands back, so any instance
that shares the key can serve the next request. Anything else on `/mcp` goes to the SDK
untouched. Bodies are parsed with the SDK's JSON-RPC models; responses are plain JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from mcp.server.transport_security import TransportSecurityMiddleware
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCRequest
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mrtr._dialects import draft_tasks, saga
from mrtr._dialects.plumbing import (
    Caller,
    DialectError,
    Gateway,
    is_carrier,
    is_input_required,
    modern_params,
    plain_result,
    refusal,
    seal,
    unseal,
)
from mrtr._wire import JSONObject

SESSION_PREFIX = "mrtr-dialect."
SESSION_KIND = "mrtr/dialect-session"
SESSION_TTL = 24 * 3600.0
"""A session token holds no secret, only what `initialize` declared; a lapsed one is a 404 (re-initialize)."""
DECLARATION = "mrtr/dialect"
"""`capabilities.experimental` key by which a client on `/mcp` asks for sketch or draft."""
PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
SESSION_HEADER = "mcp-session-id"


@dataclass(frozen=True)
class Shape:
    """A message-level dialect (sketch, draft, incomplete): how a round looks on its wire."""

    name: str
    incoming: draft_tasks.Incoming
    outgoing: draft_tasks.Outgoing
    version: str | None = None
    """The protocol version `initialize` answers with (incomplete: `2026-06-XX`)."""
    tasks: bool = False
    """Also serves seed 001's persistent workflow (`draft_tasks`): the draft only."""


class BodyTooLarge(Exception):
    pass


class DialectServer:
    """Answers one dialect request: JSON-RPC in, the dialect's JSON out."""

    def __init__(self, gateway: Gateway, shapes: Mapping[str, Shape], saga_enabled: bool) -> None:
        self.gateway = gateway
        self.shapes = shapes
        self.saga_enabled = saga_enabled

    def session(self, headers: Headers) -> tuple[Shape | None, Caller] | None:
        """The dialect and caller a sealed session id names; `None` if it is not one of ours.

        Raises `DialectError` for a token of ours that is forged, expired or for a dialect
        no longer enabled (the client is told to start over, as for an unknown session).
        """
        value = headers.get(SESSION_HEADER, "")
        if not value.startswith(SESSION_PREFIX):
            return None
        gateway = self.gateway
        unknown = refusal(INVALID_REQUEST, "Session not found", "unknown_session")
        try:
            claims = unseal(gateway.security, SESSION_KIND, gateway.audience, value.removeprefix(SESSION_PREFIX))
        except DialectError:
            raise unknown from None
        shape = self.shapes.get(claims.get("d", ""))
        if shape is None:
            raise unknown
        caller = Caller(capabilities=claims.get("c") or {}, client_info=claims.get("i"))
        if isinstance(claims.get("pv"), str):
            caller.protocol_version = claims["pv"]
        return shape, caller

    async def respond(self, request: Request, body: bytes, shape: Shape | None, caller: Caller) -> Response:
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            return _error(None, ErrorData(code=PARSE_ERROR, message="Parse error"), 400)
        if isinstance(decoded, dict) and "id" not in decoded:
            return Response(status_code=202)  # a notification: nothing to act on statelessly
        if shape is not None and shape.tasks and isinstance(decoded, dict) and draft_tasks.handles(decoded):
            try:
                reply = await draft_tasks.serve(self.gateway, request, decoded, caller, shape.incoming, shape.outgoing)
            except DialectError as exc:
                request_id = decoded.get("id")
                return _error(request_id if isinstance(request_id, str | int) else None, exc.error, 200)
            return JSONResponse(reply)
        try:
            message = JSONRPCRequest.model_validate(decoded)
        except ValidationError:
            error = ErrorData(code=INVALID_REQUEST, message="Body must be a single JSON-RPC request object")
            return _error(None, error, 400)
        raw = cast(JSONObject, decoded)
        params = message.params or {}
        try:
            if message.method == "initialize" and shape is not None:
                return await self._initialize(request, message, shape)
            if message.method in saga.METHODS and self.saga_enabled:
                if shape is None:
                    caller = Caller(capabilities=dict(saga.CAPABILITIES))
                result = await saga.handle(self.gateway, request, message.id, message.method, params, caller)
            elif shape is not None and is_carrier(message.method):
                answers, state = shape.incoming(raw)
                modern = modern_params(params, answers, state, caller)
                result = await self.gateway.call(request, message.id, message.method, modern, dialect=shape.name)
                if is_input_required(result):
                    return JSONResponse(shape.outgoing(message.id, result))
                result = plain_result(result)
            else:
                result = await self.gateway.call_legacy(request, message.id, message.method, params, caller)
        except DialectError as exc:
            return _error(message.id, exc.error, 200)
        return JSONResponse({"jsonrpc": "2.0", "id": message.id, "result": result})

    async def _initialize(self, request: Request, message: JSONRPCRequest, shape: Shape) -> Response:
        params = message.params or {}
        capabilities = params.get("capabilities")
        info = params.get("clientInfo")
        caller = Caller(
            capabilities=capabilities if isinstance(capabilities, dict) else {},
            client_info=info if isinstance(info, dict) else None,
            protocol_version=str(params.get("protocolVersion", "")),
        )
        result = await self.gateway.call_legacy(request, message.id, "initialize", params, caller)
        if shape.version is not None:
            result["protocolVersion"] = shape.version
        claims = {"d": shape.name, "c": caller.capabilities, "i": caller.client_info, "pv": result["protocolVersion"]}
        token = seal(self.gateway.security, SESSION_KIND, self.gateway.audience, claims, ttl=SESSION_TTL)
        body = {"jsonrpc": "2.0", "id": message.id, "result": result}
        return JSONResponse(body, headers={SESSION_HEADER: SESSION_PREFIX + token})


def _error(request_id: Any, error: ErrorData, status: int) -> JSONResponse:
    body = {"jsonrpc": "2.0", "id": request_id, "error": error.model_dump(mode="json", exclude_none=True)}
    return JSONResponse(body, status_code=status)


async def _guard(server: DialectServer, request: Request) -> Response | None:
    """The SDK's own DNS-rebinding / origin checks, as its `/mcp` applies them."""
    manager = server.gateway.server.session_manager
    return await TransportSecurityMiddleware(manager.security_settings).validate_request(
        request, is_post=request.method == "POST"
    )


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _too_large() -> Response:
    error = ErrorData(code=INVALID_REQUEST, message="Request body too large")
    return _error(None, error, 413)


class DialectEndpoint:
    """`/mcp/sketch` or `/mcp/draft`: every request speaks `shape`."""

    def __init__(self, server: DialectServer, shape: Shape) -> None:
        self.server = server
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response = await _guard(self.server, request)
        if response is None:
            response = await self._respond(request, receive)
        await response(scope, receive, send)

    async def _respond(self, request: Request, receive: Receive) -> Response:
        if request.method == "DELETE":
            return Response(status_code=200)  # nothing is kept server-side: always "ended"
        if request.method != "POST":
            return Response(status_code=405, headers={"Allow": "POST, DELETE"})
        try:
            session = self.server.session(request.headers)
            body = await _read_body(receive, self.server.gateway.server.session_manager.max_request_body_size)
        except DialectError as exc:
            return _error(None, exc.error, 404)
        except BodyTooLarge:
            return _too_large()
        caller = session[1] if session is not None else Caller()
        return await self.server.respond(request, body, self.shape, caller)


class MainEndpoint:
    """Wraps the SDK's `/mcp`: serves the dialect requests there, passes everything else through."""

    def __init__(self, inner: ASGIApp, server: DialectServer, declared: frozenset[str]) -> None:
        self.inner = inner
        self.server = server
        self.declared = declared
        """Dialects a client may ask for at `initialize` on `/mcp` (the enabled sketch/draft)."""
        self.incomplete = server.shapes.get("incomplete")
        self.peek = server.saga_enabled or self.incomplete is not None or bool(declared)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        headers = Headers(scope=scope)
        incomplete = self.incomplete
        ours = headers.get(SESSION_HEADER, "").startswith(SESSION_PREFIX)
        by_header = incomplete is not None and headers.get(PROTOCOL_VERSION_HEADER) == incomplete.version
        if not (ours or by_header) and (scope["method"] != "POST" or not self.peek):
            await self.inner(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await _guard(self.server, request)
        if response is None:
            response = await self._route(scope, receive, send, request, ours, by_header)
        if response is not None:
            await response(scope, receive, send)

    async def _route(
        self, scope: Scope, receive: Receive, send: Send, request: Request, ours: bool, by_header: bool
    ) -> Response | None:
        limit = self.server.gateway.server.session_manager.max_request_body_size
        shape: Shape | None = None
        caller = Caller()
        if ours or by_header:
            if request.method == "DELETE":
                return Response(status_code=200)
            if request.method != "POST":
                return Response(status_code=405, headers={"Allow": "POST, DELETE"})
            try:
                session = self.server.session(request.headers) if ours else None
            except DialectError as exc:
                return _error(None, exc.error, 404)
            if session is not None:
                shape, caller = session
            if by_header:
                shape = self.incomplete
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            return _too_large()
        if shape is None and not ours:
            shape, handled = self._recognise(body)
            if not handled:
                await self.inner(scope, _replay(body, receive), send)
                return None
        return await self.server.respond(request, body, shape, caller)

    def _recognise(self, body: bytes) -> tuple[Shape | None, bool]:
        """Whether this plain `/mcp` POST is a dialect's, and which (cheap substring tests first)."""
        saga_hint = self.server.saga_enabled and b"Saga" in body
        init_hint = (self.incomplete is not None or self.declared) and b"initialize" in body
        if not (saga_hint or init_hint):
            return None, False
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            return None, False
        if not isinstance(decoded, dict):
            return None, False
        method = decoded.get("method")
        if saga_hint and method in saga.METHODS:
            return None, True
        params = decoded.get("params")
        if method != "initialize" or not isinstance(params, dict):
            return None, False
        if self.incomplete is not None and params.get("protocolVersion") == self.incomplete.version:
            return self.incomplete, True
        experimental = (params.get("capabilities") or {}).get("experimental") or {}
        declared = experimental.get(DECLARATION) if isinstance(experimental, dict) else None
        name = declared.get("name") if isinstance(declared, dict) else None
        if name in self.declared:
            return self.server.shapes[name], True
        return None, False  # a dialect never captures a client that did not ask for it


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the SDK's app after we read the body: the body once, then the live channel."""
    delivered = False

    async def again() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


__all__ = [
    "DECLARATION",
    "PROTOCOL_VERSION_HEADER",
    "SESSION_HEADER",
    "SESSION_KIND",
    "SESSION_PREFIX",
    "SESSION_TTL",
    "BodyTooLarge",
    "DialectEndpoint",
    "DialectServer",
    "MainEndpoint",
    "Shape",
]
