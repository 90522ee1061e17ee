"""Seed 001, the draft SEP: `input_requests` / `request_state` out, `input_responses` back.

Like the sketch, the fields sit on the JSON-RPC message beside `params`, so the shape is
served on `/mcp/draft` (or for a client that declared it at `initialize`). `request_state`
is exactly the sealed `requestState` the SDK's boundary mints: bound to the method, the
tool (or prompt, or resource) and its arguments, the audience and the principal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mrtr._dialects.plumbing import invalid, unwrap_answer
from mrtr._wire import JSONObject

NAME = "draft"


def incoming(message: Mapping[str, Any]) -> tuple[JSONObject, str | None]:
    params = message.get("params") or {}
    responses = message.get("input_responses", params.get("input_responses"))
    state = message.get("request_state", params.get("request_state"))
    if state is not None and not isinstance(state, str):
        raise invalid("request_state must be the string the server sent", "malformed_request_state")
    if responses is None:
        return {}, state
    if not isinstance(responses, dict):
        raise invalid("input_responses must be an object keyed like input_requests", "malformed_answers")
    answers = {key: answer for key, value in responses.items() if (answer := unwrap_answer(value)) is not None}
    return answers, state


def outgoing(request_id: Any, result: Mapping[str, Any]) -> JSONObject:
    body: JSONObject = {"jsonrpc": "2.0", "id": request_id}
    if result.get("inputRequests"):
        body["input_requests"] = dict(result["inputRequests"])
    if result.get("requestState"):
        body["request_state"] = result["requestState"]
    return body


__all__ = [
    "NAME",
    "incoming",
    "outgoing",
]
