"""Seed 001's persistent workflow (#T1-#T12) against two real server processes.

A and B share a state key and one SQLite task store; each step of the seed's example goes to
the other process than the step before. Every request is the seed's own payload (only its
task id replaced by the one the server made); every answer is compared to the seed's by
structure (same keys and value types; ids, timestamps and the server's ttl may differ). The
shared audit log proves each step of the task ran once; a second principal (bearer tokens)
gets exactly the error an unknown task id gets.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.external.dialects.clients import ACCEPT, INSTANCE_HEADER
from tests.external.dialects.seedjson import load
from tests.support.servers import ServerSpec, new_key, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = Path(__file__).parent / "dialects" / "server.py"
READY = "dialect-server ready:"
SEED_TASK_ID = "echo_dc792e24-01b5-4c0a-abcb-0559848ca3c5"
ALICE = {"authorization": "Bearer tok-alice"}
BOB = {"authorization": "Bearer tok-bob"}
RELATED = "io.modelcontextprotocol/related-task"


@dataclass
class Fleet:
    urls: list[str]
    audit: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("draft-tasks")
    audit = workdir / "audit.log"
    key = new_key()
    env = {
        "MRTR_STATE_KEY": key,
        "MRTR_AUDIT": str(audit),
        "MRTR_STORE": f"sqlite:///{workdir / 'tasks.db'}",
        "MRTR_TOKENS": "alice=tok-alice,bob=tok-bob",
    }
    specs = [ServerSpec(label, {**env, "MRTR_INSTANCE": label}, SERVER, READY) for label in ("A", "B")]
    with spawn_servers(specs, workdir) as servers:
        yield Fleet([servers[label].url + "/draft" for label in ("A", "B")], audit)
        for server in servers.values():
            assert server.process.poll() is None, f"server {server.label} died:\n{server.log()}"
            assert "Traceback" not in server.log(), server.log()


class Alternating:
    """Sends each message to the other instance than the one before (and checks who answered)."""

    def __init__(self, http: httpx2.AsyncClient, urls: list[str]) -> None:
        self.http = http
        self.urls = urls
        self.turn = 0
        self.answered_by: list[str] = []

    async def send(self, message: Any, headers: dict[str, str] = ALICE) -> Any:
        url = self.urls[self.turn % len(self.urls)]
        self.turn += 1
        response = await self.http.post(url, json=message, headers={**ACCEPT, **headers})
        assert response.status_code == 200, response.text
        self.answered_by.append(response.headers[INSTANCE_HEADER])
        return response.json()


@asynccontextmanager
async def alternating(fleet: Fleet) -> AsyncIterator[Alternating]:
    async with httpx2.AsyncClient(trust_env=False, timeout=40.0) as http:
        yield Alternating(http, fleet.urls)


def same_shape(seed: Any, ours: Any, path: str = "$") -> None:
    """Same keys at every level, same JSON types at the leaves (values may differ)."""
    if isinstance(seed, dict):
        assert isinstance(ours, dict), f"{path}: {ours!r} is not an object"
        assert set(ours) == set(seed), f"{path}: keys {sorted(ours)} != the seed's {sorted(seed)}"
        for key in seed:
            same_shape(seed[key], ours[key], f"{path}.{key}")
    elif isinstance(seed, list):
        assert isinstance(ours, list) and len(ours) == len(seed), f"{path}: {ours!r}"
        for i, (a, b) in enumerate(zip(seed, ours, strict=True)):
            same_shape(a, b, f"{path}[{i}]")
    else:
        assert type(ours) is type(seed), f"{path}: {ours!r} is not a {type(seed).__name__}"


def without_titles(value: Any) -> Any:
    """pydantic names every schema property (`title`); the seed's hand-written schema does not."""
    if isinstance(value, dict):
        return {k: without_titles(v) for k, v in value.items() if k != "title"}
    if isinstance(value, list):
        return [without_titles(v) for v in value]
    return value


def seed(name: str, task_id: str | None = None) -> Any:
    """A seed payload; with `task_id`, the seed's task id replaced by the server's."""
    payload = load(name)
    if task_id is None:
        return payload
    return json.loads(json.dumps(payload).replace(SEED_TASK_ID, task_id))


async def poll(r: Alternating, get: Any, until: str) -> Any:
    """The seed's "periodically checks": `tasks/get` (alternating instances) until `until`."""
    deadline = time.monotonic() + 20
    while True:
        reply = await r.send(get)
        status = reply["result"]["status"]
        if status == until or time.monotonic() > deadline:
            assert status == until, reply
            return reply
        assert status == "working", reply


def flows(audit: Path) -> dict[str, Counter[str]]:
    """The echo steps that really ran, by flow (a step's key is `<flow id>:<step>`)."""
    entries = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    ran: dict[str, Counter[str]] = {}
    for entry in entries:
        if entry["step"].startswith("echo-"):
            ran.setdefault(entry["key"].rsplit(":", 1)[0], Counter())[entry["step"]] += 1
    return ran


async def create(r: Alternating) -> str:
    created = await r.send(seed("001-task-01-call.json5"))  # 1 -> 2
    expected = seed("001-task-02-created.json5")
    same_shape(expected, created)
    task = created["result"]["task"]
    assert created["id"] == expected["id"] and task["status"] == "working"
    assert task["statusMessage"] == expected["result"]["task"]["statusMessage"]
    assert task["pollInterval"] == expected["result"]["task"]["pollInterval"]  # Flows(task_poll_interval=0.1)
    assert isinstance(task["taskId"], str) and task["taskId"]
    return str(task["taskId"])


