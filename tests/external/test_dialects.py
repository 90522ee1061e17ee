"""The seed dialects against real server processes: one flow, five wires, two instances.

A and B share a key (one fleet), C has its own. Every round of a call goes to the other
process than the round before, so nothing but the client's message (and the key) carries
the flow from one round to the next; the shared audit log proves the step ran once.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from tests.external.dialects.clients import (
    ACCEPT,
    INSTANCE_HEADER,
    DraftClient,
    IncompleteClient,
    Pipe,
    Reply,
    Responder,
    Rotor,
    SagaClient,
    SeedClient,
    SketchClient,
)
from tests.external.dialects.seedjson import load
from tests.support.servers import ServerSpec, audit_entries, new_key, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = Path(__file__).parent / "dialects" / "server.py"
READY = "dialect-server ready:"
TIMEOUT = 30.0
CAPABILITIES = {"elicitation": {}, "sampling": {}}
FORMS = {"github_login": {"name": "octocat"}, "confirm": {"send": True}}


@dataclass
class Fleet:
    bases: dict[str, str]
    audit: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("dialects")
    audit = workdir / "audit.log"
    key = new_key()
    specs = [
        ServerSpec(label, {"MRTR_STATE_KEY": k, "MRTR_INSTANCE": label, "MRTR_AUDIT": str(audit)}, SERVER, READY)
        for label, k in (("A", key), ("B", key), ("C", new_key()))
    ]
    with spawn_servers(specs, workdir) as servers:
        yield Fleet({label: s.url.removesuffix("/mcp") for label, s in servers.items()}, audit)
        for server in servers.values():
            assert server.process.poll() is None, f"server {server.label} died:\n{server.log()}"
            assert "Traceback" not in server.log(), server.log()


@asynccontextmanager
async def rotor(fleet: Fleet, *labels: str) -> AsyncIterator[Rotor]:
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        yield Rotor(http, [fleet.bases[label] for label in labels])


def flow_id(text: str) -> str:
    match = re.search(r"\[flow (\S+)\]", text)
    assert match, text
    return match.group(1)


def text_of(reply: Reply) -> str:
    assert reply.kind == "result" and reply.result is not None, reply
    assert reply.result.get("isError") is not True, reply.result
    return str(reply.result["content"][0]["text"])


def without_titles(value: Any) -> Any:
    """pydantic names every schema property (`title`); the seeds' hand-written schemas do not."""
    if isinstance(value, dict):
        return {k: without_titles(v) for k, v in value.items() if k != "title"}
    if isinstance(value, list):
        return [without_titles(v) for v in value]
    return value


async def post(http: httpx2.AsyncClient, url: str, message: Any, headers: dict[str, str] | None = None) -> Any:
    response = await http.post(url, json=message, headers={**ACCEPT, **(headers or {})})
    assert response.status_code == 200, response.text
    return response.json()


# -- one flow, five dialects, two processes ------------------------------------------------------------


async def _seed_client(kind: str, r: Rotor) -> SeedClient:
    if kind == "sketch":
        c: SeedClient = SketchClient(r)
        await c.initialize(CAPABILITIES)
    elif kind == "draft":
        c = DraftClient(r)
        await c.initialize(CAPABILITIES)
    elif kind == "incomplete":
        c = IncompleteClient(r)
        await c.negotiate(CAPABILITIES)  # type: ignore[attr-defined]
    else:
        c = SagaClient(r)  # the saga has no handshake of its own: its methods say it all
    return c


