"""`FlowClient` under fire: real server processes behind a round-robin proxy that kills, resets and 502s.

Two instances of `tests/support/fault_server.py` share a state key (and a SQLite task store); the
proxy (`tests/support/faultproxy.py`) spreads requests over them without stickiness, as HAProxy
would, and injects faults. Each test asserts what the client did on the wire (the proxy's
log) as well as what the caller saw.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mrtr.client import (
    IDEMPOTENCY_KEY,
    FlowClient,
    GatewayError,
    LegacySessionRejected,
    LoadShed,
    RetryPolicy,
    Round,
    TasksClient,
    TransportError,
    TransportTimeout,
)
from tests.support.faultproxy import FaultProxy, running_proxy
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, new_key, spawn_servers

# alone: the proxy's faults race the client's backoff (make test runs it with nothing beside it)
pytestmark = [pytest.mark.anyio, pytest.mark.spawns, pytest.mark.alone]

SERVER = SUPPORT / "fault_server.py"
READY = "fault-server ready:"
FAST = RetryPolicy(attempts=8, initial_delay=0.02, max_delay=0.2)
"""Quick resends, so a test that provokes several spends little time sleeping."""


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fault-fleet")


def _specs(workdir: Path, labels: str) -> list[ServerSpec]:
    env = {
        "MRTR_STATE_KEY": new_key(),
        "MRTR_AUDIT": str(workdir / "audit.jsonl"),
        "MRTR_STORE": f"sqlite:///{workdir / 'tasks.db'}",
    }
    return [ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix=READY) for label in labels]


@pytest.fixture(scope="module")
def fleet(fleet_dir: Path) -> Iterator[dict[str, ServerProcess]]:
    """Two healthy instances shared by the tests that kill nothing."""
    with spawn_servers(_specs(fleet_dir, "AB"), fleet_dir) as servers:
        yield servers


@asynccontextmanager
async def through_proxy(
    fleet: dict[str, ServerProcess], **options: Any
) -> AsyncIterator[tuple[FaultProxy, FlowClient]]:
    """A fault proxy over the fleet and a `FlowClient` through it."""
    async with running_proxy([s.url for s in fleet.values()]) as proxy, FlowClient(proxy.url, **options) as flows:
        yield proxy, flows


def audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def answer_word(params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"word": "ok"})


def _key(params: dict[str, Any]) -> str | None:
    return (params.get("_meta") or {}).get(IDEMPOTENCY_KEY)


async def test_a_kill_under_a_shared_client_fails_only_the_killed_call_which_resends(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    killed = anyio.Event()

    async def answer_after_the_kill(params: t.ElicitRequestParams) -> t.ElicitResult:
        await killed.wait()  # call B is mid-flow (between rounds) when the instance dies
        return t.ElicitResult(action="accept", content={"word": "fine"})

    with spawn_servers(_specs(tmp_path, "AB"), tmp_path) as servers:
        async with running_proxy([s.url for s in servers.values()]) as proxy:
            results: dict[str, str] = {}
            async with FlowClient(proxy.url, elicit=answer_after_the_kill, retry=FAST, timeout=20) as flows:

                async def call(name: str, tool: str, arguments: dict[str, Any]) -> None:
                    result = await flows.call_tool(tool, arguments)
                    results[name] = result.content[0].text

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as group:
                        group.start_soon(call, "A", "slow", {"label": "victim", "seconds": 3.0})
                        group.start_soon(call, "B", "three_rounds", {"name": "bystander"})
                        while not [e for e in audit(log) if e["label"] == "victim"]:
                            await anyio.sleep(0.05)
                        victim_host = audit(log)[0]["instance"]
                        os.kill(servers[victim_host].process.pid, signal.SIGKILL)
                        servers[victim_host].process.wait(timeout=10)
                        killed.set()
                    # The client is still usable after the kill.
                    again = await flows.call_tool("three_rounds", {"name": "after"})
            # Leaving `async with` raised nothing (no ExceptionGroup for a failure already handled).

    survivor = "B" if victim_host == "A" else "A"
    assert results == {"A": f"victim done on {survivor}", "B": "bystander:fine:fine"}
    assert again.content[0].text == "after:fine:fine"
    starts = [(e["instance"], e["phase"]) for e in audit(log) if e["label"] == "victim"]
    assert starts[0] == (victim_host, "start") and (survivor, "end") in starts  # redone on the survivor
    victim_calls = [e for e in proxy.calls("tools/call") if e.params.get("name") == "slow"]
    assert len(victim_calls) >= 2 and all("requestState" not in e.params for e in victim_calls)


async def test_a_round_resent_after_a_failure_carries_the_same_state_and_answers(
    fleet: dict[str, ServerProcess],
) -> None:
    def answering(params: dict[str, Any]) -> bool:
        return "inputResponses" in params

    auth = {"Authorization": "Bearer t0k"}
    async with through_proxy(fleet, elicit=answer_word, retry=FAST, headers=auth) as (proxy, flows):
        proxy.inject("tools/call", "reset", where=answering)
        proxy.inject("tools/call", "502", where=answering)
        result = await flows.call_tool("three_rounds", {"name": "r"})
    assert result.content[0].text == "r:ok:ok"
    calls = proxy.calls("tools/call")
    assert [c.outcome.split()[0] for c in calls] == ["forwarded", "injected", "injected", "forwarded", "forwarded"]
    failed, again_after_reset, delivered = calls[1], calls[2], calls[3]
    for resend in (again_after_reset, delivered):
        assert resend.params["requestState"] == failed.params["requestState"]
        assert resend.params["inputResponses"] == failed.params["inputResponses"]
    assert {c.headers.get("authorization") for c in proxy.log} == {"Bearer t0k"}


async def test_notifications_on_a_response_stream_reach_the_session(fleet: dict[str, ServerProcess]) -> None:
    logged: list[t.LoggingMessageNotificationParams] = []

    async def on_log(params: t.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    options = {"log_level": "info", "logging_callback": on_log}
    async with FlowClient(fleet["A"].url, client_options=options) as flows:
        result = await flows.call_tool("chatty", {"text": "hi"})
    assert result.content[0].text == "hi"
    assert [entry.data for entry in logged] == ["about to echo hi"]


async def test_a_502_on_discovery_does_not_downgrade(fleet: dict[str, ServerProcess]) -> None:
    async with running_proxy([s.url for s in fleet.values()]) as proxy:
        proxy.inject("server/discover", "502", times=2)
        async with FlowClient(proxy.url, elicit=answer_word, retry=FAST) as flows:
            assert flows.protocol_version == "2026-07-28"
            result = await flows.call_tool("three_rounds", {"name": "n"})
    assert result.content[0].text == "n:ok:ok"
    assert [e.outcome for e in proxy.calls("server/discover")] == ["injected 502", "injected 502", "forwarded 200"]
    assert not proxy.calls("initialize")


async def test_auto_falls_back_to_legacy_only_on_a_definite_answer(fleet: dict[str, ServerProcess]) -> None:
    async with running_proxy([fleet["A"].url]) as proxy:  # one upstream: legacy sessions need stickiness
        proxy.inject("server/discover", "502")
        proxy.inject("server/discover", "method_not_found")
        async with FlowClient(proxy.url, elicit=answer_word, retry=FAST) as flows:
            assert flows.protocol_version == "2025-11-25"
            result = await flows.call_tool("three_rounds", {"name": "old"})
    assert result.content[0].text == "old:ok:ok"
    assert [e.outcome for e in proxy.calls("server/discover")] == ["injected 502", "injected -32601"]
    assert len(proxy.calls("initialize")) == 1


async def test_a_pinned_mode_skips_discovery(fleet: dict[str, ServerProcess]) -> None:
    async with through_proxy(fleet, mode="2026-07-28", elicit=answer_word) as (proxy, flows):
        result = await flows.call_tool("three_rounds", {"name": "p"})
    assert result.content[0].text == "p:ok:ok"
    assert not proxy.calls("server/discover") and not proxy.calls("initialize")
    with pytest.raises(ValueError, match="mode must be"):
        FlowClient(proxy.url, mode="2025-11-25")


async def test_discovery_that_keeps_failing_raises_the_transport_error_instead_of_downgrading(
    fleet: dict[str, ServerProcess],
) -> None:
    async with running_proxy([s.url for s in fleet.values()]) as proxy:
        proxy.inject("server/discover", "502", times=100)
        with pytest.raises(GatewayError) as caught:
            async with FlowClient(proxy.url, retry=RetryPolicy(attempts=3, initial_delay=0.01)):
                pass
    assert caught.value.status == 502 and caught.value.retryable
    assert not isinstance(caught.value, MCPError)
    assert len(proxy.calls("server/discover")) == 4
    assert not proxy.calls("initialize")


async def test_a_legacy_session_rejected_by_another_instance_fails_clearly_within_the_timeout(
    fleet: dict[str, ServerProcess],
) -> None:
    async with running_proxy([s.url for s in fleet.values()]) as proxy:
        timeout = 5.0
        with anyio.fail_after(timeout):
            async with FlowClient(proxy.url, elicit=answer_word, mode="legacy", timeout=timeout) as flows:
                with pytest.raises(LegacySessionRejected, match="sticky or stateful deployment"):
                    await flows.call_tool("three_rounds", {"name": "n"})
    assert proxy.calls("initialize")
    # Straight to one instance (what stickiness gives), the same legacy client works, and the
    # server's own errors come through as they are.
    async with FlowClient(fleet["A"].url, elicit=answer_word, mode="legacy", timeout=timeout) as flows:
        result = await flows.call_tool("three_rounds", {"name": "n"})
        with pytest.raises(MCPError) as caught:
            await flows.read_resource("nothing://here")
    assert result.content[0].text == "n:ok:ok"
    assert not isinstance(caught.value, TransportError)


async def test_a_legacy_answer_refused_elsewhere_fails_the_call_instead_of_hanging(
    fleet: dict[str, ServerProcess],
) -> None:
    async with running_proxy([s.url for s in fleet.values()]) as proxy:
        # Everything sticks to A except the client's answers to A's questions, which land on B: A
        # would wait for an answer forever (the hang users saw), B refuses the unknown session.
        proxy.pinned = {None: 0, "initialize": 0, "notifications/initialized": 0, "tools/call": 0, "(response)": 1}
        timeout = 10.0
        with anyio.fail_after(timeout):
            async with FlowClient(proxy.url, elicit=answer_word, mode="legacy", timeout=timeout) as flows:
                with pytest.raises(LegacySessionRejected, match="sticky or stateful deployment"):
                    await flows.call_tool("three_rounds", {"name": "n"})
    assert [e.outcome for e in proxy.calls("(response)")] == ["forwarded 404"]


class RecordingPolicy(RetryPolicy):
    """The default backoff, remembering every delay it hands out."""

    def __init__(self, attempts: int = 8) -> None:
        super().__init__(attempts=attempts, initial_delay=0.01, max_delay=0.05)
        object.__setattr__(self, "delays", [])

    def delay(self, resend: int) -> float:
        self.delays.append(resend)  # type: ignore[attr-defined]
        return super().delay(resend)


async def test_a_state_only_result_is_resent_at_once_with_its_state(fleet: dict[str, ServerProcess]) -> None:
    policy = RecordingPolicy()
    rounds: list[Round] = []
    async with through_proxy(fleet, retry=policy, on_round=rounds.append) as (proxy, flows):
        result = await flows.call_tool("shed", {"label": "x", "times": 1})
    assert result.content[0].text == "x resumed after 1 sheds"
    first, resent = proxy.calls("tools/call")
    assert "requestState" not in first.params
    assert resent.params["requestState"] and "inputResponses" not in resent.params
    assert first.upstream != resent.upstream  # round robin: the resend went to the other instance
    assert policy.delays == []  # no backoff before the first resend of a shed round
    assert [r.asked for r in rounds] == [{}]


async def test_endless_shedding_stops_at_the_cap(fleet: dict[str, ServerProcess]) -> None:
    async with through_proxy(fleet, retry=RetryPolicy(attempts=3, initial_delay=0.01)) as (proxy, flows):
        with pytest.raises(LoadShed):
            await flows.call_tool("shed", {"label": "x", "times": 100})
    assert len(proxy.calls("tools/call")) == 4


async def test_a_task_call_resent_after_a_lost_answer_carries_the_same_idempotency_key(
    fleet: dict[str, ServerProcess],
) -> None:
    async with through_proxy(fleet, tasks=True, retry=FAST) as (proxy, flows):
        proxy.inject("tools/call", "lose")
        first = await flows.call_tool("remember", {"text": "one"})
        second = await flows.call_tool("remember", {"text": "two"})
    assert (first.content[0].text, second.content[0].text) == ("noted one", "noted two")
    calls = proxy.calls("tools/call")
    assert [c.outcome for c in calls][:2] == ["answer lost (502)", "forwarded 200"]
    keys = [_key(c.params) for c in calls]
    assert keys[0] and keys[0] == keys[1]  # the resend of the lost call: same key
    assert keys[2] and keys[2] != keys[0]  # the next logical call: a fresh one
    assert len(keys[0]) >= 22  # 128 random bits, urlsafe base64
    assert proxy.calls("subscriptions/listen")  # followed to the end (by listening) through the same transport


async def test_the_sdk_client_with_tasks_client_polls_through_gateway_errors(
    fleet: dict[str, ServerProcess],
) -> None:
    async with running_proxy([s.url for s in fleet.values()]) as proxy:
        proxy.inject("tasks/get", "502", times=2)
        async with Client(proxy.url, extensions=[TasksClient(_no_input, retry=FAST, listen=False)]) as client:
            result = await client.call_tool("remember", {"text": "sdk"})
    assert result.content[0].text == "noted sdk"
    outcomes = [c.outcome for c in proxy.calls("tasks/get")]
    assert outcomes[:2] == ["injected 502"] * 2 and outcomes[-1] == "forwarded 200"


async def test_a_listen_that_fails_in_transit_is_followed_by_a_refetch(fleet: dict[str, ServerProcess]) -> None:
    async with through_proxy(fleet, tasks=True, retry=FAST) as (proxy, flows):
        proxy.inject("subscriptions/listen", "502")
        result = await flows.call_tool("remember", {"text": "pushed"})
    assert result.content[0].text == "noted pushed"
    assert [c.outcome for c in proxy.calls("subscriptions/listen")][:1] == ["injected 502"]
    assert proxy.calls("tasks/get"), "the failed listen is followed by a refetch (here it already shows the end)"


async def _no_input(request: t.InputRequest) -> Any:
    raise AssertionError("`remember` asks nothing")


async def test_a_json_rpc_error_from_the_server_is_never_resent(fleet: dict[str, ServerProcess]) -> None:
    async with running_proxy([s.url for s in fleet.values()]) as proxy, FlowClient(proxy.url, retry=FAST) as flows:
        with pytest.raises(MCPError) as caught:  # no elicitation handler: the server refuses to ask
            await flows.call_tool("three_rounds", {"name": "x"})
        assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY
        assert not isinstance(caught.value, TransportError)
        proxy.inject("tools/call", "502", times=3)
        proxy.inject("tools/call", "reset", times=2)
        result = await flows.call_tool("slow", {"label": "y", "seconds": 0})
    assert result.content[0].text.startswith("y done on")
    outcomes = [c.outcome for c in proxy.calls("tools/call")]
    assert outcomes[0].startswith("forwarded") and outcomes[1:6] == ["injected 502"] * 3 + ["injected reset"] * 2


async def test_a_failure_stays_with_its_call_and_the_client_stays_usable(fleet: dict[str, ServerProcess]) -> None:
    async with through_proxy(fleet, elicit=answer_word, retry=RetryPolicy(attempts=0)) as (proxy, flows):
        outcome: dict[str, Any] = {}

        async def doomed() -> None:
            try:
                await flows.call_tool("slow", {"label": "doomed", "seconds": 0})
            except TransportError as error:
                outcome["doomed"] = error

        async def healthy() -> None:
            outcome["healthy"] = (await flows.call_tool("slow", {"label": "healthy", "seconds": 1.0})).content

        async with anyio.create_task_group() as group:
            group.start_soon(healthy)
            await anyio.sleep(0.3)  # `healthy` is in flight when `doomed`'s connection drops
            proxy.inject("tools/call", "reset")
            group.start_soon(doomed)
        assert isinstance(outcome["doomed"], TransportError) and outcome["doomed"].status is None
        assert outcome["healthy"][0].text.startswith("healthy done on")
        later = await flows.call_tool("three_rounds", {"name": "later"})
    assert later.content[0].text == "later:ok:ok"


async def test_every_request_is_bounded_by_the_timeout_and_a_timeout_is_not_resent(
    fleet: dict[str, ServerProcess],
) -> None:
    async with through_proxy(fleet, timeout=0.5, retry=FAST) as (proxy, flows):
        with pytest.raises(TransportTimeout) as caught, anyio.fail_after(10):
            await flows.call_tool("slow", {"label": "t", "seconds": 3.0})
        assert caught.value.status is None and caught.value.method == "tools/call"
        assert not caught.value.retryable
        assert len(proxy.calls("tools/call")) == 1  # the server may still be working: no second run beside it
        quick = await flows.call_tool("slow", {"label": "u", "seconds": 0})
    assert quick.content[0].text.startswith("u done on")


# -- your own HTTP stack (issue 22): an httpx2 client and an httpx2.Auth keep every guarantee ---------


class CountingBearer(httpx2.Auth):
    """An `httpx2.Auth` that signs every request (as an OAuth provider would) and counts them."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.signed = 0

    def auth_flow(self, request: httpx2.Request) -> Any:
        self.signed += 1
        request.headers["authorization"] = f"Bearer {self.token}"
        yield request