async def test_seed_001_persistent_workflow_across_two_instances(fleet: Fleet) -> None:
    before = flows(fleet.audit)
    async with alternating(fleet) as r:
        task_id = await create(r)

        waiting = await poll(r, seed("001-task-03-get.json5", task_id), "input_required")  # 3 -> 4
        expected = seed("001-task-04-input-required.json5", task_id)
        same_shape(expected, waiting)
        assert waiting["id"] == expected["id"] and waiting["result"]["taskId"] == task_id
        assert waiting["result"]["statusMessage"] == expected["result"]["statusMessage"]

        asked = await r.send(seed("001-task-05-result.json5", task_id))  # 5 -> 6
        expected = seed("001-task-06-input-requests.json5", task_id)
        same_shape(expected, without_titles(asked))
        assert without_titles(asked) == expected, "the seed's own elicitation, byte for byte (bar pydantic titles)"

        ack = await r.send(seed("001-task-07-input-responses.json5", task_id))  # 7 -> (8: an ack)
        assert ack == {"jsonrpc": "2.0", "id": 4, "result": {"_meta": {RELATED: {"taskId": task_id}}}}

        done = await poll(r, seed("001-task-09-get.json5", task_id), "completed")  # 9 -> 10
        expected = seed("001-task-10-completed.json5", task_id)
        same_shape(expected, done)
        assert done["result"]["status"] == expected["result"]["status"].lower()

        final = await r.send(seed("001-task-11-result.json5", task_id))  # 11 -> 12
        expected = seed("001-task-12-final.json5", task_id)
        same_shape(expected, final)
        assert final == expected, "the seed's final result, exactly"

        assert set(r.answered_by) == {"A", "B"}
        assert all(a != b for a, b in zip(r.answered_by, r.answered_by[1:], strict=False)), r.answered_by

    ran = {flow: steps for flow, steps in flows(fleet.audit).items() if flow not in before}
    assert list(ran.values()) == [Counter({"echo-start": 1, "echo-say": 1})], ran


async def test_tasks_result_while_working_waits_for_the_input_requests(fleet: Fleet) -> None:
    async with alternating(fleet) as r:
        task_id = await create(r)
        asked = await r.send(seed("001-task-05-result.json5", task_id))  # no tasks/get first
        assert set(asked) == {"jsonrpc", "id", "input_requests", "_meta"}, asked
        assert list(asked["input_requests"]) == ["echo_input"]
        await r.send(seed("001-task-07-input-responses.json5", task_id))
        final = await r.send(seed("001-task-11-result.json5", task_id))  # held until completed
        assert final == seed("001-task-12-final.json5", task_id)


async def test_another_principal_gets_what_an_unknown_task_gets(fleet: Fleet) -> None:
    async with alternating(fleet) as r:
        task_id = await create(r)
        await poll(r, seed("001-task-03-get.json5", task_id), "input_required")
        unknown = "no-such-task-0000"

        def refusal(reply: Any, task: str) -> Any:
            assert "error" in reply and "result" not in reply, reply
            return json.loads(json.dumps(reply).replace(task, "<task>"))

        for name in ("001-task-03-get.json5", "001-task-05-result.json5", "001-task-07-input-responses.json5"):
            theirs = refusal(await r.send(seed(name, task_id), BOB), task_id)
            nobody = refusal(await r.send(seed(name, unknown), ALICE), unknown)
            assert theirs == nobody, (name, theirs, nobody)
        cancel = {"jsonrpc": "2.0", "id": 9, "method": "tasks/cancel", "params": {"taskId": task_id}}
        assert "error" in await r.send(cancel, BOB)
        response = await r.http.post(fleet.urls[0], json=seed("001-task-03-get.json5", task_id), headers=ACCEPT)
        assert response.status_code == 401, "unauthenticated: refused before any dialect code runs"

        # Bob's answer was not taken: the task still waits for Alice's, and ends with it.
        still = await r.send(seed("001-task-03-get.json5", task_id))
        assert still["result"]["status"] == "input_required"
        await r.send(seed("001-task-07-input-responses.json5", task_id))
        final = await r.send(seed("001-task-11-result.json5", task_id))
        assert final["result"]["content"][0]["text"] == "Echo: Hello World!"
        bob_late = refusal(await r.send(seed("001-task-11-result.json5", task_id), BOB), task_id)
        assert bob_late["error"]["code"] == -32602


async def test_ask_inline_first_then_become_a_task(fleet: Fleet) -> None:
    """The seed's "Interactions Between Ephemeral and Persistent Workflows", with the seed's messages."""
    before = flows(fleet.audit)
    async with alternating(fleet) as r:
        call = seed("001-task-01-call.json5")
        call["params"]["name"] = "echo_first"
        asked = await r.send(call)  # 1-2: ephemeral input_requests; nothing stored yet
        assert set(asked) == {"jsonrpc", "id", "input_requests", "request_state"}, asked
        assert without_titles(asked["input_requests"]) == seed("001-task-06-input-requests.json5")["input_requests"]
        retry = {**call, "id": 2, "request_state": asked["request_state"]}
        retry["input_responses"] = seed("001-task-07-input-responses.json5")["input_responses"]
        created = await r.send(retry)  # 3-4: the same call with the answers and the task metadata: a task
        same_shape(seed("001-task-02-created.json5"), {**created, "id": 1})
        task_id = created["result"]["task"]["taskId"]
        final = await r.send(seed("001-task-11-result.json5", task_id))
        assert final == seed("001-task-12-final.json5", task_id)
    ran = {flow: steps for flow, steps in flows(fleet.audit).items() if flow not in before}
    assert list(ran.values()) == [Counter({"echo-say": 1})], ran
