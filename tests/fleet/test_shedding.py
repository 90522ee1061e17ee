"""Load shedding: an overloaded instance ends a flow at a step boundary with a state-only result.

In process first (the policy: progress first, explicit checkpoints, max_rounds untouched,
legacy clients never shed), then across real uvicorn instances with the official
`mcp.Client`, which retries state-only results by itself (`mcp.client._input_required`:
50 ms backoff doubling to 250 ms), driven by a real load signal: rounds in flight.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import pytest
from mcp import Client

import mrtr
from mrtr._shedding import SHEDDING_EXTENSION, LoadShedder, resends_state_only
from mrtr.client import FlowClient
from mrtr.client import _flowclient as client_module
from tests.support.flowkit import manual_client, new_server, text_of
from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

# alone: a real load signal (make test runs it with nothing beside it)
pytestmark = [pytest.mark.anyio, pytest.mark.in_process, pytest.mark.alone]  # unless marked otherwise

SERVER = SUPPORT / "task_server.py"


def shedding_server(runs: Counter[str], overloaded: list[bool], **options: Any) -> Any:
    server = new_server()
    flows = mrtr.Flows(server, shed_when=lambda: overloaded[0], **options)

    def step(name: str) -> Any:
        def run() -> str:
            runs[name] += 1
            return name

        return run

    @flows.tool()
    async def chain(ctx: mrtr.FlowContext) -> str:
        """Four steps; a checkpoint after the second."""
        done = [await ctx.step("one", step("one")), await ctx.step("two", step("two"))]
        await ctx.checkpoint()
        done += [await ctx.step("three", step("three")), await ctx.step("four", step("four"))]
        return "+".join(done)

    return server, flows


async def test_each_shed_keeps_finished_steps_and_makes_progress() -> None:
    runs: Counter[str] = Counter()
    server, flows = shedding_server(runs, [True], max_rounds=1)
    async with manual_client(server) as client:
        states: list[str] = []
        result: Any = await client.session.call_tool("chain", {}, allow_input_required=True)
        for _ in range(10):
            if not isinstance(result, t.InputRequiredResult):
                break
            assert not result.input_requests, "a shed result carries state only"
            states.append(result.request_state)
            result = await client.session.call_tool(
                "chain", {}, request_state=result.request_state, allow_input_required=True
            )
        assert isinstance(result, t.CallToolResult) and text_of(result) == "one+two+three+four"
    # always overloaded: every round sheds right after its first new step, so 4 rounds, each step once,
    # and max_rounds=1 is not hit (shed rounds are not rounds of client input)
    assert runs == Counter(one=1, two=1, three=1, four=1)
    assert len(states) == 3 and flows.shedder.shed == 3


async def test_the_official_client_retries_shed_results_by_itself() -> None:
    runs: Counter[str] = Counter()
    overloaded = [True]
    server, flows = shedding_server(runs, overloaded)
    async with Client(server) as client:
        result = await client.call_tool("chain", {})
    assert text_of(result) == "one+two+three+four" and flows.shedder.shed == 3
    assert runs == Counter(one=1, two=1, three=1, four=1)


async def test_no_shedding_when_not_overloaded_or_for_legacy_clients() -> None:
    runs: Counter[str] = Counter()
    server, flows = shedding_server(runs, [False])
    async with Client(server) as client:
        assert text_of(await client.call_tool("chain", {})) == "one+two+three+four"
    assert flows.shedder.shed == 0
    legacy_runs: Counter[str] = Counter()
    legacy, legacy_flows = shedding_server(legacy_runs, [True])
    async with Client(legacy, mode="legacy") as client:
        assert text_of(await client.call_tool("chain", {})) == "one+two+three+four"
    assert legacy_flows.shedder.shed == 0 and legacy_runs == Counter(one=1, two=1, three=1, four=1)


CLAUDE_AI = t.Implementation(name="Anthropic/ClaudeAI", version="1.0.0")
"""The claude.ai connector's clientInfo: it shows a state-only result as an error and never
resends it (https://github.com/anthropics/claude-ai-mcp/issues/1027)."""


async def test_a_client_that_does_not_resend_is_never_shed() -> None:
    runs: Counter[str] = Counter()
    server, flows = shedding_server(runs, [True])
    async with Client(server, client_info=CLAUDE_AI) as client:
        # Driven by hand: the first answer is what such a host would show its user.
        result = await client.session.call_tool("chain", {}, allow_input_required=True)
    assert isinstance(result, t.CallToolResult), "never a state-only result to a host that will not resend it"
    assert text_of(result) == "one+two+three+four"
    assert flows.shedder.shed == 0 and flows.shedder.kept == 1, "the over-signal round ran on, counted once"
    assert runs == Counter(one=1, two=1, three=1, four=1)


async def test_shed_clients_chooses_who_is_shed_to() -> None:
    def ours(info: t.Implementation | None, capabilities: t.ClientCapabilities | None) -> bool:
        return info is not None and info.name.startswith("acme-")

    runs: Counter[str] = Counter()
    server, flows = shedding_server(runs, [True], shed_clients=ours)
    async with Client(server, client_info=t.Implementation(name="acme-agent", version="1")) as client:
        first = await client.session.call_tool("chain", {}, allow_input_required=True)
        assert isinstance(first, t.InputRequiredResult) and not first.input_requests, "acme's agent resends"
    async with Client(server) as client:  # the SDK's default name, which the default policy sheds to
        assert text_of(await client.session.call_tool("chain", {}, allow_input_required=True)) == ("one+two+three+four")
    assert flows.shedder.shed == 1 and flows.shedder.kept == 1


async def test_a_faulty_shed_clients_policy_runs_the_round_on() -> None:
    def broken(info: t.Implementation | None, capabilities: t.ClientCapabilities | None) -> bool:
        raise RuntimeError("policy bug")

    runs: Counter[str] = Counter()
    server, flows = shedding_server(runs, [True], shed_clients=broken)
    async with Client(server) as client:
        result = await client.session.call_tool("chain", {}, allow_input_required=True)
    assert text_of(result) == "one+two+three+four" and flows.shedder.shed == 0


def test_the_default_policy_sheds_only_to_clients_known_to_resend() -> None:
    opted_in = t.ClientCapabilities(extensions={SHEDDING_EXTENSION: {}})
    assert resends_state_only(t.Implementation(name="anything", version="1"), opted_in)
    assert resends_state_only(t.Implementation(name="mcp", version="0.1.0"), None), "the Python SDK's default"
    assert not resends_state_only(CLAUDE_AI, t.ClientCapabilities())
    assert not resends_state_only(None, None), "an anonymous client may be a host that shows it as an error"
    assert client_module.SHEDDING_EXTENSION == SHEDDING_EXTENSION, "the client declares the key the server reads"


def test_signal_options() -> None:
    assert LoadShedder.from_options(None, None, None) is None
    shedder = LoadShedder(max_inflight_rounds=2)
    with shedder.round(), shedder.round():
        assert not shedder.overloaded()
        with shedder.round():
            assert shedder.overloaded() and shedder.inflight == 3
    assert shedder.inflight == 0 and not shedder.overloaded()
    with pytest.raises(ValueError):
        LoadShedder(max_inflight_rounds=0)


async def test_loop_lag_signal_sees_a_blocked_loop() -> None:
    import time

    shedder = LoadShedder(max_loop_lag=0.1)
    with shedder.round():
        await asyncio.sleep(0.12)  # let the sampler start and take a sample
        assert not shedder.overloaded()
        time.sleep(0.3)  # block the event loop, as CPU-bound work would
        await asyncio.sleep(0.01)
        assert shedder.lag >= 0.2 and shedder.overloaded()


@pytest.mark.spawns
async def test_shed_under_real_load_across_instances(tmp_path: Path) -> None:
    """A busy instance sheds `work` after step a; the client resumes it on the idle instance."""
    audit = tmp_path / "audit.jsonl"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": f"sqlite:///{tmp_path / 'tasks.db'}",
        "MRTR_AUDIT": str(audit),
        "MRTR_MAX_INFLIGHT": "1",
    }
    specs = [
        ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix="task-server ready:")
        for label in ("A", "B")
    ]
    with spawn_servers(specs, tmp_path) as servers:
        async with Client(servers["A"].url) as on_a, Client(servers["B"].url) as on_b:
            hog = asyncio.create_task(on_a.call_tool("hog", {"seconds": 3.0}))  # one round in flight on A
            for _ in range(100):
                if audit.exists() and "hog" in audit.read_text():
                    break
                await asyncio.sleep(0.02)
            # A is over its limit of 1 round: `work` runs step a, then sheds before step b.
            shed = await on_a.session.call_tool("work", {"slow": 0}, allow_input_required=True)
            assert isinstance(shed, t.InputRequiredResult) and not shed.input_requests
            # The shed state carries on at the other instance, which has no load.
            done = await on_b.session.call_tool("work", {"slow": 0}, request_state=shed.request_state)
            assert text_of(done) == "a done, b done"
            # With the official client's own retries, on A itself, while still loaded:
            retried = await on_a.call_tool("work", {"slow": 0})
            assert text_of(retried) == "a done, b done"
            assert not hog.done(), "A was loaded throughout"
            # A host that shows a state-only result as an error: never shed, the round runs on.
            async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
                reply = await http.post(servers["A"].url, json=as_claude_ai("work", {"slow": 0}), headers=HEADERS)
            assert reply.status_code == 200, reply.text
            body = reply.json() if "json" in reply.headers["content-type"] else sse_result(reply.text)
            assert body["result"].get("resultType", "complete") == "complete", body
            assert body["result"]["content"][0]["text"] == "a done, b done"
            # mrtr's client under a name of its own: it declares `mrtr/shedding`, so it is shed to.
            named = {"client_info": t.Implementation(name="acme-agent", version="1")}
            async with FlowClient(servers["A"].url, client_options=named) as flows:
                assert text_of(await flows.call_tool("work", {"slow": 0})) == "a done, b done"
            load_a = (await on_a.call_tool("load", {})).structured_content
            assert load_a is not None and load_a["shed"] == 3, "the three calls of resending clients were shed once"
            assert load_a["kept"] == 1, "the host that does not resend was not"
            assert text_of(await hog) == "hog done"
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    starts = Counter((e["step"], e["instance"]) for e in entries if e["phase"] == "start")
    by_key = Counter(e["key"] for e in entries if e["phase"] == "start" and e["step"] == "a")
    assert starts[("a", "A")] == 4 and starts[("b", "B")] == 1, starts
    assert all(n == 1 for n in by_key.values()), "no step a ran twice within one flow"


HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2026-07-28",
    "mcp-method": "tools/call",
    "mcp-name": "work",
}


def as_claude_ai(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A `tools/call` as claude.ai's connector sends it: its clientInfo, no `mrtr/shedding`."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": CLAUDE_AI.model_dump(),
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": tool, "arguments": arguments, "_meta": meta}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def sse_result(text: str) -> dict[str, Any]:
    for line in text.splitlines():
        if line.startswith("data:") and '"id"' in line:
            return json.loads(line.removeprefix("data:"))  # type: ignore[no-any-return]
    raise AssertionError(f"no answer in the stream: {text[:200]}")


async def test_shedding_inside_gather_loses_no_step() -> None:
    runs: Counter[str] = Counter()
    server = new_server()
    flows = mrtr.Flows(server, shed_when=lambda: True)

    async def work(name: str) -> str:
        runs[name] += 1  # no await inside: a shed point is reached with no step of the round running
        return name

    async def branch(ctx: mrtr.FlowContext, prefix: str) -> str:
        return "".join([await ctx.step(f"{prefix}{i}", work, f"{prefix}{i}") for i in range(3)])

    @flows.tool()
    async def fan(ctx: mrtr.FlowContext) -> str:
        """Two branches of three steps each, side by side."""
        left, right = await ctx.gather(branch(ctx, "l"), branch(ctx, "r"))
        return f"{left}|{right}"

    async with Client(server) as client:
        result = await client.call_tool("fan", {})
    assert text_of(result) == "l0l1l2|r0r1r2"
    assert runs == Counter({f"{p}{i}": 1 for p in "lr" for i in range(3)}), "every step ran exactly once"
    assert flows.shedder.shed >= 2
