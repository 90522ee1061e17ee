"""Every JSON payload in the seeds round-trips through its dialect's reference client.

Client-to-server payloads must be exactly what the client writes (given the same answers);
server-to-client payloads must be read and written back unchanged. The fixture files are
the seeds' text verbatim (`tests/external/dialects/fixtures`, each naming its seed and section).
Also here: the server-side rules that need no server (saga step checks, answer unwrapping).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

import mrtr
from mrtr._dialects import draft, draft_tasks, incomplete, saga, sketch
from mrtr._dialects.http import MainEndpoint
from mrtr._dialects.plumbing import DialectError, digest, unwrap_answer
from mrtr._dialects.stdio import DialectMiddleware
from tests.external.dialects.clients import (
    DraftClient,
    IncompleteClient,
    Reply,
    Rotor,
    SagaClient,
    SeedClient,
    SketchClient,
)
from tests.external.dialects.seedjson import load, names

pytestmark = pytest.mark.in_process


class Fixed:
    """Answers each key with the result the seed itself shows for it."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results

    def answer(self, key: str, method: str, params: Any) -> dict[str, Any]:
        return self.results[key]


def client(kind: type[SeedClient]) -> SeedClient:
    return kind(Rotor(httpx2.AsyncClient(), ["http://127.0.0.1:1"]))  # never used to send here


def answers_for(c: SeedClient, reply: Reply, results: dict[str, Any]) -> dict[str, Any]:
    return c.answers(reply, Fixed(results))  # type: ignore[arg-type]


def test_every_seed_payload_is_a_fixture() -> None:
    # 4 (seed 000) + 2 fragments, 4 ephemeral and 11 persistent (seed 001) + 6 derived (002) + 6 (003)
    counts = {prefix: len(names(prefix)) for prefix in ("000", "001", "002", "003")}
    assert counts == {"000": 4, "001": 17, "002": 6, "003": 6}
    for name in names():
        assert isinstance(load(name), dict), name


def test_seed_000_sketch_round_trips() -> None:
    c = client(SketchClient)
    call, incomplete_reply, retry, final = (load(n) for n in names("000"))
    assert c.call_message(2, "get_weather", {"location": "New York"}) == call
    reply = c.read(incomplete_reply)
    assert reply.kind == "incomplete" and set(reply.requests) == {"github_login", "capital_of_france"}
    assert c.write(reply) == incomplete_reply
    results = {key: value["result"] for key, value in retry["dependent_responses"].items()}
    answers = answers_for(c, reply, results)
    assert c.retry_message(3, "get_weather", {"location": "New York"}, answers, reply.state) == retry
    done = c.read(final)
    assert done.kind == "result" and done.result is not None and done.result["isError"] is False
    assert c.write(done) == final


def test_seed_001_draft_ephemeral_round_trips() -> None:
    c = client(DraftClient)
    requests_fragment, responses_fragment = load(names("001-draft-0")[0]), load(names("001-draft-0")[1])
    call, incomplete_reply, retry, final = (load(n) for n in names("001-draft-")[2:])
    assert c.call_message(2, "get_weather", {"location": "New York"}) == call
    reply = c.read(incomplete_reply)
    assert reply.kind == "incomplete" and reply.state == "foo" and set(reply.requests) == {"github_login"}
    assert c.write(reply) == incomplete_reply
    results = {key: value["result"] for key, value in retry["input_responses"].items()}
    assert c.retry_message(3, "get_weather", {"location": "New York"}, answers_for(c, reply, results), "foo") == retry
    assert c.write(c.read(final)) == final
    # The specification's two map fragments: the requests read as a round, the responses as written.
    fragment_reply = c.read({"jsonrpc": "2.0", "id": 0, **requests_fragment})
    assert fragment_reply.requests == requests_fragment["input_requests"]
    results = {key: value["result"] for key, value in responses_fragment["input_responses"].items()}
    rebuilt = c.retry_message(0, "t", {}, answers_for(c, fragment_reply, results), None)
    assert rebuilt["input_responses"] == responses_fragment["input_responses"]


