"""A malformed `inputResponses` value, named at the edge.

The SDK validates a request's params before any handler runs. An `inputResponses` value that
fits none of the spec's answer types fails that check, and the client gets -32602
`Invalid request parameters` with empty data: no key, no field, nothing to fix a client by.
This server middleware sits around that check. When it fails, it looks at each answer on its
own, against the schema of the protocol version in use, and raises the same -32602 naming the
first malformed answer's key, field, and what the field must hold (`MalformedAnswer`). The
kind of answer a key expects is read from the key when mrtr derived it (`sample_...`,
`roots_...`, `elicit_...`), else from the answer's shape. A request that is valid costs nothing:
the middleware only catches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types.methods import INPUT_REQUIRED_METHODS
from mcp_types.version import LATEST_MODERN_VERSION
from pydantic import ValidationError

from mrtr._engine.asks import AskKind, MalformedAnswer, malformed
from mrtr._sdk import client_result_schema

_METHOD: dict[AskKind, str] = {
    "sample": "sampling/createMessage",
    "roots": "roots/list",
    "elicit": "elicitation/create",
}


class AnswerCheck:
    """Server middleware (the SDK's `Server.middleware`): see the module docstring."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except ValidationError:
            named = named_error(ctx.method, ctx.params, getattr(ctx, "protocol_version", None))
            if named is None:
                raise
            raise named from None


def named_error(method: str, params: Mapping[str, Any] | None, version: str | None) -> MalformedAnswer | None:
    """The `MalformedAnswer` for the first answer in `params` that its version's schema refuses, if any."""
    if method not in INPUT_REQUIRED_METHODS or not isinstance(params, Mapping):
        return None
    answers = params.get("inputResponses")
    if not isinstance(answers, Mapping):
        return None
    version = version or LATEST_MODERN_VERSION
    for key, answer in answers.items():
        kind = _kind(str(key), answer)
        try:
            client_result_schema(_METHOD[kind], version).validate_python(answer, by_name=False)
        except ValidationError as exc:
            return malformed(kind, exc, answer, str(key), version)
    return None


def install(lowlevel: Any) -> None:
    """Add the check to a low-level `Server`'s middleware, once."""
    chain = getattr(lowlevel, "middleware", None)
    if isinstance(chain, list) and not any(isinstance(m, AnswerCheck) for m in chain):
        chain.append(AnswerCheck())


def _kind(key: str, answer: Any) -> AskKind:
    for kind in ("sample", "roots", "elicit"):
        if key.startswith(f"{kind}_"):
            return kind
    if isinstance(answer, Mapping):
        if "action" in answer:
            return "elicit"
        if "roots" in answer:
            return "roots"
    return "sample"


__all__ = ["AnswerCheck", "install", "named_error"]