def own_client() -> tuple[httpx2.AsyncClient, list[str]]:
    """A caller's own client, with an event hook that records every request it sends."""
    sent: list[str] = []

    async def record(request: httpx2.Request) -> None:
        sent.append(request.headers.get("mcp-method", "?"))

    return httpx2.AsyncClient(trust_env=False, event_hooks={"request": [record]}), sent


async def test_your_own_http_client_keeps_resending_a_round_after_a_502(fleet: dict[str, ServerProcess]) -> None:
    def answering(params: dict[str, Any]) -> bool:
        return "inputResponses" in params

    http, sent = own_client()
    bearer = CountingBearer("own-t0k")
    async with http, running_proxy([s.url for s in fleet.values()]) as proxy:
        proxy.inject("tools/call", "502", where=answering)  # round 2's answer: a gateway error
        async with FlowClient(proxy.url, elicit=answer_word, retry=FAST, http_client=http, auth=bearer) as flows:
            result = await flows.call_tool("three_rounds", {"name": "h"})
        assert not http.is_closed, "the caller's client is the caller's to close"
    assert result.content[0].text == "h:ok:ok"
    calls = proxy.calls("tools/call")
    assert [c.outcome.split()[0] for c in calls] == ["forwarded", "injected", "forwarded", "forwarded"]
    assert calls[2].params["requestState"] == calls[1].params["requestState"], "resent unchanged"
    assert sent.count("tools/call") == 4, "every request went through the caller's client"
    assert bearer.signed == len(proxy.log) and {c.headers.get("authorization") for c in proxy.log} == {"Bearer own-t0k"}


