"""Durable waits on the Temporal engine: timers are Temporal timers, events are Workflow Updates.

In-process MCP servers (the official client against `Flows(tasks=TemporalTasks(...))`) on the
session's Temporal dev server, plus one real fleet whose every process is SIGKILLed while a
task sleeps.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from temporalio.client import Client as TemporalClient

import mrtr
from mrtr.client import TasksClient
from mrtr.temporal import TemporalTasks
from tests.support.flowkit import task_state
from tests.support.temporalkit import unique_queue

pytestmark = [pytest.mark.anyio, pytest.mark.needs_temporal]


async def _never(*args: Any) -> Any:
    raise AssertionError("these flows ask nothing")


def waiting_flows(temporal: TemporalClient, runs: Counter[str], public_url: str | None = None) -> mrtr.Flows:
    server = MCPServer("temporal-waits", request_state_security=RequestStateSecurity(keys=[secrets.token_bytes(32)]))
    engine = TemporalTasks(temporal, task_queue=unique_queue("waits"))
    flows = mrtr.Flows(server, tasks=engine, task_poll_interval=0.05, public_url=public_url)

    @flows.tool(task="required")
    async def nap(seconds: float, ctx: mrtr.FlowContext) -> str:
        await ctx.step("before", lambda: runs.update(["before"]))
        await ctx.sleep(seconds)
        await ctx.step("after", lambda: runs.update(["after"]))
        return "rested"

    @flows.tool(task="required")
    async def await_ci(ctx: mrtr.FlowContext, timeout: float | None = None) -> str:
        try:
            first = await ctx.wait_for_event("ci", timeout=timeout)
        except mrtr.EventTimeout as exc:
            return f"timeout: {exc}"
        second = await ctx.wait_for_event("ci", timeout=0.5 if timeout else None)
        await ctx.step("deploy", lambda: runs.update(["deploy"]))
        return f"{first} then {second}"

    @flows.tool(task="required")
    async def hooked(ctx: mrtr.FlowContext) -> str:
        url = await ctx.callback_url("ci")
        await ctx.step("hand-out", lambda: runs.update(["url:" + url]))
        payload = await ctx.wait_for_event("ci")
        return f"ci says {payload['status']}"

    return flows


@pytest.fixture
async def temporal(temporal_address: str) -> TemporalClient:
    return await TemporalClient.connect(temporal_address)


async def wait_status(session: Any, task_id: str, status: str, timeout: float = 20.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.05)


async def start(client: Client, tool: str, args: dict[str, Any]) -> str:
    created = await client.session.call_tool(tool, args, allow_claimed=True)
    return str(created.task_id)


async def test_a_sleep_is_a_temporal_timer(temporal: TemporalClient) -> None:
    runs: Counter[str] = Counter()
    flows = waiting_flows(temporal, runs)
    async with Client(flows.server, extensions=[TasksClient(_never)]) as client:
        began = time.time()
        task_id = await start(client, "nap", {"seconds": 2.0})
        await asyncio.sleep(1.0)
        parked = await task_state(client.session, task_id)
        assert parked["status"] == "working" and parked["statusMessage"].startswith("sleeping until ")
        assert parked["_meta"]["mrtr/waiting"][0]["kind"] == "timer"
        done = await wait_status(client.session, task_id, "completed")
        elapsed = time.time() - began
    assert done["result"]["content"][0]["text"] == "rested" and runs == Counter(before=1, after=1)
    assert 2.0 <= elapsed < 6.0, elapsed
    history = temporal.get_workflow_handle(task_id).fetch_history_events()
    kinds = {event.WhichOneof("attributes") async for event in history}
    assert "timer_started_event_attributes" in kinds, "the sleep is a durable Temporal timer"
    await flows.runtime.close()


async def test_events_early_duplicate_and_late_and_timeouts(temporal: TemporalClient) -> None:
    runs: Counter[str] = Counter()
    flows = waiting_flows(temporal, runs)
    async with Client(flows.server, extensions=[TasksClient(_never)]) as client:
        task_id = await start(client, "await_ci", {})
        # Two events before any wait: both kept, each consumed by exactly one wait.
        assert await flows.send_event(task_id, "ci", "one", event_id="e1")
        assert not await flows.send_event(task_id, "ci", "one again", event_id="e1"), "a duplicate id changes nothing"
        await asyncio.sleep(1.0)
        assert await flows.send_event(task_id, "ci", "two", event_id="e2")
        done = await wait_status(client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "one then two" and runs == Counter(deploy=1)
        with pytest.raises(mrtr.EventNotDelivered) as late:
            await flows.send_event(task_id, "ci", "three")
        assert late.value.reason == "task_finished"
        with pytest.raises(mrtr.EventNotDelivered) as unknown:
            await flows.send_event("no-such-task", "ci", None)
        assert unknown.value.reason == "unknown_task"
        began = time.time()
        timing_out = await start(client, "await_ci", {"timeout": 1.5})
        timed_out = await wait_status(client.session, timing_out, "completed")
        late_by = time.time() - began - 1.5
    assert timed_out["result"]["content"][0]["text"] == "timeout: no event 'ci' arrived within 1.5s"
    assert 0 <= late_by < 3.0, late_by
    await flows.runtime.close()


async def test_a_callback_url_delivers_once_on_temporal(temporal: TemporalClient) -> None:
    runs: Counter[str] = Counter()
    flows = waiting_flows(temporal, runs, public_url="http://temporal-waits.test")
    app = flows.streamable_http_app()
    async with Client(flows.server, extensions=[TasksClient(_never)]) as client:
        task_id = await start(client, "hooked", {})

        async def handed_out() -> str:
            while True:
                urls = [key[4:] for key in runs if key.startswith("url:")]
                if urls:
                    return urls[0]
                await asyncio.sleep(0.05)

        url = await asyncio.wait_for(handed_out(), 20)
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
            path = url.removeprefix("http://temporal-waits.test")
            assert (await http.post(path + "x", json={"status": "passed"})).status_code == 403
            assert (await http.post(path, json={"status": "passed"})).status_code == 202
            # Refused either way: 409 while the task still runs (the event id is taken), 410 once the
            # event already finished it (Temporal's worker may complete it before the second POST lands).
            assert (await http.post(path, json={"status": "passed"})).status_code in (409, 410)
        done = await wait_status(client.session, task_id, "completed")
    assert done["result"]["content"][0]["text"] == "ci says passed"
    await flows.runtime.close()


@pytest.mark.spawns
async def test_a_sleeping_task_outlives_every_process_of_the_fleet(temporal_address: str, tmp_path: Path) -> None:
    """The workers that started a 3 s sleep are SIGKILLed; a fresh fleet finishes it."""
    from tests.fleet.test_temporal import Fleet, client, kill

    fleet = Fleet(temporal_address, tmp_path)
    with fleet.run(["A", "B"]) as first:
        async with client(first["A"].url) as on_a:
            created = await on_a.session.call_tool("nap", {"seconds": 3.0}, allow_claimed=True)
            task_id = created.task_id
            parked = await wait_status(on_a.session, task_id, "working")
            assert parked["status"] == "working"
            await asyncio.sleep(0.5)
        for server in first.values():
            kill(server)
    with fleet.run(["C"]) as second:
        async with client(second["C"].url) as on_c:
            done = await wait_status(on_c.session, task_id, "completed", timeout=30)
    assert done["result"]["content"][0]["text"] == "rested"
    assert len(fleet.steps("nap.before")) == 1 and len(fleet.steps("nap.after")) == 1


async def test_temporal_history_holds_no_plaintext_of_a_sealed_task(temporal: TemporalClient) -> None:
    """Sealed at rest on Temporal (#36): the engine's payload codec seals what Temporal keeps."""
    tag = secrets.token_hex(5)
    argument, event, result = f"ARG{tag}", f"EVENT{tag}", f"STEP{tag}"
    flows = waiting_flows(temporal, Counter())

    @flows.tool(task="required")
    async def sealed_job(city: str, ctx: mrtr.FlowContext) -> str:
        stepped = await ctx.step("lookup", lambda: f"STEP{city.removeprefix('ARG')}")
        paid = await ctx.wait_for_event("paid")
        return f"{stepped}+{paid}"

    async with Client(flows.server, extensions=[TasksClient(_never)]) as client:
        task_id = await start(client, "sealed_job", {"city": argument})
        await asyncio.sleep(0.5)
        assert await flows.send_event(task_id, "paid", event)
        done = await wait_status(client.session, task_id, "completed")
    assert done["result"]["content"][0]["text"] == f"{result}+{event}", "the engine opens what it sealed"
    raw = temporal.get_workflow_handle(task_id)  # a client without the codec, as `temporal workflow show` reads
    history = b"".join([e.SerializeToString() async for e in raw.fetch_history_events()])
    assert b"binary/mrtr-sealed" in history and b"mrtr.task" in history, "what Temporal keeps is the codec's"
    leaked = [text for text in (argument, event, result) if text.encode() in history]
    assert leaked == [], f"plain text in Temporal's history: {leaked}"
    await flows.runtime.close()


async def test_a_steps_progress_is_the_tasks_status_message_on_temporal(temporal: TemporalClient) -> None:
    """`ctx.report_progress` in a task on Temporal: the workflow records it (memo: `tasks/get`) while the step runs."""
    flows = waiting_flows(temporal, Counter())
    gates = {n: asyncio.Event() for n in (1, 2, 3)}

    async def chunk(n: int) -> int:
        await gates[n].wait()
        return n

    @flows.tool(task="required")
    async def chunks(ctx: mrtr.FlowContext) -> str:
        for n in (1, 2, 3):
            await ctx.report_progress(n, 3, f"chunk {n} of 3")
            await ctx.step(f"chunk-{n}", chunk, n)
        return "3 chunks"

    async with Client(flows.server, extensions=[TasksClient(_never)]) as client:
        task_id = await start(client, "chunks", {})
        for n in (1, 2, 3):
            async with asyncio.timeout(20):
                while (task := await task_state(client.session, task_id)).get("statusMessage") != f"chunk {n} of 3":
                    assert task["status"] == "working", task
                    await asyncio.sleep(0.05)
            gates[n].set()
        done = await wait_status(client.session, task_id, "completed")
    assert done["result"]["content"][0]["text"] == "3 chunks"
    await flows.runtime.close()
