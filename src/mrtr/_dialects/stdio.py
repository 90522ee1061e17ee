"""Saga and incomplete on stdio (and any transport the SDK drives itself), as server middleware.

Two of the four shapes are plain JSON-RPC: the saga has its own methods with ordinary
results, and the C# shape is an ordinary result discriminated by `result_type`. Those fit
stdio, where the SDK owns the wire, so this middleware serves them inside the SDK's chain.
The sketch and the draft answer with a message that has no `result` member, which is not
JSON-RPC: they exist only on their HTTP endpoints.

It sits just outside the `RequestStateBoundary`, so the round it hands to the SDK's
single-request entry is verified and sealed by the boundary like any 2026-07-28 round. On
HTTP the ASGI layer (`mrtr._dialects.http`) has already served these requests, so here the
middleware costs one method test per request.
"""

from __future__ import annotations

from typing import Any, cast

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError

from mrtr._dialects import incomplete, saga
from mrtr._dialects.plumbing import (
    DEFAULT_CAPABILITIES,
    Caller,
    DialectError,
    Gateway,
    is_carrier,
    is_input_required,
    modern_params,
    plain_result,
)
from mrtr._wire import JSONObject


class DialectMiddleware:
    """`ServerMiddleware` serving the enabled JSON-RPC-shaped dialects on SDK-run connections."""

    def __init__(self, gateway: Gateway, *, saga_enabled: bool, incomplete_enabled: bool) -> None:
        self.gateway = gateway
        self.saga = saga_enabled
        self.incomplete = incomplete_enabled

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method = ctx.method
        if ctx.request_id is None:
            return await call_next(ctx)
        try:
            if self.saga and method in saga.METHODS:
                caller = _caller(ctx, dict(saga.CAPABILITIES))
                # The SDK's middleware takes a plain dict: the named shapes are dicts at run time.
                return cast(
                    JSONObject, await saga.handle(self.gateway, ctx, ctx.request_id, method, ctx.params or {}, caller)
                )
            if self.incomplete and method == "initialize":
                result = await call_next(ctx)
                if (ctx.params or {}).get("protocolVersion") == incomplete.VERSION and isinstance(result, dict):
                    result = {**result, "protocolVersion": incomplete.VERSION}
                return result
            if self.incomplete and is_carrier(method) and _negotiated_incomplete(ctx):
                return await self._incomplete(ctx)
        except DialectError as exc:
            raise MCPError(code=exc.error.code, message=exc.error.message, data=exc.error.data) from None
        return await call_next(ctx)

    async def _incomplete(self, ctx: ServerRequestContext[Any, Any]) -> JSONObject:
        params = ctx.params or {}
        answers, state = incomplete.incoming({"params": params})
        modern = modern_params(params, answers, state, _caller(ctx, dict(DEFAULT_CAPABILITIES)))
        assert ctx.request_id is not None
        result = await self.gateway.call(ctx, ctx.request_id, ctx.method, modern, dialect=incomplete.NAME)
        if is_input_required(result):
            return cast(JSONObject, incomplete.outgoing_result(result))  # a plain dict for the SDK, as above
        return plain_result(result)


def _negotiated_incomplete(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The connection's `initialize` asked for `2026-06-XX` (the SDK keeps the requested version)."""
    params = ctx.session.client_params
    return params is not None and params.protocol_version == incomplete.VERSION


def _caller(ctx: ServerRequestContext[Any, Any], fallback: JSONObject) -> Caller:
    """What this connection's `initialize` declared, else what the dialect's clients answer."""
    declared = ctx.session.client_capabilities
    params = ctx.session.client_params
    capabilities = declared.model_dump(by_alias=True, exclude_none=True) if declared is not None else fallback
    info = params.client_info.model_dump(by_alias=True, exclude_none=True) if params is not None else None
    return Caller(capabilities=capabilities, client_info=info)


__all__ = [
    "DialectMiddleware",
]
