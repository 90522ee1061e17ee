"""The example deployer as real processes: a fleet over HTTP, and stdio, in both protocol eras.

Why real processes: the promise of mrtr is that a flow's rounds may land on any process
sharing the key, and that a finished step is never re-run because of it. Only separate
interpreters (no shared memory, no shared module state) can show that. Every server
here is a uvicorn subprocess on 127.0.0.1 that is stopped even when a test fails.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.servers import ServerProcess, audit_entries, http_servers, new_key, stdio_params

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
TEST_TIMEOUT = 30.0
INSTANCE_HEADER = "x-mrtr-instance"
FULL_CAPABILITIES = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}

RISK = "Locks the orders table briefly."
WORKSPACE = "file:///srv/shop"

# Answers by wire key; a list is consumed one entry per time the key is asked.
PRODUCTION: dict[str, list[Any]] = {
    "target": [{"environment": "production"}],
    "service_1": [{"service": "api"}],
    "service_2": [{"service": "worker"}],
    "service_3": [{"done": True}],
    "approve_api": [{"approve": True}],
    "approve_worker": [{"approve": False}],
    "ticket": [{"ticket": "1234"}, {"ticket": "CHG-1234"}],  # the first breaks the pattern: re-asked
}
STAGING: dict[str, list[Any]] = {
    "target": [{"environment": "staging"}],
    "service_1": [{"service": "api", "done": True}],
    "confirm": [{"approve": True}],
}


@dataclass
class Fleet:
    """A and B share a key (one fleet); C has its own (another deployment)."""

    servers: dict[str, ServerProcess]
    audit_log: Path

    def url(self, label: str) -> str:
        return self.servers[label].url


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    key = new_key()
    audit_log = workdir / "audit.log"
    with http_servers([("A", key), ("B", key), ("C", new_key())], workdir, audit_log=audit_log) as servers:
        yield Fleet(servers, audit_log)
        for server in servers.values():  # whatever the tests did, no server may have crashed
            assert server.process.poll() is None, f"server {server.label} died:\n{server.log()}"
            assert "Traceback" not in server.log(), server.log()


# -- the official Client as a manually driven peer ---------------------------------------------


async def _refuse_elicit(context: ClientRequestContext, params: Any) -> t.ElicitResult:
    raise AssertionError("rounds are driven by hand")


async def _refuse_sample(context: ClientRequestContext, params: Any) -> t.CreateMessageResult:
    raise AssertionError("rounds are driven by hand")


async def _refuse_roots(context: ClientRequestContext) -> t.ListRootsResult:
    raise AssertionError("rounds are driven by hand")


@dataclass
class Peer:
    """A modern-mode client bound to one URL; `instances` logs the X-Mrtr-Instance of each response."""

    client: Client
    instances: list[str] = field(default_factory=list)


@asynccontextmanager
async def peer(url: str) -> AsyncIterator[Peer]:
    """A `Client` that declares every capability (the callbacks are never called) and tracks instances."""
    instances: list[str] = []

    async def on_response(response: httpx2.Response) -> None:
        instances.append(response.headers.get(INSTANCE_HEADER, "?"))

    async with httpx2.AsyncClient(trust_env=False, timeout=20.0, event_hooks={"response": [on_response]}) as http:
        client = Client(
            streamable_http_client(url, http_client=http),
            elicitation_callback=_refuse_elicit,
            sampling_callback=_refuse_sample,
            list_roots_callback=_refuse_roots,
        )
        async with client:
            assert client.protocol_version == MODERN
            await client.list_tools()
            yield Peer(client, instances)


class Script:
    """Answers each input request from per-key queues (sampling and roots have fixed answers)."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.queues = {key: list(values) for key, values in answers.items()}

    @property
    def exhausted(self) -> bool:
        return not any(self.queues.values())

    def answer(self, key: str, request: t.InputRequest) -> t.InputResponse:
        if isinstance(request, t.CreateMessageRequest):
            return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=RISK), model="m")
        if isinstance(request, t.ListRootsRequest):
            return t.ListRootsResult(roots=[t.Root(uri=WORKSPACE)])
        assert self.queues.get(key), f"unexpected question {key!r}: {request}"
        return t.ElicitResult(action="accept", content=self.queues[key].pop(0))


@dataclass
class Round:
    instance: str
    asked: set[str]