@pytest.mark.parametrize("kind", ["sketch", "draft", "incomplete", "saga"])
async def test_one_flow_runs_unchanged_under_each_seed_dialect_across_two_processes(fleet: Fleet, kind: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with rotor(fleet, "A", "B") as r:
            c = await _seed_client(kind, r)
            first = len(r.instances)
            responder = Responder(FORMS)
            reply, rounds = await c.call_tool("forecast", {"location": "Lisbon"}, responder)
    text = text_of(reply)
    assert text.startswith("octocat: 72F and partly cloudy in Lisbon. Wear a light jacket.")
    assert rounds == 4, "ask login, then step + sample, then confirm, then the result"
    served = r.instances[first:]
    assert served in (["A", "B", "A", "B"], ["B", "A", "B", "A"]), served
    assert [k for k in responder.asked if not k.startswith("mrtr/")] == ["github_login", "what_to_wear", "confirm"]
    steps = audit_entries(fleet.audit, flow_id(text))
    assert len(steps) == 1, f"the step must run exactly once across both processes: {steps}"


async def _refuse(context: ClientRequestContext, params: Any = None) -> Any:
    raise AssertionError("rounds are driven by hand")


async def test_the_same_flow_under_2026_07_28_with_the_official_client(fleet: Fleet) -> None:
    """The approved dialect, on the same servers (dialects enabled), through `mcp.Client`."""
    responder = Responder(FORMS)
    served: list[str] = []

    async def on_response(response: httpx2.Response) -> None:
        if b'"tools/call"' in response.request.content:  # not the clients' own housekeeping
            served.append(response.headers.get(INSTANCE_HEADER, "?"))

    with anyio.fail_after(TIMEOUT):
        async with (
            httpx2.AsyncClient(trust_env=False, timeout=20.0, event_hooks={"response": [on_response]}) as http,
            Client(
                streamable_http_client(fleet.bases["A"] + "/mcp", http_client=http),
                elicitation_callback=_refuse,
                sampling_callback=_refuse,
            ) as a,
            Client(
                streamable_http_client(fleet.bases["B"] + "/mcp", http_client=http),
                elicitation_callback=_refuse,
                sampling_callback=_refuse,
            ) as b,
        ):
            assert a.protocol_version == "2026-07-28"
            served.clear()
            answers: dict[str, Any] | None = None
            state: str | None = None
            for round_number in range(10):
                peer = (a, b)[round_number % 2]
                result = await peer.session.call_tool(
                    "forecast", {"location": "Lisbon"}, input_responses=answers, request_state=state,
                    allow_input_required=True,
                )  # fmt: skip
                if not isinstance(result, t.InputRequiredResult):
                    break
                asked = result.input_requests or {}
                answers = {
                    key: (
                        t.ElicitResult if req.method == "elicitation/create" else t.CreateMessageResult
                    ).model_validate(responder.answer(key, req.method, {}))
                    for key, req in asked.items()
                }
                state = result.request_state
            rounds_served = list(served)  # before the clients close (which is a request too)
    assert isinstance(result, t.CallToolResult) and not result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("octocat: 72F and partly cloudy in Lisbon. Wear a light jacket.")
    assert rounds_served == ["A", "B", "A", "B"]
    assert len(audit_entries(fleet.audit, flow_id(text))) == 1


# -- the seeds' own examples, sent as printed ----------------------------------------------------------


async def test_seed_000_example_is_served_in_the_seeds_shape(fleet: Fleet) -> None:
    call, asked, retry, final = (load(f"000-sketch-{n}") for n in ("1-call.json5", "2-dependent-requests.json5",
                                                                   "3-retry.json5", "4-result.json5"))  # fmt: skip
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        body = await post(http, fleet.bases["A"] + "/mcp/sketch", call)
        assert set(body) == {"jsonrpc", "id", "dependent_requests"} and body["id"] == call["id"]
        requests = body["dependent_requests"]
        state_keys = [k for k in requests if k.startswith("mrtr/state:")]
        assert len(state_keys) == 1 and requests[state_keys[0]] == {"method": "ping"}
        for key in ("github_login", "capital_of_france"):
            assert without_titles(requests[key]) == asked["dependent_requests"][key], key
        # The seed's retry, plus the echoed state key (every client echoes every key), on the other process.
        echoed = {**retry, "dependent_responses": {**retry["dependent_responses"], state_keys[0]: {"result": {}}}}
        done = await post(http, fleet.bases["B"] + "/mcp/sketch", echoed)
        assert done == {**final, "id": retry["id"]}, "the seed's own final result, byte for byte"
        # A tampered journal key is refused by the SDK's boundary, like a tampered requestState.
        token = state_keys[0].removeprefix("mrtr/state:")
        forged_key = "mrtr/state:" + token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        forged = {**retry, "dependent_responses": {**retry["dependent_responses"], forged_key: {"result": {}}}}
        refused = await post(http, fleet.bases["A"] + "/mcp/sketch", forged)
        assert refused["error"]["code"] == -32602 and refused["error"]["data"] == {"reason": "invalid_request_state"}
        # The seed's retry exactly as printed has no state: its answers answer nothing this server asked.
        again = await post(http, fleet.bases["B"] + "/mcp/sketch", retry)
        assert "github_login" in again["dependent_requests"], "unasked answers are not used: asked again"


async def test_seed_001_example_is_served_in_the_seeds_shape_and_its_foo_state_is_refused(fleet: Fleet) -> None:
    call, asked, retry = (load(f"001-draft-{n}") for n in ("1-call.json5", "2-input-requests.json5", "3-retry.json5"))
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        body = await post(http, fleet.bases["A"] + "/mcp/draft", call)
        assert set(body) == {"jsonrpc", "id", "input_requests", "request_state"}
        assert without_titles(body["input_requests"]["github_login"]) == asked["input_requests"]["github_login"]
        assert body["request_state"].startswith("v1.")  # sealed by the SDK codec, not "foo"
        refused = await post(http, fleet.bases["B"] + "/mcp/draft", retry)
        assert refused["error"]["code"] == -32602 and refused["error"]["data"] == {"reason": "invalid_request_state"}
        # A real state, replayed onto other arguments, is refused too (bound like requestState).
        moved = {**retry, "params": {"name": "get_weather", "arguments": {"location": "Paris"}}}
        moved["request_state"] = body["request_state"]
        refused = await post(http, fleet.bases["B"] + "/mcp/draft", moved)
        assert refused["error"]["code"] == -32602


async def test_seed_002_negotiation_and_no_capture_of_ordinary_clients(fleet: Fleet) -> None:
    init, initialized = load("002-incomplete-1-initialize.json5"), load("002-incomplete-2-initialized.json5")
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        body = await post(http, fleet.bases["A"] + "/mcp", init)
        assert body["result"]["protocolVersion"] == initialized["result"]["protocolVersion"] == "2026-06-XX"
        # The call, on the other process, as the C# client sends it: the result has the fixture's shape.
        call = load("002-incomplete-3-call.json5")
        call["params"] = {"name": "forecast", "arguments": {"location": "Bern"}}
        body = await post(http, fleet.bases["B"] + "/mcp", call, {"mcp-protocol-version": "2026-06-XX"})
        expected = load("002-incomplete-4-incomplete.json5")["result"]
        assert set(body["result"]) == set(expected) and body["result"]["result_type"] == "incomplete"
        assert body["result"]["inputRequests"]["github_login"]["method"] == "elicitation/create"
        # The answer wrapped the draft's way ({"result": ...}) is accepted too (the seed does not say).
        call["id"] = 3
        call["params"] |= {
            "inputResponses": {"github_login": {"result": {"action": "accept", "content": {"name": "octocat"}}}},
            "requestState": body["result"]["requestState"],
        }
        body = await post(http, fleet.bases["A"] + "/mcp", call, {"mcp-protocol-version": "2026-06-XX"})
        assert set(body["result"]["inputRequests"]) == {"what_to_wear"}, "the login was used, the flow moved on"
        ordinary = {**init, "params": {**init["params"], "protocolVersion": "2025-11-25"}}
        response = await http.post(fleet.bases["A"] + "/mcp", json=ordinary, headers=ACCEPT)
        assert response.status_code == 200
        assert not response.headers.get("mcp-session-id", "").startswith("mrtr-dialect.")
        text = response.text
        payload = json.loads(text[text.index("{") :].splitlines()[0]) if "data:" in text else response.json()
        assert payload["result"]["protocolVersion"] == "2025-11-25", "a client that asked for nothing gets the SDK"


async def test_seed_003_example_runs_as_printed_and_a_changed_past_step_is_refused(fleet: Fleet) -> None:
    call, first, resume_1, second, resume_2, final = (
        load(f"003-saga-{n}.json5")
        for n in ("1-call-saga", "2-suspended-elicitation", "3-resume-elicitation", "4-suspended-sampling",
                  "5-resume-all-steps", "6-result")
    )  # fmt: skip
    main = {label: base + "/mcp" for label, base in fleet.bases.items()}

    def shape(result: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**s, "params": without_titles({k: v for k, v in s["params"].items() if k != "mode"})} for s in
                result["steps"]]  # fmt: skip

    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        body = await post(http, main["A"], call)
        assert body["result"]["state"] == "suspended" and shape(body["result"]) == first["result"]["steps"]
        token_1 = body["result"]["sagaToken"]
        body = await post(http, main["B"], {**resume_1, "params": {**resume_1["params"], "sagaToken": token_1}})
        assert shape(body["result"]) == second["result"]["steps"]
        token_2 = body["result"]["sagaToken"]
        # A changed past step is refused, not silently used or ignored.
        changed = json.loads(json.dumps(resume_2))
        changed["params"]["sagaToken"] = token_2
        changed["params"]["completedSteps"][0]["result"]["content"]["target"] = "staging"
        refused = await post(http, main["A"], changed)
        assert refused["error"]["data"] == {"reason": "completed_step_changed"}
        # The seed's own opaque token, and a token of another deployment (C), are refused.
        refused = await post(http, main["A"], resume_2)
        assert refused["error"]["code"] == -32602 and refused["error"]["data"]["reason"] == "invalid_mrtr_saga_token"
        foreign = (await post(http, main["C"], call))["result"]["sagaToken"]
        refused = await post(http, main["A"], {**resume_1, "params": {**resume_1["params"], "sagaToken": foreign}})
        assert refused["error"]["code"] == -32602
        done = await post(http, main["A"], {**resume_2, "params": {**resume_2["params"], "sagaToken": token_2}})
        assert done["result"]["content"] == final["result"]["content"], "the seed's own final result"
        assert done["result"]["isError"] is False  # CallToolResult as the SDK writes it (seed 000's shows it too)


