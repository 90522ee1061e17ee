"""`mrtr.testing.replay_export` on tasks run by a real task runtime, on both hosts (#38).

Each test runs a task to some point (completed, waiting for an answer, ended by a step that
raised), exports its record as `mrtr tasks export` would, and replays the JSON document against
the same code (it must replay) and against an edited copy (it must name the entry it parts at,
or replay cleanly when the edit is one the engine tolerates).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import pytest
from fastmcp import Context, FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
import mrtr.fastmcp
from mrtr.client import TasksClient, tasks_client, update_task
from mrtr.stores._sqlite import SQLiteStore
from mrtr.tasks import export_task
from mrtr.testing import ReplayDiverged, replay_export
from tests.support.flowkit import SHARED_KEY, new_server, served, task_state

pytestmark = pytest.mark.anyio


class Approve(BaseModel):
    ok: bool


async def _never(*args: Any) -> Any:
    raise AssertionError("answered through tasks/update")


async def exported(flows: Any, task_id: str) -> dict[str, Any]:
    """The task's export document, through JSON (as a file would carry it)."""
    record = await flows.runtime.store.load(task_id, time.time())
    assert record is not None and not record.sealed
    return dict(json.loads(json.dumps(export_task(record))))


async def run_task(flows: Any, tool: str, arguments: dict[str, Any], answers: dict[str, bool], until: str) -> str:
    """Run `tool` as a task in process, answering asks by message fragment, until status `until`."""
    async with Client(flows.server, extensions=[TasksClient(_never)], elicitation_callback=_never) as client:
        created = await client.session.call_tool(tool, arguments, allow_claimed=True)
        task_id = str(created.task_id)
        answered: set[str] = set()
        async with asyncio.timeout(10):
            while True:
                task = await task_state(client.session, task_id)
                given = {
                    key: {"action": "accept", "content": {"ok": answers[fragment]}}
                    for key, request in task.get("inputRequests", {}).items()
                    for fragment in answers
                    if fragment in request["params"]["message"] and key not in answered
                }
                if given and task["status"] == "input_required":
                    await update_task(client.session, task_id, given)
                    answered |= given.keys()
                elif task["status"] == until and (until != "completed" or "result" in task):
                    return task_id
                await asyncio.sleep(0.05)


def sdk_flows(build: Callable[[mrtr.Flows], None]) -> mrtr.Flows:
    flows = mrtr.Flows(new_server("replay-export"), store=SQLiteStore(":memory:"), task_poll_interval=0.05)
    build(flows)
    return flows


async def test_a_task_waiting_for_an_answer_replays_to_the_same_ask_and_a_reworded_one_does_not() -> None:
    ran: Counter[str] = Counter()

    def version(question: str) -> Callable[[mrtr.Flows], None]:
        def build(flows: mrtr.Flows) -> None:
            @flows.tool(task="required")
            async def deploy(ctx: mrtr.FlowContext, service: str) -> str:
                built = await ctx.step("build", lambda: ran.update(["build"]) or f"image-{service}")
                first = await ctx.elicit(f"Deploy {built} to staging?", Approve)
                second = await ctx.elicit(question.format(built=built), Approve)
                return f"{first.ok} {second.ok}"

        return build

    original = sdk_flows(version("Deploy {built} to production?"))
    task_id = await run_task(original, "deploy", {"service": "api"}, {"staging": True}, "input_required")
    document = await exported(original, task_id)
    assert [e["kind"] for e in document["journal"]["entries"]] == ["step", "answer", "ask"]
    report = await replay_export(original, document)
    assert report.ok and report.used == 3 and "waits for the same answer" in report.reached, report.explain()
    assert ran == Counter(build=1), "the replay ran no step"
    reworded = sdk_flows(version("Ship {built} to production?"))
    with pytest.raises(ReplayDiverged) as diverged:
        await replay_export(reworded, document)
    divergence = diverged.value.report.divergence
    assert divergence is not None and divergence.index == 2 and divergence.entry is not None
    assert divergence.entry["kind"] == "ask" and "Ship image-api to production?" in divergence.code
    assert "entry 2 (ask " in str(diverged.value)


async def test_reordering_two_asks_replays_cleanly_and_a_changed_result_does_not() -> None:
    def version(swap: bool, suffix: str = "") -> Callable[[mrtr.Flows], None]:
        def build(flows: mrtr.Flows) -> None:
            @flows.tool(task="required")
            async def trip(ctx: mrtr.FlowContext) -> str:
                if swap:
                    hotel = await ctx.elicit("Book the hotel?", Approve)
                    flight = await ctx.elicit("Book the flight?", Approve)
                else:
                    flight = await ctx.elicit("Book the flight?", Approve)
                    hotel = await ctx.elicit("Book the hotel?", Approve)
                return f"flight={flight.ok} hotel={hotel.ok}{suffix}"

        return build

    original = sdk_flows(version(swap=False))
    task_id = await run_task(original, "trip", {}, {"flight": True, "hotel": False}, "completed")
    document = await exported(original, task_id)
    assert (await replay_export(original, document)).reached == "completes with the same result"
    swapped = await replay_export(sdk_flows(version(swap=True)), document)
    assert swapped.ok and swapped.used == 2, "answers are keyed by their question, not their order"
    with pytest.raises(ReplayDiverged, match=r"at the task's end: .*flight=True hotel=False!"):
        await replay_export(sdk_flows(version(swap=False, suffix="!")), document)