async def drive(
    peers: list[Peer], answers: dict[str, list[Any]], *, app: str = "shop", stop_before_last: bool = False
) -> tuple[list[Round], t.CallToolResult | t.InputRequiredResult, dict[str, t.InputResponse] | None, str | None]:
    """Run `deploy` with round i sent through `peers[i % len(peers)]`: a new request each round.

    With `stop_before_last`, returns as soon as the answers for the last round are ready
    (unsent), so a test can send that final round itself.
    """
    script = Script(answers)
    rounds: list[Round] = []
    responses: dict[str, t.InputResponse] | None = None
    state: str | None = None
    for i in range(20):
        current = peers[i % len(peers)]
        result = await current.client.session.call_tool(
            "deploy", {"app": app}, input_responses=responses, request_state=state, allow_input_required=True
        )
        if not isinstance(result, t.InputRequiredResult):
            rounds.append(Round(current.instances[-1], set()))
            return rounds, result, responses, state
        asked = result.input_requests or {}
        rounds.append(Round(current.instances[-1], set(asked)))
        responses = {key: script.answer(key, request) for key, request in asked.items()}
        state = result.request_state
        if stop_before_last and script.exhausted:
            return rounds, result, responses, state
    raise AssertionError("flow did not finish in 20 rounds")


def report_of(result: t.CallToolResult | t.InputRequiredResult) -> dict[str, Any]:
    assert isinstance(result, t.CallToolResult), result
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def flow_id_of(report: Mapping[str, Any]) -> str:
    return str(report["rolled_out"][0]["idempotency_key"]).split(":", 1)[0]


# -- a fleet of two processes, one flow ----------------------------------------------------------


async def test_rounds_alternate_between_processes_and_each_step_runs_once(fleet: Fleet) -> None:
    with anyio.fail_after(TEST_TIMEOUT):
        async with peer(fleet.url("A")) as a, peer(fleet.url("B")) as b:
            rounds, result, _, _ = await drive([a, b], PRODUCTION)

    assert [r.instance for r in rounds] == ["A", "B"] * 5, "each round must land on the other process"
    assert [r.asked for r in rounds] == [
        {"target", "roots"},
        {"service_1"},
        {"service_2"},
        {"service_3"},
        {"risk"},  # the plan step ran in this round, before the sampling question parked
        {"approve_api"},
        {"approve_worker"},
        {"ticket"},
        {"ticket"},  # "1234" broke the schema's pattern, so the question came back
        set(),
    ]
    report = report_of(result)
    assert report["status"] == "deployed"
    assert report["environment"] == "production"
    assert report["services"] == ["api", "worker"]
    assert report["skipped"] == ["worker"]
    assert report["ticket"] == "CHG-1234"
    assert report["risk"] == RISK
    assert report["workspace"] == WORKSPACE

    # The plan ran on the instance that served round 5 (A); rounds 6, 8 and 10 went to B,
    # which replayed the plan from the journal instead of running it again.
    assert report["planned_on"] == rounds[4].instance == "A"
    [rollout] = report["rolled_out"]
    assert rollout["service"] == "api"
    assert rollout["ran_on"] == rounds[-1].instance == "B"
    flow_id = flow_id_of(report)
    assert rollout["idempotency_key"] == f"{flow_id}:rollout:api"

    executed = audit_entries(fleet.audit_log, flow_id)
    assert [(e["step"], e["instance"]) for e in executed] == [("plan", "A"), ("rollout", "B")]
    assert executed[0]["plan_id"] == report["plan_id"]


async def test_a_replayed_last_round_reruns_its_step_under_the_same_idempotency_key(fleet: Fleet) -> None:
    """State is not single-use (spec §7.5): the same last round sent twice runs the new step twice.

    What mrtr guarantees is the *same* idempotency key both times, so the downstream
    API can deduplicate; steps journaled in earlier rounds are not re-run at all.
    """
    with anyio.fail_after(TEST_TIMEOUT):
        async with peer(fleet.url("A")) as a, peer(fleet.url("B")) as b:
            rounds, last, responses, state = await drive([a, b], STAGING, stop_before_last=True)
            assert isinstance(last, t.InputRequiredResult)
            assert rounds[-1].asked == {"confirm"}
            first = await a.client.session.call_tool(
                "deploy", {"app": "shop"}, input_responses=responses, request_state=state, allow_input_required=True
            )
            again = await b.client.session.call_tool(
                "deploy", {"app": "shop"}, input_responses=responses, request_state=state, allow_input_required=True
            )

    one, two = report_of(first), report_of(again)
    assert one["plan_id"] == two["plan_id"], "the plan was journaled before the replayed round"
    assert one["rolled_out"][0]["idempotency_key"] == two["rolled_out"][0]["idempotency_key"]
    executed = audit_entries(fleet.audit_log, flow_id_of(one))
    assert [e["step"] for e in executed].count("plan") == 1
    rollouts = [e for e in executed if e["step"] == "rollout"]
    assert [e["instance"] for e in rollouts] == ["A", "B"]
    assert {e["key"] for e in rollouts} == {f"{flow_id_of(one)}:rollout:api"}