async def test_a_client_may_declare_sketch_on_the_main_endpoint(fleet: Fleet) -> None:
    async with rotor(fleet, "A", "B") as r:
        c = SketchClient(r)
        c.path = "/mcp"
        reply = await c.initialize({**CAPABILITIES, "experimental": {"mrtr/dialect": {"name": "sketch"}}})
        assert reply.kind == "result" and c.headers["mcp-session-id"].startswith("mrtr-dialect.")
        final, rounds = await c.call_tool("forecast", {"location": "Oslo"}, Responder(FORMS))
    assert rounds == 4 and "Oslo" in text_of(final)


async def test_foreign_or_forged_session_tokens_are_refused(fleet: Fleet) -> None:
    async with rotor(fleet, "C") as r:
        c = SketchClient(r)
        await c.initialize(CAPABILITIES)
        foreign = c.headers["mcp-session-id"]
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        for token in (foreign, "mrtr-dialect.v1.forged"):
            call = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
            response = await http.post(fleet.bases["A"] + "/mcp/sketch", json=call,
                                       headers={**ACCEPT, "mcp-session-id": token})  # fmt: skip
            assert response.status_code == 404 and response.json()["error"]["code"] == -32600


async def test_without_capabilities_a_question_is_a_missing_capability(fleet: Fleet) -> None:
    async with rotor(fleet, "A") as r:
        c = DraftClient(r)
        await c.initialize({"sampling": {}})  # no elicitation declared
        reply, _ = await c.call_tool("forecast", {"location": "Rome"}, Responder(FORMS))
    assert reply.kind == "error" and reply.error is not None and reply.error["code"] == -32021


