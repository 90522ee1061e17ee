"""Seed 001, the draft SEP: `input_requests` / `request_state` out, `input_responses` back.

Like the sketch, the fields sit on the JSON-RPC message beside `params`, so the shape is
served on `/mcp/draft` (or for a client that declared it at `initialize`). `request_state`
is exactly the sealed `requestState` the SDK's boundary mints: bound to the method, the
tool (or prompt, or resource) and its arguments, the audience and the principal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from mcp_types import RequestId

from mrtr._dialects.plumbing import invalid, unwrap_answer
from mrtr._wire import InputRequests, InputResponses, JSONObject

NAME = "draft"


class DraftReply(TypedDict):
    """The draft's answer to a round that needs input: the asks and the sealed state beside the
    id, in snake_case, with no `result`."""

    jsonrpc: Literal["2.0"]
    id: RequestId
    input_requests: NotRequired[InputRequests]
    request_state: NotRequired[str]
    _meta: NotRequired[JSONObject]
    """The related task, when a durable task asks (`draft_tasks`)."""


def incoming(message: Mapping[str, Any]) -> tuple[InputResponses, str | None]:
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


def outgoing(request_id: Any, result: Mapping[str, Any]) -> DraftReply:
    body: DraftReply = {"jsonrpc": "2.0", "id": request_id}
    if result.get("inputRequests"):
        body["input_requests"] = dict(result["inputRequests"])
    if result.get("requestState"):
        body["request_state"] = result["requestState"]
    return body


__all__ = [
    "NAME",
    "DraftReply",
    "incoming",
    "outgoing",
]