# -- the official Client's own driver, both eras, one server ------------------------------------


@dataclass
class Callbacks:
    """Answers by question text (legacy requests carry no wire key) and records what was asked."""

    environment: str = "production"
    asked: list[tuple[str, Any]] = field(default_factory=list)

    async def elicit(self, context: ClientRequestContext, params: t.ElicitRequestParams) -> t.ElicitResult:
        self.asked.append(("elicit", context.request_id))
        message = params.message
        if message.startswith("Where"):
            return t.ElicitResult(action="accept", content={"environment": self.environment})
        if message.startswith("Services"):
            done = "so far: none yet" not in message
            return t.ElicitResult(action="accept", content={"service": "" if done else "api", "done": done})
        if message.startswith("Change ticket"):
            return t.ElicitResult(action="accept", content={"ticket": "CHG-7"})
        if message.startswith("Who is"):
            return t.ElicitResult(action="accept", content={"audience": "customers"})
        return t.ElicitResult(action="accept", content={"approve": True})

    async def sample(
        self, context: ClientRequestContext, params: t.CreateMessageRequestParams
    ) -> t.CreateMessageResult:
        self.asked.append(("sample", context.request_id))
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=RISK), model="m")

    async def roots(self, context: ClientRequestContext) -> t.ListRootsResult:
        self.asked.append(("roots", context.request_id))
        return t.ListRootsResult(roots=[t.Root(uri=WORKSPACE)])

    def client(self, server: Any, mode: str) -> Client:
        return Client(
            server,
            mode=mode,  # type: ignore[arg-type]
            elicitation_callback=self.elicit,
            sampling_callback=self.sample,
            list_roots_callback=self.roots,
            input_required_max_rounds=20,
        )


@pytest.mark.parametrize(("mode", "version"), [("auto", MODERN), ("legacy", LEGACY)])
async def test_the_clients_automatic_driver_completes_the_flow_in_both_eras(
    fleet: Fleet, mode: str, version: str
) -> None:
    callbacks = Callbacks()
    with anyio.fail_after(TEST_TIMEOUT):
        async with callbacks.client(fleet.url("A"), mode) as client:
            assert client.protocol_version == version
            result = await client.call_tool("deploy", {"app": "shop"})
            prompt = await client.get_prompt("announcement", {"app": "shop"})

    report = report_of(result)
    assert report["status"] == "deployed"
    assert report["services"] == ["api"]
    assert report["risk"] == RISK
    assert report["workspace"] == WORKSPACE
    assert report["ticket"] == "CHG-7"
    assert [r["service"] for r in report["rolled_out"]] == ["api"]
    kinds = [kind for kind, _ in callbacks.asked]
    assert kinds.count("roots") == kinds.count("sample") == 1
    # deploy: target, service_1, service_2 (done), approve_api, ticket; announcement: audience
    assert kinds.count("elicit") == 6
    ids = [request_id for _, request_id in callbacks.asked]
    if mode == "legacy":  # real server-to-client JSON-RPC requests, numbered by the server
        assert all(isinstance(i, int) for i in ids), ids
    else:  # embedded input requests, dispatched under their wire keys
        assert {"target", "roots", "service_1", "risk", "approve_api", "ticket", "audience"} <= set(ids), ids
    [message] = prompt.messages
    assert isinstance(message.content, t.TextContent)
    assert "friendly" in message.content.text and "customers" in message.content.text
    executed = audit_entries(fleet.audit_log, flow_id_of(report))
    assert [e["step"] for e in executed] == ["plan", "rollout"]