async def test_bad_bodies_get_precise_json_rpc_errors(fleet: Fleet) -> None:
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        url = fleet.bases["A"] + "/mcp/draft"
        response = await http.post(url, content=b"{nope", headers=ACCEPT)
        assert response.status_code == 400 and response.json()["error"]["code"] == -32700
        response = await http.post(url, json=[1, 2], headers=ACCEPT)
        assert response.status_code == 400 and response.json()["error"]["code"] == -32600
        bad = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "forecast"}, "input_responses": 3}
        body = await post(http, url, bad)
        assert body["error"]["code"] == -32602
        saga_bad = {"jsonrpc": "2.0", "id": 1, "method": "tools/resumeSaga", "params": {"completedSteps": []}}
        body = await post(http, fleet.bases["A"] + "/mcp", saga_bad)
        assert body["error"]["code"] == -32602
        response = await http.get(url, headers=ACCEPT)
        assert response.status_code == 405


# -- stdio: the two JSON-RPC-shaped dialects -------------------------------------------------------------


@asynccontextmanager
async def stdio_server(fleet: Fleet) -> AsyncIterator[Pipe]:
    env = {**os.environ, "MRTR_STATE_KEY": new_key(), "MRTR_INSTANCE": "stdio", "MRTR_AUDIT": str(fleet.audit)}
    log = fleet.audit.with_name("stdio-server.log")
    with log.open("ab") as stderr:
        process = await anyio.open_process([sys.executable, str(SERVER), "--stdio"], env=env, stderr=stderr)
    try:
        yield Pipe(process)
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")
    finally:
        assert process.stdin is not None
        await process.stdin.aclose()
        with anyio.move_on_after(5):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize("kind", ["incomplete", "saga"])
async def test_saga_and_incomplete_run_the_flow_over_stdio(fleet: Fleet, kind: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with stdio_server(fleet) as pipe:
            c: SeedClient = IncompleteClient(pipe) if kind == "incomplete" else SagaClient(pipe)
            reply = await c.initialize(CAPABILITIES, IncompleteClient.VERSION if kind == "incomplete" else "2025-11-25")
            assert reply.result is not None
            await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            if kind == "incomplete":
                assert reply.result["protocolVersion"] == IncompleteClient.VERSION
            final, rounds = await c.call_tool("forecast", {"location": "Kyoto"}, Responder(FORMS))
    text = text_of(final)
    assert rounds == 4 and "Kyoto" in text
    assert len(audit_entries(fleet.audit, flow_id(text))) == 1