async def test_a_task_whose_step_raised_replays_up_to_that_step(caplog: pytest.LogCaptureFixture) -> None:
    def build(flows: mrtr.Flows) -> None:
        def charge() -> str:
            raise RuntimeError("card declined")

        @flows.tool(task="required")
        async def order(ctx: mrtr.FlowContext) -> str:
            await ctx.step("reserve", lambda: "reserved")
            return str(await ctx.step("charge", charge))

        @flows.tool(task="required")
        async def crash(ctx: mrtr.FlowContext) -> str:
            reserved = await ctx.step("reserve", lambda: "reserved")
            raise RuntimeError(f"bug after {reserved}")

    flows = sdk_flows(build)
    task_id = await run_task(flows, "order", {}, {}, "completed")
    document = await exported(flows, task_id)
    assert document["result"]["isError"]
    report = await replay_export(flows, document)
    assert report.ok and "stops before step 'charge', which raised" in report.reached, report.explain()
    crashed = await exported(flows, await run_task(flows, "crash", {}, {}, "completed"))
    caplog.clear()
    report = await replay_export(flows, crashed)
    assert report.ok and report.reached == "fails with the same tool error", report.explain()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], "a replay reports the error, it logs nothing"


@pytest.mark.parametrize("style", ["fastmcp", "mrtr"])
async def test_a_fastmcp_task_replays_and_a_reworded_question_diverges(style: str) -> None:
    runs: Counter[str] = Counter()

    def server(question: str) -> tuple[FastMCP[Any], mrtr.fastmcp.Flows]:
        mcp: FastMCP[Any] = FastMCP("fm-replay", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
        flows = mrtr.fastmcp.Flows(mcp, store=SQLiteStore(":memory:"), task_poll_interval=0.05)
        if style == "fastmcp":

            @flows.tool(task="required")
            async def publish(job: str, ctx: Context) -> str:
                data = await mrtr.step("fetch", lambda: runs.update(["fetch"]) or f"DATA({job})")
                ok = await ctx.elicit(question.format(data=data), response_type=bool)
                return f"published {data}" if isinstance(ok, AcceptedElicitation) and ok.data else "no"

        else:

            @flows.tool(task="required")
            async def publish(job: str, ctx: mrtr.FlowContext) -> str:  # type: ignore[misc]
                data = await ctx.step("fetch", lambda: runs.update(["fetch"]) or f"DATA({job})")
                ok = await ctx.elicit(question.format(data=data), Approve)
                return f"published {data}" if ok.ok else "no"

        return mcp, flows

    async def yes(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return t.ElicitResult(action="accept", content={"value": True} if style == "fastmcp" else {"ok": True})

    mcp, flows = server("Publish {data}?")
    async with (
        served(mcp) as url,
        httpx2.AsyncClient(trust_env=False, timeout=20.0) as http,
        tasks_client(streamable_http_client(url, http_client=http), elicitation_callback=yes) as client,
    ):
        result = await client.call_tool("publish", {"job": "j1"})
        assert result.content[0].text == "published DATA(j1)"
        [record] = (await flows.runtime.store.list_tasks(mrtr.stores.TaskQuery(), time.time())).records
        document = await exported(flows, record.task_id)
    assert runs == Counter(fetch=1)
    report = await replay_export(flows, document)
    assert report.ok and report.reached == "completes with the same result", report.explain()
    _, edited = server("Publish {data} now?")
    with pytest.raises(ReplayDiverged) as diverged:
        await replay_export(edited, document)
    assert "entry 1 (answer " in str(diverged.value) and "Publish DATA(j1) now?" in str(diverged.value)
    assert runs == Counter(fetch=1), "replays ran no step"


@pytest.mark.parametrize("attr", ["flows", "mcp"])
def test_the_cli_finds_the_flows_from_the_server_it_wraps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attr: str
) -> None:
    from mrtr.cli._errors import UsageError
    from mrtr.cli._replay import find_flows

    module = f"fm_app_{attr}"
    (tmp_path / f"{module}.py").write_text(
        "from fastmcp import FastMCP\nimport mrtr.fastmcp\n"
        "mcp = FastMCP('found')\nflows = mrtr.fastmcp.Flows(mcp)\nother = object()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = find_flows(f"{module}:{attr}")
    assert isinstance(found, mrtr.fastmcp.Flows) and found.mcp.name == "found"
    with pytest.raises(UsageError, match="no mrtr Flows wrap it"):
        find_flows(f"{module}:other")
    with pytest.raises(UsageError, match="has no attribute"):
        find_flows(f"{module}:missing")


async def test_a_task_parked_on_an_event_replays_to_the_same_wait_and_a_renamed_event_diverges() -> None:
    def version(event: str) -> Callable[[mrtr.Flows], None]:
        def build(flows: mrtr.Flows) -> None:
            @flows.tool(task="required")
            async def release(ctx: mrtr.FlowContext) -> str:
                await ctx.step("build", lambda: "built")
                return str(await ctx.wait_for_event(event))

        return build

    flows = sdk_flows(version("ci"))
    async with Client(flows.server, extensions=[TasksClient(_never)]) as client:
        created = await client.session.call_tool("release", {}, allow_claimed=True)
        async with asyncio.timeout(10):
            while not (await flows.runtime.store.load(created.task_id, time.time())).waiting:  # type: ignore[attr-defined]
                await asyncio.sleep(0.05)
    document = await exported(flows, created.task_id)
    assert [e["kind"] for e in document["journal"]["entries"]] == ["step", "event"]
    report = await replay_export(flows, document)
    assert report.ok and report.reached == "waits on the same '@event.ci'", report.explain()
    renamed = r"entry 1 \(event '@event.ci'\): the journal holds an event wait .*; the code waits on '@event.deploy' "
    with pytest.raises(ReplayDiverged, match=renamed):
        await replay_export(sdk_flows(version("deploy")), document)