@pytest.mark.parametrize(("mode", "version"), [("auto", MODERN), ("legacy", LEGACY)])
async def test_a_fixed_uri_resource_flow_asks_for_a_url_login_in_both_eras(
    fleet: Fleet, mode: str, version: str
) -> None:
    """Fixed-URI resources are served by mrtr's own middleware: check it over real HTTP too."""
    urls: list[str] = []

    async def consent(context: ClientRequestContext, params: t.ElicitRequestParams) -> t.ElicitResult:
        assert isinstance(params, t.ElicitRequestURLParams)
        urls.append(params.url)
        return t.ElicitResult(action="accept")

    with anyio.fail_after(TEST_TIMEOUT):
        async with Client(fleet.url("B"), mode=mode, elicitation_callback=consent) as client:  # type: ignore[arg-type]
            assert client.protocol_version == version
            result = await client.read_resource("deployer://console-session")

    [contents] = result.contents
    assert isinstance(contents, t.TextResourceContents)
    session = json.loads(contents.text)
    assert session["status"] == "signed in"
    [url] = urls
    assert url.startswith("https://console.deployer.example/login?flow=")
    executed = audit_entries(fleet.audit_log, url.rsplit("=", 1)[1])  # the URL carries the flow id
    assert [(e["step"], e["instance"], e["session"]) for e in executed] == [("open_session", "B", session["session"])]


# -- state from elsewhere, and malformed retries -------------------------------------------------


async def _first_round(url: str, app: str = "shop") -> t.InputRequiredResult:
    async with peer(url) as p:
        result = await p.client.session.call_tool("deploy", {"app": app}, allow_input_required=True)
    assert isinstance(result, t.InputRequiredResult) and result.request_state
    return result


def _answers() -> dict[str, t.InputResponse]:
    return {
        "target": t.ElicitResult(action="accept", content={"environment": "staging"}),
        "roots": t.ListRootsResult(roots=[t.Root(uri=WORKSPACE)]),
    }


async def test_a_process_with_another_key_rejects_the_state(fleet: Fleet) -> None:
    with anyio.fail_after(TEST_TIMEOUT):
        minted = await _first_round(fleet.url("A"))
        async with peer(fleet.url("B")) as b:  # control: the same state is fine on the same fleet
            ok = await b.client.session.call_tool(
                "deploy", {"app": "shop"}, input_responses=_answers(), request_state=minted.request_state,
                allow_input_required=True,
            )  # fmt: skip
        assert isinstance(ok, t.InputRequiredResult) and set(ok.input_requests or {}) == {"service_1"}

        async with peer(fleet.url("C")) as c:
            with pytest.raises(MCPError) as rejected:
                await c.client.session.call_tool(
                    "deploy", {"app": "shop"}, input_responses=_answers(), request_state=minted.request_state,
                    allow_input_required=True,
                )  # fmt: skip
        assert rejected.value.code == t.INVALID_PARAMS

        status, body = await raw_call(
            fleet.url("C"),
            {"name": "deploy", "arguments": {"app": "shop"}, "requestState": minted.request_state},
        )
    assert status == 400, body
    assert body["error"]["code"] == t.INVALID_PARAMS


