"""Seed 000, the first sketch: `dependent_requests` out, `dependent_responses` back.

Both live on the JSON-RPC message itself, beside `params` (the response has no `result`),
so this shape exists only on its own endpoint (`/mcp/sketch`) or for a client that declared
it at `initialize`. The sketch has no state field ("a cookie-ish mechanism" is left open):
mrtr's sealed journal rides as the *key* of one extra dependent request, a `ping`, which
every client answers and echoes back verbatim like any other key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from mcp_types import RequestId

from mrtr._dialects.plumbing import invalid, unwrap_answer
from mrtr._wire import InputRequests, InputResponses

NAME = "sketch"
STATE_KEY_PREFIX = "mrtr/state:"
"""The key of the `ping` dependent request that carries the sealed journal."""


class SketchReply(TypedDict):
    """The sketch's answer to a round that needs input: its asks, the sealed journal riding as
    one more of them (a `ping` under `STATE_KEY_PREFIX`)."""

    jsonrpc: Literal["2.0"]
    id: RequestId
    dependent_requests: InputRequests


def incoming(message: Mapping[str, Any]) -> tuple[InputResponses, str | None]:
    """The answers and sealed journal a retried request carries (none on a first request)."""
    params = message.get("params") or {}
    responses = message.get("dependent_responses", params.get("dependent_responses"))
    state = message.get("request_state")  # lenient: a client that adopted the draft's field
    if responses is None:
        return {}, state if isinstance(state, str) else None
    if not isinstance(responses, dict):
        raise invalid("dependent_responses must be an object keyed like dependent_requests", "malformed_answers")
    answers: InputResponses = {}
    for key, value in responses.items():
        if key.startswith(STATE_KEY_PREFIX):
            state = key.removeprefix(STATE_KEY_PREFIX)
            continue
        answer = unwrap_answer(value)
        if answer is not None:
            answers[key] = answer
    return answers, state if isinstance(state, str) else None


def outgoing(request_id: Any, result: Mapping[str, Any]) -> SketchReply:
    """An `input_required` result as the sketch's incomplete response."""
    requests = dict(result.get("inputRequests") or {})
    state = result.get("requestState")
    if isinstance(state, str) and state:
        requests[STATE_KEY_PREFIX + state] = {"method": "ping"}
    return {"jsonrpc": "2.0", "id": request_id, "dependent_requests": requests}


__all__ = [
    "NAME",
    "STATE_KEY_PREFIX",
    "SketchReply",
    "incoming",
    "outgoing",
]