async def test_your_own_http_client_never_falls_back_to_legacy_on_a_502_at_discovery(
    fleet: dict[str, ServerProcess],
) -> None:
    http, sent = own_client()
    async with http, running_proxy([s.url for s in fleet.values()]) as proxy:
        proxy.inject("server/discover", "502", times=2)
        async with FlowClient(proxy.url, elicit=answer_word, retry=FAST, http_client=http) as flows:
            assert flows.protocol_version == "2026-07-28"
            result = await flows.call_tool("three_rounds", {"name": "d"})
    assert result.content[0].text == "d:ok:ok"
    assert [e.outcome for e in proxy.calls("server/discover")] == ["injected 502", "injected 502", "forwarded 200"]
    assert not proxy.calls("initialize"), "no legacy fallback"
    assert sent[:3] == ["server/discover"] * 3


async def test_your_own_http_client_makes_one_task_when_its_create_task_result_is_lost(
    fleet: dict[str, ServerProcess], fleet_dir: Path
) -> None:
    http, _ = own_client()
    text = f"once-{os.getpid()}-{id(http)}"
    async with http, running_proxy([s.url for s in fleet.values()]) as proxy:
        proxy.inject("tools/call", "lose")  # the task is created; its CreateTaskResult never arrives
        async with FlowClient(proxy.url, tasks=True, retry=FAST, http_client=http) as flows:
            result = await flows.call_tool("remember", {"text": text})
    assert result.content[0].text == f"noted {text}"
    calls = proxy.calls("tools/call")
    assert [c.outcome for c in calls] == ["answer lost (502)", "forwarded 200"]
    assert _key(calls[0].params) == _key(calls[1].params), "the resend names the same task"
    runs = [e for e in audit(fleet_dir / "audit.jsonl") if e.get("label") == text and e.get("phase") == "start"]
    assert len(runs) == 1, f"one task, its step run once: {runs}"


async def test_the_sdks_http_transport_is_refused_with_the_way_to_pass_your_client() -> None:
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient() as http:
        with pytest.raises(TypeError, match=r"http_client=httpx2.AsyncClient"):
            FlowClient(streamable_http_client("http://127.0.0.1:9/mcp", http_client=http))
        # Pinned to the legacy handshake, which is the SDK's transport anyway: accepted.
        FlowClient(streamable_http_client("http://127.0.0.1:9/mcp", http_client=http), mode="legacy")
    with pytest.raises(TypeError, match="server URL"):
        FlowClient(object(), http_client=httpx2.AsyncClient())
