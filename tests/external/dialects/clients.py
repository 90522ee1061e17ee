"""Tiny reference clients, one per seed dialect, written from the seeds' examples.

Each knows only its seed: how to write a call and a retry, how to read what comes back
(and write it again, so every seed payload can be checked to round-trip), and the retry
loop. Answers come from a `Responder`. Requests go to the URLs of a `Rotor` in turn, so
consecutive rounds of one call land on different server processes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
import anyio.abc
import httpx2
from anyio.streams.text import TextReceiveStream

INSTANCE_HEADER = "x-mrtr-instance"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
MAX_ROUNDS = 10


@dataclass
class Reply:
    """What a server said: `incomplete` (requests to answer, maybe state), `result` or `error`."""

    kind: str
    id: Any
    requests: dict[str, Any] = field(default_factory=dict)
    state: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level members this client does not interpret (the draft's `_meta`), kept for writing back."""


@dataclass
class Responder:
    """Answers a server request by its method: forms by key, one completion for every sampling."""

    forms: dict[str, dict[str, Any]]
    completion: str = "Wear a light jacket."
    model: str = "test-llm"
    asked: list[str] = field(default_factory=list)

    def answer(self, key: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        self.asked.append(key)
        if method == "elicitation/create":
            return {"action": "accept", "content": self.forms[key]}
        if method == "sampling/createMessage":
            text = {"type": "text", "text": self.completion}
            return {"role": "assistant", "content": text, "model": self.model, "stopReason": "endTurn"}
        if method == "roots/list":
            return {"roots": []}
        if method == "ping":
            return {}
        raise AssertionError(f"no answer for {method} ({key})")


class Rotor:
    """POSTs to each base URL in turn; `instances` logs who answered (the test server's header)."""

    def __init__(self, http: httpx2.AsyncClient, bases: list[str]) -> None:
        self.http = http
        self.bases = itertools.cycle(bases)
        self.instances: list[str] = []
        self.last_headers: Mapping[str, str] = {}

    async def post(self, path: str, message: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        url = next(self.bases) + path
        response = await self.http.post(url, json=dict(message), headers={**ACCEPT, **(headers or {})})
        self.instances.append(response.headers.get(INSTANCE_HEADER, "?"))
        self.last_headers = response.headers
        assert response.status_code == 200, (response.status_code, response.text)
        assert response.headers["content-type"].startswith("application/json"), response.headers
        return response.json()


class Pipe:
    """The same `post` over a stdio server process: one JSON-RPC message per line each way."""

    def __init__(self, process: anyio.abc.Process, timeout: float = 10.0) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.lines = TextReceiveStream(process.stdout)
        self.buffer = ""
        self.timeout = timeout
        self.instances: list[str] = []
        self.last_headers: Mapping[str, str] = {}

    async def send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((json.dumps(message) + "\n").encode())

    async def post(self, path: str, message: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        await self.send(message)
        with anyio.fail_after(self.timeout):
            for _ in range(100):  # skip whatever notifications come first, boundedly
                while "\n" not in self.buffer:
                    self.buffer += await self.lines.receive()
                line, self.buffer = self.buffer.split("\n", 1)
                body = json.loads(line)
                if body.get("id") == message["id"] and "method" not in body:
                    self.instances.append("stdio")
                    return body
        raise AssertionError(f"no response to {message['id']}")


class SeedClient:
    """The retry loop every seed shares; subclasses write and read their own wire."""

    path = "/mcp"

    def __init__(self, rotor: Rotor | Pipe) -> None:
        self.rotor = rotor
        self.ids = itertools.count(2)
        self.headers: dict[str, str] = {}

    def call_message(self, request_id: Any, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        params = {"name": name, "arguments": dict(arguments)}
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}

    def retry_message(
        self, request_id: Any, name: str, arguments: Mapping[str, Any], answers: dict[str, Any], state: str | None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, body: Mapping[str, Any]) -> Reply:
        raise NotImplementedError

    def write(self, reply: Reply) -> dict[str, Any]:
        raise NotImplementedError

    def answers(self, reply: Reply, responder: Responder) -> dict[str, Any]:
        return {key: responder.answer(key, r["method"], r.get("params") or {}) for key, r in reply.requests.items()}

    async def call_tool(self, name: str, arguments: Mapping[str, Any], responder: Responder) -> tuple[Reply, int]:
        """Call until the server stops asking; the final reply and the number of requests it took."""
        answers: dict[str, Any] | None = None
        state: str | None = None
        for round_number in range(1, MAX_ROUNDS + 1):
            request_id = next(self.ids)
            if answers is None:
                message = self.call_message(request_id, name, arguments)
            else:
                message = self.retry_message(request_id, name, arguments, answers, state)
            reply = self.read(await self.rotor.post(self.path, message, self.headers))
            assert reply.id == request_id
            if reply.kind != "incomplete":
                return reply, round_number
            answers, state = self.answers(reply, responder), reply.state
        raise AssertionError(f"{name} still incomplete after {MAX_ROUNDS} rounds")

    def initialize_message(self, capabilities: Mapping[str, Any], protocol_version: str) -> dict[str, Any]:
        params = {
            "protocolVersion": protocol_version,
            "capabilities": dict(capabilities),
            "clientInfo": {"name": type(self).__name__, "version": "1.0.0"},
        }
        return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}

    async def initialize(self, capabilities: Mapping[str, Any], protocol_version: str = "2025-11-25") -> Reply:
        """The handshake; a session id the server hands back is sent on every later request."""
        message = self.initialize_message(capabilities, protocol_version)
        body = await self.rotor.post(self.path, message)
        if "mcp-session-id" in self.rotor.last_headers:
            self.headers["mcp-session-id"] = self.rotor.last_headers["mcp-session-id"]
        return _plain(body)


def _plain(body: Mapping[str, Any]) -> Reply:
    if "error" in body:
        return Reply("error", body.get("id"), error=body["error"])
    return Reply("result", body.get("id"), result=body["result"])


def _write_plain(reply: Reply) -> dict[str, Any]:
    member = {"error": reply.error} if reply.kind == "error" else {"result": reply.result}
    return {"jsonrpc": "2.0", "id": reply.id, **member, **reply.extra}


class SketchClient(SeedClient):
    """Seed 000: `dependent_requests` in, `dependent_responses` (each `{"result": ...}`) out."""

    path = "/mcp/sketch"

    def retry_message(
        self, request_id: Any, name: str, arguments: Mapping[str, Any], answers: dict[str, Any], state: str | None
    ) -> dict[str, Any]:
        message = self.call_message(request_id, name, arguments)
        message["dependent_responses"] = {key: {"result": value} for key, value in answers.items()}
        return message

    def read(self, body: Mapping[str, Any]) -> Reply:
        if "dependent_requests" in body:
            return Reply("incomplete", body["id"], requests=dict(body["dependent_requests"]))
        return _plain(body)

    def write(self, reply: Reply) -> dict[str, Any]:
        if reply.kind == "incomplete":
            return {"jsonrpc": "2.0", "id": reply.id, "dependent_requests": reply.requests}
        return _write_plain(reply)


class DraftClient(SeedClient):
    """Seed 001: `input_requests` + `request_state` in; `input_responses` + `request_state` out."""

    path = "/mcp/draft"

    def retry_message(
        self, request_id: Any, name: str, arguments: Mapping[str, Any], answers: dict[str, Any], state: str | None
    ) -> dict[str, Any]:
        message = self.call_message(request_id, name, arguments)
        message["input_responses"] = {key: {"result": value} for key, value in answers.items()}
        if state is not None:
            message["request_state"] = state
        return message

    def read(self, body: Mapping[str, Any]) -> Reply:
        extra = {k: v for k, v in body.items() if k not in ("jsonrpc", "id", "input_requests", "request_state")}
        if "input_requests" in body or "request_state" in body:
            requests = dict(body.get("input_requests") or {})
            return Reply("incomplete", body["id"], requests=requests, state=body.get("request_state"), extra=extra)
        reply = _plain(body)
        reply.extra = {k: v for k, v in extra.items() if k not in ("result", "error")}
        return reply

    def write(self, reply: Reply) -> dict[str, Any]:
        if reply.kind != "incomplete":
            return _write_plain(reply)
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": reply.id}
        if reply.requests:
            body["input_requests"] = reply.requests
        if reply.state is not None:
            body["request_state"] = reply.state
        return {**body, **reply.extra}

    def task_answer_message(self, request_id: Any, answers: dict[str, Any], task_id: str) -> dict[str, Any]:
        """The persistent workflow's step 7: answers for a task, named in `_meta` (no method)."""
        related = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
        responses = {key: {"result": value} for key, value in answers.items()}
        return {"jsonrpc": "2.0", "id": request_id, "input_responses": responses, "_meta": related}


class IncompleteClient(SeedClient):
    """Seed 002 (C#): negotiates `2026-06-XX`; `result_type: "incomplete"`; answers in `params`."""

    VERSION = "2026-06-XX"

    def retry_message(
        self, request_id: Any, name: str, arguments: Mapping[str, Any], answers: dict[str, Any], state: str | None
    ) -> dict[str, Any]:
        message = self.call_message(request_id, name, arguments)
        message["params"]["inputResponses"] = answers
        if state is not None:
            message["params"]["requestState"] = state
        return message

    def read(self, body: Mapping[str, Any]) -> Reply:
        result = body.get("result")
        if isinstance(result, dict) and result.get("result_type") == "incomplete":
            requests = dict(result.get("inputRequests") or {})
            return Reply("incomplete", body["id"], requests=requests, state=result.get("requestState"))
        return _plain(body)

    def write(self, reply: Reply) -> dict[str, Any]:
        if reply.kind != "incomplete":
            return _write_plain(reply)
        result: dict[str, Any] = {"result_type": "incomplete"}
        if reply.requests:
            result["inputRequests"] = reply.requests
        if reply.state is not None:
            result["requestState"] = reply.state
        return {"jsonrpc": "2.0", "id": reply.id, "result": result}

    async def negotiate(self, capabilities: Mapping[str, Any]) -> Reply:
        reply = await self.initialize(capabilities, self.VERSION)
        assert reply.result is not None and reply.result["protocolVersion"] == self.VERSION, reply
        self.headers["mcp-protocol-version"] = self.VERSION
        return reply


class SagaClient(SeedClient):
    """Seed 003: `tools/callSaga`, then `tools/resumeSaga` with the token and every completed step."""

    STEP_METHODS: ClassVar[dict[str, str]] = {
        "elicitation": "elicitation/create",
        "sampling": "sampling/createMessage",
        "roots": "roots/list",
    }

    def __init__(self, rotor: Rotor | Pipe) -> None:
        super().__init__(rotor)
        self.completed: list[dict[str, Any]] = []
        self.ids = (f"client-req-{n}" for n in itertools.count(1))  # type: ignore[assignment]

    def call_message(self, request_id: Any, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        self.completed = []
        params = {"name": name, "arguments": dict(arguments)}
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/callSaga", "params": params}

    def retry_message(
        self, request_id: Any, name: str, arguments: Mapping[str, Any], answers: dict[str, Any], state: str | None
    ) -> dict[str, Any]:
        self.completed += [{"stepId": step_id, "result": result} for step_id, result in answers.items()]
        params = {"sagaToken": state, "completedSteps": list(self.completed)}
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/resumeSaga", "params": params}

    def read(self, body: Mapping[str, Any]) -> Reply:
        result = body.get("result")
        if isinstance(result, dict) and result.get("state") == "suspended":
            requests = {
                step["stepId"]: {"method": self.STEP_METHODS[step["type"]], "params": step["params"]}
                for step in result["steps"]
            }
            return Reply("incomplete", body["id"], requests=requests, state=result["sagaToken"])
        return _plain(body)

    def write(self, reply: Reply) -> dict[str, Any]:
        if reply.kind != "incomplete":
            return _write_plain(reply)
        types = {method: step_type for step_type, method in self.STEP_METHODS.items()}
        steps = [{"type": types[r["method"]], "stepId": k, "params": r["params"]} for k, r in reply.requests.items()]
        result = {"state": "suspended", "sagaToken": reply.state, "steps": steps}
        return {"jsonrpc": "2.0", "id": reply.id, "result": result}
