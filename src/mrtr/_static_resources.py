"""Flows behind fixed-URI resources.

The SDK hands a `Context` (and so `inputResponses`/`requestState`) only to resource
*templates*; a fixed URI's function is called bare. So a fixed-URI flow is listed as a
normal resource but read by this middleware, which sits inside the request-state
boundary and answers `resources/read` for exactly the URIs it owns.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pydantic_core
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    BlobResourceContents,
    InputRequiredResult,
    ReadResourceRequestParams,
    ReadResourceResult,
    TextResourceContents,
)
from pydantic import ValidationError

from mrtr._engine.spec import FlowSpec


class StaticResourceFlows:
    def __init__(self, server: MCPServer[Any]) -> None:
        self._server = server
        self._entries: dict[str, tuple[FlowSpec, Callable[..., Any], str | None]] = {}
        self._installed = False

    def add(self, uri: str, spec: FlowSpec, entry: Callable[..., Any], options: dict[str, Any]) -> None:
        async def listed_only() -> str:  # pragma: no cover - reads are answered by the middleware
            raise RuntimeError("mrtr serves this resource")

        listed_only.__name__ = spec.name
        self._server.resource(uri, **options)(listed_only)
        self._entries[uri] = (spec, entry, options.get("mime_type"))
        if not self._installed:
            self._server.middleware.append(self)
            self._installed = True

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "resources/read" or ctx.params is None:
            return await call_next(ctx)
        entry = self._entries.get(str(ctx.params.get("uri")))
        if entry is None:
            return await call_next(ctx)
        spec, fn, mime_type = entry
        try:
            params = ReadResourceRequestParams.model_validate(ctx.params)
        except ValidationError as exc:
            raise MCPError(code=INVALID_PARAMS, message="Invalid resources/read params") from exc
        request = Context(request_context=ctx, mcp_server=self._server, input_params=params)
        result = await fn(**{spec.request_param: request})
        if isinstance(result, InputRequiredResult):
            return result
        return ReadResourceResult(contents=[_contents(params.uri, result, mime_type)])


def _contents(uri: str, value: Any, mime_type: str | None) -> TextResourceContents | BlobResourceContents:
    if isinstance(value, bytes):
        blob = base64.b64encode(value).decode()
        return BlobResourceContents(uri=uri, blob=blob, mime_type=mime_type or "application/octet-stream")
    text = value if isinstance(value, str) else pydantic_core.to_json(value, fallback=str, indent=2).decode()
    return TextResourceContents(uri=uri, text=text, mime_type=mime_type or "text/plain")


__all__ = [
    "StaticResourceFlows",
]
