"""Seed 003, the saga: `tools/callSaga` starts, `tools/resumeSaga` continues, `sagaToken` carries it all.

A resume names no tool, so the token is the whole flow: the tool, its arguments, the
sealed journal the SDK's boundary minted (`requestState`, still bound to `tools/call`, the
tool, its arguments, the audience and the principal, and re-verified on every resume),
the steps asked in the last turn and a fingerprint of every step result already accepted.
It is sealed with the server's own `RequestStateSecurity` codec, like `requestState`.

Clients resend every completed step on each resume. Only steps asked in the last turn are
new answers; a step the journal already holds must come back exactly as first given, or
the resume is refused (-32602, `completed_step_changed`): a past answer is never silently
replaced, nor silently ignored when it changed. Steps nobody asked are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, cast

from mrtr._dialects.plumbing import (
    Caller,
    Gateway,
    Origin,
    digest,
    invalid,
    is_input_required,
    modern_params,
    plain_result,
    seal,
    unseal,
)
from mrtr._wire import InputRequests, InputResponses, JSONObject

NAME = "saga"
CALL = "tools/callSaga"
RESUME = "tools/resumeSaga"
METHODS = frozenset({CALL, RESUME})
TOKEN_KIND = "mrtr/saga"
STEP_TYPES = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""Saga step types by the server request they stand for (`roots` is mrtr's addition)."""
CAPABILITIES: JSONObject = {"elicitation": {"form": {}}, "sampling": {}}
"""What a saga client answers: the two step types the seed defines."""


class SagaStep(TypedDict):
    """One step a suspended saga asks the client to complete: a server request, by step type."""

    type: str
    """`elicitation`, `sampling` or `roots` (`STEP_TYPES`; another method as it is named)."""
    stepId: str
    params: JSONObject


class SuspendedSaga(TypedDict):
    """The result of a saga call that needs input: its steps, and the token to resume it with."""

    state: Literal["suspended"]
    sagaToken: str
    steps: list[SagaStep]


class SagaClaims(TypedDict):
    """What a saga token seals besides `plumbing.seal`'s own claims: the call, and the steps
    asked and done so far (step id -> type, step id -> fingerprint of its result)."""

    t: str
    args: JSONObject
    rs: str | None
    """The flow's `requestState`."""
    asked: dict[str, str]
    done: dict[str, str]


async def handle(
    gateway: Gateway, origin: Origin, request_id: Any, method: str, params: Mapping[str, Any], caller: Caller
) -> SuspendedSaga | JSONObject:
    """Serve `tools/callSaga` or `tools/resumeSaga`; the JSON-RPC `result` (suspended or final)."""
    security, audience = gateway.security, gateway.audience
    answers: InputResponses = {}
    accepted: dict[str, str] = {}
    done: dict[str, str] = {}
    if method == CALL:
        name, arguments = _call_params(params)
        state: str | None = None
    else:
        claims = unseal(security, TOKEN_KIND, audience, params.get("sagaToken"))
        token_name, token_args, token_state = claims.get("t"), claims.get("args"), claims.get("rs")
        token_asked, token_done = claims.get("asked"), claims.get("done")
        if not (isinstance(token_name, str) and isinstance(token_args, dict) and isinstance(token_state, str | None)):
            raise invalid("Invalid or expired mrtr/saga token", "invalid_mrtr_saga_token")
        if not (isinstance(token_asked, dict) and isinstance(token_done, dict)):
            raise invalid("Invalid or expired mrtr/saga token", "invalid_mrtr_saga_token")
        name, arguments, state = token_name, token_args, token_state
        done = dict(token_done)
        answers, accepted = check_steps(params.get("completedSteps"), token_asked, done)
    call = {"name": name, "arguments": arguments}
    result = await gateway.call(
        origin, request_id, "tools/call", modern_params(call, answers, state, caller), dialect=NAME
    )
    if not is_input_required(result):
        return plain_result(result)
    pending: InputRequests = dict(result.get("inputRequests") or {})
    done.update({step_id: mark for step_id, mark in accepted.items() if step_id not in pending})
    steps = [_step(step_id, ask) for step_id, ask in pending.items()]
    asked = {step["stepId"]: step["type"] for step in steps}
    sealed: SagaClaims = {"t": name, "args": arguments, "rs": result.get("requestState"), "asked": asked, "done": done}
    return {"state": "suspended", "sagaToken": seal(security, TOKEN_KIND, audience, sealed), "steps": steps}


def _call_params(params: Mapping[str, Any]) -> tuple[str, JSONObject]:
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or not name:
        raise invalid("tools/callSaga needs params.name, the tool to call", "missing_tool_name")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise invalid("tools/callSaga params.arguments must be an object", "malformed_arguments")
    return name, cast(JSONObject, arguments)


def check_steps(
    completed: object, asked: Mapping[str, str], done: Mapping[str, str]
) -> tuple[InputResponses, dict[str, str]]:
    """New answers (to steps asked last turn) and their fingerprints; refuses a changed past step."""
    if completed is None:
        completed = []
    if not isinstance(completed, list):
        raise invalid("completedSteps must be an array of SagaStepResult", "malformed_completed_steps")
    answers: InputResponses = {}
    fingerprints: dict[str, str] = {}
    for entry in completed:
        if not isinstance(entry, dict) or not isinstance(entry.get("stepId"), str):
            raise invalid("every completed step needs a string stepId", "malformed_completed_steps")
        entry = cast(JSONObject, entry)
        step_id: str = entry["stepId"]
        mark = digest({k: entry[k] for k in ("result", "error") if k in entry})
        if step_id in done:
            if done[step_id] != mark:
                raise invalid(
                    f"completed step {step_id!r} differs from the result already given for it; "
                    "a past step cannot change (start a new saga to answer differently)",
                    "completed_step_changed",
                )
            continue
        if step_id not in asked:
            continue  # answers only to questions asked
        answer = _answer(asked[step_id], entry)
        if answer is not None:
            answers[step_id], fingerprints[step_id] = answer, mark
    return answers, fingerprints


def _answer(step_type: str, entry: Mapping[str, Any]) -> Any | None:
    """A step result as an input response; an elicitation step that failed reads as a decline."""
    result = entry.get("result")
    if isinstance(result, dict):
        return result
    if "error" in entry and step_type == "elicitation":
        return {"action": "decline"}
    return None  # nothing usable: the step is asked again


def _step(step_id: str, ask: Mapping[str, Any]) -> SagaStep:
    method = ask.get("method", "")
    step_type = STEP_TYPES.get(method, method)
    return {"type": step_type, "stepId": step_id, "params": dict(ask.get("params") or {})}


__all__ = [
    "CALL",
    "CAPABILITIES",
    "METHODS",
    "NAME",
    "RESUME",
    "STEP_TYPES",
    "TOKEN_KIND",
    "SagaClaims",
    "SagaStep",
    "SuspendedSaga",
    "check_steps",
    "handle",
]
