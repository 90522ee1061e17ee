"""What every seed dialect shares: run one translated request through the server's own chain.

A dialect adapter never runs a flow itself. It turns its wire shape into a 2026-07-28
request (answers in `inputResponses`, the sealed journal in `requestState`, the per-request
`_meta` envelope) and hands it to the SDK's single-request entry, `serve_one`: the same
middleware (the `RequestStateBoundary` that seals and verifies the journal), the same
argument validation, the same flow engine and result conversion as a 2026-07-28 client
gets. Only the wire differs, so the flow code, the journal and the sealing are shared.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, cast

import anyio
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.server.runner import modern_error_data, serve_one
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.message import MessageMetadata, ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    INVALID_PARAMS,
    PROTOCOL_VERSION_META_KEY,
    SERVER_INFO_META_KEY,
    ErrorData,
    RequestId,
)
from mcp_types.methods import INPUT_REQUIRED_METHODS
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION
from starlette.requests import Request

from mrtr import _sdk as sdk
from mrtr._wire import SEED_DIALECT, JSONObject

DEFAULT_CAPABILITIES: JSONObject = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}
"""What a dialect client is taken to support when nothing it declared reaches this request:
the seeds' clients answer elicitation and sampling (and the draft's and C#'s, roots) in-band."""

_TOKEN_VERSION = 1
_FUTURE_SKEW = 60.0


class DialectError(Exception):
    """A request a dialect refuses, as the JSON-RPC error it answers with."""

    def __init__(self, error: ErrorData) -> None:
        super().__init__(error.message)
        self.error = error


def refusal(code: int, message: str, reason: str) -> DialectError:
    return DialectError(ErrorData(code=code, message=message, data={"reason": reason}))


def invalid(message: str, reason: str) -> DialectError:
    return refusal(INVALID_PARAMS, message, reason)


@dataclass
class OneExchange:
    """`DispatchContext` for one dialect request: one JSON body in, one out, no back-channel.

    The seed shapes answer with a single response, so a notification a handler emits
    (progress, logs) has no stream to ride and is dropped, as on the 2026-07-28 JSON path.
    """

    transport: TransportContext
    request_id: RequestId
    message_metadata: MessageMetadata
    cancel_requested: anyio.Event = field(default_factory=anyio.Event)
    can_send_request: bool = field(default=False, init=False)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> JSONObject:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        return None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


class Reply(TypedDict):
    """A JSON-RPC success response as a dialect writes it: dialects answer with bodies, not SDK models."""

    jsonrpc: Literal["2.0"]
    id: RequestId
    result: JSONObject


@dataclass
class Caller:
    """Who is calling, as far as a stateless dialect request can tell (see `SessionToken`)."""

    capabilities: JSONObject = field(default_factory=lambda: dict(DEFAULT_CAPABILITIES))
    client_info: JSONObject | None = None
    protocol_version: str = LATEST_HANDSHAKE_VERSION


Origin = Request | ServerRequestContext[Any, Any]
"""Where a dialect request arrived: an HTTP request, or (stdio) the SDK's handler context."""


class Gateway:
    """The server's handler chain, reachable one request at a time (see module docstring)."""

    def __init__(self, server: MCPServer[Any]) -> None:
        self.server = server

    @property
    def security(self) -> RequestStateSecurity:
        """The server's `RequestStateSecurity`: every dialect token is sealed by its codec."""
        security = sdk.state_security(self.server)
        if security is None:
            raise sdk.SDKChanged("the RequestStateBoundary MCPServer installs")
        return security

    @property
    def audience(self) -> str:
        """The audience the boundary stamps on `requestState` (the server name unless set)."""
        return sdk.state_audience(self.server)

    async def call(
        self, origin: Origin, request_id: RequestId, method: str, params: Mapping[str, Any], *, dialect: str
    ) -> Any:
        """Serve `method` at the 2026-07-28 revision (`params` carries its envelope); the result dict.

        `dialect` names the seed wire the request came in (`SEED_DIALECT` while it is served), so
        a refusal can say what that client can do. Raises `DialectError` with the error the SDK's
        modern entry would have answered.
        """
        envelope = params.get("_meta") or {}
        connection = Connection.from_envelope(
            LATEST_MODERN_VERSION, envelope.get(CLIENT_INFO_META_KEY), envelope.get(CLIENT_CAPABILITIES_META_KEY)
        )
        token = SEED_DIALECT.set(dialect)
        try:
            return await self._serve(origin, request_id, method, params, connection)
        finally:
            SEED_DIALECT.reset(token)

    async def call_legacy(
        self, origin: Origin, request_id: RequestId, method: str, params: Mapping[str, Any] | None, caller: Caller
    ) -> JSONObject:
        """Serve a non-MRTR method (initialize, tools/list, ...) on a born-ready handshake connection."""
        version = caller.protocol_version if caller.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS else None
        connection = Connection.from_envelope(
            version or LATEST_HANDSHAKE_VERSION, caller.client_info, caller.capabilities
        )
        return await self._serve(origin, request_id, method, params, connection)

    async def _serve(
        self,
        origin: Origin,
        request_id: RequestId,
        method: str,
        params: Mapping[str, Any] | None,
        connection: Connection,
    ) -> JSONObject:
        if isinstance(origin, Request):
            lowlevel = self.server.session_manager.app
            lifespan_state = sdk.http_lifespan_state(self.server)
            transport = TransportContext(kind="streamable-http", can_send_request=False, headers=origin.headers)
            metadata: MessageMetadata = ServerMessageMetadata(request_context=origin)
        else:
            lowlevel = sdk.lowlevel_server(self.server)
            lifespan_state = origin.lifespan_context
            transport = TransportContext(kind="stdio", can_send_request=False)
            metadata = None
        dctx = OneExchange(transport=transport, request_id=request_id, message_metadata=metadata)
        try:
            return await serve_one(lowlevel, dctx, method, params, connection=connection, lifespan_state=lifespan_state)
        except Exception as exc:
            # Mapped exactly as the modern entry maps it: MCPError and ValidationError to their
            # codes, anything else logged and answered with a generic internal error.
            raise DialectError(modern_error_data(exc)) from None


