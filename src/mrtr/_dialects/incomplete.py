"""Seed 002, the C# reference: `result_type: "incomplete"`, negotiated by protocol version.

A client opts in by naming the experimental version `2026-06-XX` in `initialize` (the
server answers with that version) and then sends it as `MCP-Protocol-Version` on every
request, as the C# client does in stateless mode. The result is an ordinary JSON-RPC
`result` discriminated by `result_type`; retries carry `inputResponses` and
`requestState` in `params`, as on every `RequestParams` in the C# SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from mcp_types import RequestId

from mrtr._dialects.plumbing import invalid, unwrap_answer
from mrtr._wire import InputRequests, InputResponses

NAME = "incomplete"
VERSION = "2026-06-XX"
"""The experimental protocol version the C# SDK negotiates MRTR with."""


class IncompleteResult(TypedDict):
    """The `2026-06-XX` result of a round that needs input."""

    result_type: Literal["incomplete"]
    inputRequests: NotRequired[InputRequests]
    requestState: NotRequired[str]


class IncompleteReply(TypedDict):
    """`IncompleteResult` as a JSON-RPC response."""

    jsonrpc: Literal["2.0"]
    id: RequestId
    result: IncompleteResult


def incoming(message: Mapping[str, Any]) -> tuple[InputResponses, str | None]:
    params = message.get("params") or {}
    responses = params.get("inputResponses", params.get("input_responses"))
    state = params.get("requestState", params.get("request_state"))
    if state is not None and not isinstance(state, str):
        raise invalid("requestState must be the string the server sent", "malformed_request_state")
    if responses is None:
        return {}, state
    if not isinstance(responses, dict):
        raise invalid("inputResponses must be an object keyed like inputRequests", "malformed_answers")
    # Lenient: an InputResponse may be the bare result or wrapped as {"result": ...}.
    answers = {key: answer for key, value in responses.items() if (answer := unwrap_answer(value)) is not None}
    return answers, state


def outgoing(request_id: Any, result: Mapping[str, Any]) -> IncompleteReply:
    return {"jsonrpc": "2.0", "id": request_id, "result": outgoing_result(result)}


def outgoing_result(result: Mapping[str, Any]) -> IncompleteResult:
    """The JSON-RPC `result` of `outgoing`'s response: the incomplete result itself."""
    incomplete: IncompleteResult = {"result_type": "incomplete"}
    if result.get("inputRequests"):
        incomplete["inputRequests"] = dict(result["inputRequests"])
    if result.get("requestState"):
        incomplete["requestState"] = result["requestState"]
    return incomplete


__all__ = [
    "NAME",
    "VERSION",
    "IncompleteReply",
    "IncompleteResult",
    "incoming",
    "outgoing",
    "outgoing_result",
]