async def raw_call(
    url: str, params: dict[str, Any], *, capabilities: dict[str, Any] | None = None, name: str = "deploy"
) -> tuple[int, dict[str, Any]]:
    """One 2026-07-28 `tools/call` POST exactly as the spec's §11 lays it out (headers + _meta)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": FULL_CAPABILITIES if capabilities is None else capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
    }
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {**params, "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    async with httpx2.AsyncClient(trust_env=False, timeout=20.0) as http:
        response = await http.post(url, content=json.dumps(body), headers=headers)
    assert response.status_code != 500, response.text
    assert response.headers.get("content-type", "").startswith("application/json"), response.text
    return response.status_code, response.json()


TAMPER = "tamper"  # placeholder replaced by the freshly minted state (+ a suffix)
STATE = "state"  # placeholder replaced by the freshly minted state

MALFORMED: dict[str, tuple[dict[str, Any], set[str]]] = {
    # name: (params beyond name/arguments, allowed outcomes)
    "inputResponses null": ({"inputResponses": None, "requestState": STATE}, {"reask"}),
    "unknown key, number value": ({"inputResponses": {"x": 12345}, "requestState": STATE}, {"error", "reask"}),
    "known key, number value": ({"inputResponses": {"target": 12345}, "requestState": STATE}, {"error", "reask"}),
    "inputResponses a list": ({"inputResponses": [1, 2], "requestState": STATE}, {"error"}),
    "inputResponses a string": ({"inputResponses": "yes", "requestState": STATE}, {"error"}),
    "answer off the schema": (
        {"inputResponses": {"target": {"action": "accept", "content": {"environment": "moon"}}}, "requestState": STATE},
        {"reask"},
    ),
    "answer of the wrong kind": (
        {
            "inputResponses": {
                "target": {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}
            },
            "requestState": STATE,
        },
        {"reask", "error"},
    ),
    "answer without state": (
        {"inputResponses": {"target": {"action": "accept", "content": {"environment": "staging"}}}},
        {"reask"},
    ),
    "tampered requestState": ({"requestState": TAMPER}, {"error"}),
    "requestState a number": ({"requestState": 42}, {"error"}),
    "requestState an object": ({"requestState": {"v": 1}}, {"error"}),
    "requestState empty string": ({"requestState": ""}, {"error", "reask"}),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_retries_get_an_error_or_a_reask_never_a_500(fleet: Fleet, case: str) -> None:
    extra, allowed = MALFORMED[case]
    with anyio.fail_after(TEST_TIMEOUT):
        minted = await _first_round(fleet.url("A"))
        state = minted.request_state
        assert state is not None
        fill = {STATE: state, TAMPER: state + "-TAMPERED"}
        params = {k: fill.get(v, v) if isinstance(v, str) else v for k, v in extra.items()}
        status, body = await raw_call(fleet.url("B"), {"name": "deploy", "arguments": {"app": "shop"}, **params})

    if "error" in body:
        outcome = "error"
        assert status == 400, body
        assert body["error"]["code"] == t.INVALID_PARAMS, body
    else:
        result = body["result"]
        assert result.get("resultType") == "input_required", f"a malformed retry completed the flow: {body}"
        outcome = "reask"
        assert "target" in result["inputRequests"], "the unanswered question must be asked again"
        assert status == 200
    assert outcome in allowed, f"{case}: got {outcome} ({body})"


async def test_a_tampered_state_is_rejected_with_32602(fleet: Fleet) -> None:
    with anyio.fail_after(TEST_TIMEOUT):
        minted = await _first_round(fleet.url("A"))
        assert minted.request_state is not None
        status, body = await raw_call(
            fleet.url("A"), {"name": "deploy", "arguments": {"app": "shop"}, "requestState": minted.request_state + "x"}
        )
    assert (status, body["error"]["code"]) == (400, t.INVALID_PARAMS)
    assert body["error"]["message"] == "Invalid or expired requestState"


async def test_state_minted_for_one_call_is_refused_for_another(fleet: Fleet) -> None:
    with anyio.fail_after(TEST_TIMEOUT):
        minted = await _first_round(fleet.url("A"), app="shop")
        status, body = await raw_call(
            fleet.url("B"), {"name": "deploy", "arguments": {"app": "billing"}, "requestState": minted.request_state}
        )
    assert (status, body["error"]["code"]) == (400, t.INVALID_PARAMS)


async def test_an_undeclared_capability_is_refused_with_32021(fleet: Fleet) -> None:
    with anyio.fail_after(TEST_TIMEOUT):
        status, body = await raw_call(fleet.url("A"), {"name": "deploy", "arguments": {"app": "shop"}}, capabilities={})
    assert status == 400, body
    assert body["error"]["code"] == t.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert "elicitation" in body["error"]["data"]["requiredCapabilities"]


async def test_every_response_names_the_instance_that_served_it(fleet: Fleet) -> None:
    with anyio.fail_after(TEST_TIMEOUT):
        async with httpx2.AsyncClient(trust_env=False, timeout=10.0) as http:
            responses = {
                label: await http.get(server.url.removesuffix("/mcp") + "/healthz")
                for label, server in fleet.servers.items()
            }
    for label, response in responses.items():
        assert response.status_code == 200
        assert response.headers[INSTANCE_HEADER] == label == response.json()["instance"]


# -- stdio ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "version"), [("auto", MODERN), ("legacy", LEGACY)])
async def test_stdio_runs_the_flow_to_completion(tmp_path: Path, mode: str, version: str) -> None:
    audit_log = tmp_path / "audit.log"
    callbacks = Callbacks(environment="staging")
    with anyio.fail_after(TEST_TIMEOUT):
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(callbacks.client(stdio_params(new_key(), "S", audit_log), mode))
            assert client.protocol_version == version
            result = await client.call_tool("deploy", {"app": "shop"})

    report = report_of(result)
    assert report["status"] == "deployed"
    assert report["environment"] == "staging"
    assert report["planned_on"] == "S"
    executed = audit_entries(audit_log, flow_id_of(report))
    assert [e["step"] for e in executed] == ["plan", "rollout"]