def modern_params(
    params: Mapping[str, Any], answers: Mapping[str, Any] | None, state: str | None, caller: Caller
) -> JSONObject:
    """A carrier's params at 2026-07-28: the dialect's answers and state where SEP-2322 puts them."""
    out = {k: v for k, v in params.items() if k not in ("inputResponses", "requestState", "_meta")}
    meta = dict(params.get("_meta") or {})
    meta[PROTOCOL_VERSION_META_KEY] = LATEST_MODERN_VERSION
    meta[CLIENT_CAPABILITIES_META_KEY] = caller.capabilities
    if caller.client_info is not None:
        meta[CLIENT_INFO_META_KEY] = caller.client_info
    out["_meta"] = meta
    if answers:
        out["inputResponses"] = dict(answers)
    if state:
        out["requestState"] = state
    return out


def is_carrier(method: str) -> bool:
    """Methods whose result may ask for input (tools/call, prompts/get, resources/read)."""
    return method in INPUT_REQUIRED_METHODS


def is_input_required(result: Mapping[str, Any]) -> bool:
    return result.get("resultType") == "input_required"


def plain_result(result: Mapping[str, Any]) -> JSONObject:
    """A complete 2026-07-28 result as the seeds' era wrote it: no `resultType`, no serverInfo stamp."""
    out = {k: v for k, v in result.items() if k != "resultType"}
    meta = out.get("_meta")
    if isinstance(meta, dict):
        meta = {k: v for k, v in cast(JSONObject, meta).items() if k != SERVER_INFO_META_KEY}
        if meta:
            out["_meta"] = meta
        else:
            del out["_meta"]
    return out


def unwrap_answer(value: Any) -> Any | None:
    """A seed answer (`{"result": R}` or `{"error": E}`, or lenient: a bare result) as an input response.

    An error answer is no answer (the question is asked again), except that an error to an
    elicitation reads as the user declining — the saga seed's own example of a step error.
    Returns `None` for "no usable answer"; the caller maps declines (it knows the method).
    """
    if isinstance(value, dict):
        value = cast(JSONObject, value)
        if "result" in value and isinstance(value["result"], dict):
            return value["result"]
        if "error" in value:
            return None
        return value
    return None


# -- sealed dialect tokens (sessions, sagas): the SDK codec, claims checked like the boundary's ----


def seal(
    security: RequestStateSecurity, kind: str, audience: str | None, claims: Mapping[str, Any], ttl: float | None = None
) -> str:
    now = time.time()
    body = {"v": _TOKEN_VERSION, "k": kind, "iat": now, "exp": now + (ttl or security.ttl), "aud": audience}
    payload = json.dumps({**body, **claims}, separators=(",", ":")).encode()
    return security.codec.seal(payload)


def unseal(security: RequestStateSecurity, kind: str, audience: str | None, token: object) -> JSONObject:
    """The claims of a token this fleet minted for `kind` and `audience`, or `DialectError`.

    The reason goes nowhere near the wire (as with `requestState`): one frozen message.
    """
    refused = invalid(f"Invalid or expired {kind} token", f"invalid_{kind.replace('/', '_')}_token")
    if not isinstance(token, str) or not token:
        raise refused
    try:
        claims = json.loads(security.codec.unseal(token))
    except Exception:  # InvalidRequestState, bad JSON, or deny-on-error: a custom codec failing closes
        raise refused from None
    if not isinstance(claims, dict):
        raise refused
    now = time.time()
    iat, exp = claims.get("iat"), claims.get("exp")
    if (
        claims.get("v") != _TOKEN_VERSION
        or claims.get("k") != kind
        or claims.get("aud") != audience
        or not isinstance(iat, int | float)
        or not isinstance(exp, int | float)
        or not math.isfinite(iat)
        or not (iat <= now + _FUTURE_SKEW)
        or not (now < exp)
    ):
        raise refused
    return cast(JSONObject, claims)


def digest(value: Any) -> str:
    """A short, canonical fingerprint of a client answer (what the saga token remembers)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


__all__ = [
    "DEFAULT_CAPABILITIES",
    "Caller",
    "DialectError",
    "Gateway",
    "OneExchange",
    "Origin",
    "Reply",
    "digest",
    "invalid",
    "is_carrier",
    "is_input_required",
    "modern_params",
    "plain_result",
    "refusal",
    "seal",
    "unseal",
    "unwrap_answer",
]