@pytest.mark.parametrize("name", names("001-task-"))
def test_seed_001_persistent_workflow_payloads_round_trip(name: str) -> None:
    """Seed 001's task payloads parse and rebuild here (served: `test_dialect_draft_tasks.py`)."""
    c = client(DraftClient)
    payload = load(name)
    assert isinstance(c, DraftClient)
    if "method" in payload:
        assert c.call_message(payload["id"], "x", {})["jsonrpc"] == payload["jsonrpc"]
        rebuilt = {"jsonrpc": "2.0", "id": payload["id"], "method": payload["method"], "params": payload["params"]}
        assert rebuilt == payload
    elif "input_responses" in payload:
        task_id = payload["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
        results = {key: value["result"] for key, value in payload["input_responses"].items()}
        assert c.task_answer_message(payload["id"], results, task_id) == payload
    else:
        reply = c.read(payload)
        assert reply.kind == ("incomplete" if "input_requests" in payload else "result")
        assert c.write(reply) == payload


def test_seed_002_incomplete_round_trips() -> None:
    c = client(IncompleteClient)
    init, initialized, call, incomplete_reply, retry, multi = (load(n) for n in names("002"))
    assert isinstance(c, IncompleteClient)
    built = c.initialize_message(init["params"]["capabilities"], IncompleteClient.VERSION)
    assert built == {**init, "params": {**init["params"], "clientInfo": built["params"]["clientInfo"]}}
    assert c.write(c.read(initialized)) == initialized
    assert c.call_message(2, "StatelessTool", {}) == call
    reply = c.read(incomplete_reply)
    assert reply.kind == "incomplete" and reply.state == "awaiting-input"
    assert c.write(reply) == incomplete_reply
    results = retry["params"]["inputResponses"]
    answers = answers_for(c, reply, results)
    assert c.retry_message(3, "StatelessTool", {}, answers, reply.state) == retry
    many = c.read(multi)
    assert set(many.requests) == {"confirm", "summarize", "roots"} and many.state == "multi-input"
    assert c.write(many) == multi


def test_seed_003_saga_round_trips() -> None:
    c = client(SagaClient)
    call, first, resume_1, second, resume_2, final = (load(n) for n in names("003"))
    assert c.call_message("client-req-1", "complex_tool", {"initial_arg": "value"}) == call
    reply = c.read(first)
    assert reply.kind == "incomplete" and reply.state == "opaque-server-state-token-v1"
    assert c.write(reply) == first
    steps = {s["stepId"]: s["result"] for s in resume_2["params"]["completedSteps"]}
    assert c.retry_message("client-req-2", "", {}, answers_for(c, reply, steps), reply.state) == resume_1
    reply = c.read(second)
    assert c.write(reply) == second
    # Every completed step is resent: the client keeps them all.
    assert c.retry_message("client-req-3", "", {}, answers_for(c, reply, steps), reply.state) == resume_2
    assert c.write(c.read(final)) == final


# -- the server's side of the same payloads, without a server --------------------------------------


def test_sketch_reads_the_seeds_retry_and_finds_no_state() -> None:
    answers, state = sketch.incoming(load("000-sketch-3-retry.json5"))
    assert state is None
    assert answers["github_login"] == {"action": "accept", "content": {"name": "octocat"}}
    assert answers["capital_of_france"]["model"] == "claude-3-sonnet-20240307"
    out = sketch.outgoing(7, {"inputRequests": {"k": {"method": "ping"}}, "requestState": "SEALED"})
    assert out["dependent_requests"] == {"k": {"method": "ping"}, "mrtr/state:SEALED": {"method": "ping"}}
    answers, state = sketch.incoming({"dependent_responses": {"mrtr/state:SEALED": {"result": {}}}})
    assert (answers, state) == ({}, "SEALED")


def test_draft_and_incomplete_read_the_seeds_retries() -> None:
    answers, state = draft.incoming(load("001-draft-3-retry.json5"))
    assert state == "foo" and answers == {"github_login": {"action": "accept", "content": {"name": "octocat"}}}
    answers, state = incomplete.incoming(load("002-incomplete-5-retry.json5"))
    assert state == "awaiting-input" and answers["user_input"]["content"] == {"answer": "deploy"}
    with pytest.raises(DialectError):
        draft.incoming({"input_responses": ["not", "a", "map"]})


def test_unwrap_is_lenient_about_wrapping_and_drops_errors() -> None:
    assert unwrap_answer({"result": {"action": "accept"}}) == {"action": "accept"}
    assert unwrap_answer({"action": "accept"}) == {"action": "accept"}
    assert unwrap_answer({"error": {"code": 1, "message": "no"}}) is None
    assert unwrap_answer("nonsense") is None


def test_saga_steps_changed_past_answer_refused_unasked_ignored() -> None:
    steps = load("003-saga-5-resume-all-steps.json5")["params"]["completedSteps"]
    elicitation, sampling = steps
    done = {"step-elicitation-A": digest({"result": elicitation["result"]})}
    answers, marks = saga.check_steps(steps, {"step-sampling-B": "sampling"}, done)
    assert answers == {"step-sampling-B": sampling["result"]} and set(marks) == {"step-sampling-B"}
    changed = [{**elicitation, "result": {"action": "accept", "content": {"target": "staging"}}}, sampling]
    with pytest.raises(DialectError) as refused:
        saga.check_steps(changed, {"step-sampling-B": "sampling"}, done)
    assert refused.value.error.data == {"reason": "completed_step_changed"}
    answers, _ = saga.check_steps([*steps, {"stepId": "never-asked", "result": {}}], {}, done)
    assert answers == {}, "a step nobody asked is not an answer"
    declined, _ = saga.check_steps(
        [{"stepId": "e", "error": {"code": -1, "message": "rejected"}}], {"e": "elicitation"}, {}
    )
    assert declined == {"e": {"action": "decline"}}
    with pytest.raises(DialectError):
        saga.check_steps({"not": "a list"}, {}, {})


# -- opt-in: a dialect that is off does not exist ---------------------------------------------------------


def _app(dialects: list[str]) -> tuple[Any, Any]:
    server = MCPServer("weather", request_state_security=RequestStateSecurity(keys=[b"k" * 32]))
    flows = mrtr.Flows(server, dialects=dialects)
    return server, flows.streamable_http_app()


def _routes(app: Any) -> dict[str, Any]:
    return {route.path: route.app for route in app.router.routes if hasattr(route, "path")}


def test_no_dialects_installs_nothing() -> None:
    server, app = _app([])
    routes = _routes(app)
    assert "/mcp/sketch" not in routes and "/mcp/draft" not in routes
    assert not isinstance(routes["/mcp"], MainEndpoint), "the SDK's /mcp, untouched"
    assert not any(isinstance(m, DialectMiddleware) for m in server.middleware)


def test_only_the_enabled_dialects_are_recognised() -> None:
    server, app = _app(["saga"])
    routes = _routes(app)
    assert "/mcp/sketch" not in routes and "/mcp/draft" not in routes
    main = routes["/mcp"]
    assert isinstance(main, MainEndpoint) and main.incomplete is None and not main.declared
    sketch_declared = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    sketch_declared += b'"capabilities":{"experimental":{"mrtr/dialect":{"name":"sketch"}}},"clientInfo":{}}}'
    assert main._recognise(sketch_declared) == (None, False), "a disabled dialect's declaration is ignored"
    assert main._recognise(b"{'method': 'tools/callSaga'}") == (None, False), "not JSON: the SDK answers it"
    saga_call = json.dumps(load("003-saga-1-call-saga.json5")).encode()
    assert main._recognise(saga_call) == (None, True)
    assert [type(m) for m in server.middleware].count(DialectMiddleware) == 1

    _, app = _app(["sketch", "draft", "incomplete", "saga"])
    routes = _routes(app)
    assert {"/mcp/sketch", "/mcp/draft"} <= set(routes)
    main = routes["/mcp"]
    assert main._recognise(sketch_declared)[1] is True
    ordinary = sketch_declared.replace(b'"mrtr/dialect"', b'"something/else"')
    assert main._recognise(ordinary) == (None, False), "a client that asked for nothing is not captured"


def test_unknown_dialect_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown dialect"):
        _app(["sketch", "sse"])


def test_draft_recognises_seed_001_task_messages() -> None:
    """Which draft messages are the persistent workflow's (the rest are rounds or pass through)."""
    task_payloads = [load(n) for n in names("001-task-") if "method" in load(n) or "input_responses" in load(n)]
    assert len(task_payloads) == 6 and all(draft_tasks.handles(p) for p in task_payloads)
    assert not any(draft_tasks.handles(load(n)) for n in names("001-draft-"))
    assert not draft_tasks.handles({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "x", "task": 1}})
    created = {"taskId": "t", "status": "working", "createdAt": "c", "ttlMs": None, "pollIntervalMs": 100}
    assert draft_tasks.seed_task(created, "made") == {
        "taskId": "t",
        "status": "working",
        "statusMessage": "made",
        "createdAt": "c",
        "ttl": None,
        "pollInterval": 100,
    }
    assert set(draft_tasks.seed_task(created)) == set(load("001-task-02-created.json5")["result"]["task"])
