"""Durable waits in one process: ctx.sleep, ctx.wait_for_event, send_event, callback URLs, plain tasks."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from typing import Any

import httpx2 as httpx
import mcp_types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr._engine.journal import decode
from mrtr.client import TasksClient, cancel_task
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import SHARED_KEY, new_server, task_state

pytestmark = pytest.mark.anyio


class Confirm(BaseModel):
    ok: bool


def waiting_server(runs: Counter[str], store: SQLiteStore | None = None, **options: Any) -> tuple[Any, mrtr.Flows]:
    server = new_server("waits-under-test")
    flows = mrtr.Flows(
        server,
        store=store or SQLiteStore(":memory:"),
        task_poll_interval=0.05,
        task_scan_interval=0.2,
        public_url="http://127.0.0.1:9/",
        **options,
    )

    @flows.tool(task="required")
    async def nap(seconds: float, ctx: mrtr.FlowContext) -> str:
        await ctx.step("before", lambda: runs.update(["before"]))
        await ctx.sleep(seconds)
        await ctx.step("after", lambda: runs.update(["after"]))
        return "rested"

    @flows.tool(task="required")
    async def await_ci(ctx: mrtr.FlowContext, timeout: float | None = None) -> str:
        try:
            payload = await ctx.wait_for_event("ci", timeout=timeout)
        except mrtr.EventTimeout as exc:
            return f"timeout: {exc}"
        await ctx.step("deploy", lambda: runs.update(["deploy"]))
        return f"ci said {payload['status']}"

    @flows.tool(task="required")
    async def two_events(ctx: mrtr.FlowContext) -> str:
        a, b = await ctx.gather(ctx.wait_for_event("a"), ctx.wait_for_event("b"))
        return f"{a}+{b}"

    @flows.tool(task="required")
    async def first_of(ctx: mrtr.FlowContext) -> str:
        approve = asyncio.ensure_future(ctx.wait_for_event("approve"))
        reject = asyncio.ensure_future(ctx.wait_for_event("reject"))
        done, pending = await asyncio.wait({approve, reject}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        winner = "approve" if approve in done else "reject"
        await ctx.step("record", lambda: runs.update([winner]))
        return winner

    @flows.tool(task="required")
    async def hooked(ctx: mrtr.FlowContext) -> str:
        url = await ctx.callback_url("ci")
        await ctx.step("hand-out", lambda: runs.update(["url:" + url]))
        payload = await ctx.wait_for_event("ci")
        ok = await ctx.elicit(f"CI says {payload['status']}. Deploy?", Confirm)
        return "deployed" if ok.ok else "held"

    @flows.tool(task="optional")
    async def quick(ctx: mrtr.FlowContext) -> str:
        await ctx.sleep(0.1)
        return "slept"

    @flows.tool(task="required")
    async def export(rows: int) -> str:
        runs.update(["export"])
        key = mrtr.current_step().idempotency_key
        return f"{rows} rows under {key.split(':')[1]}"

    return server, flows


async def wait_status(session: Any, task_id: str, status: str, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.02)


def tasks_client(server: Any) -> Client:
    return Client(server, extensions=[TasksClient(_no_answers)], elicitation_callback=_no_answers)


async def _no_answers(request: Any) -> Any:
    raise AssertionError("this test answers through tasks/update itself")


async def start(client: Client, tool: str, args: dict[str, Any]) -> str:
    created = await client.session.call_tool(tool, args, allow_claimed=True)
    return str(created.task_id)


async def test_sleep_parks_the_task_working_then_carries_on() -> None:
    runs: Counter[str] = Counter()
    store = SQLiteStore(":memory:")
    server, _ = waiting_server(runs, store)
    async with tasks_client(server) as client:
        began = time.time()
        task_id = await start(client, "nap", {"seconds": 1.0})
        await asyncio.sleep(0.3)
        parked = await task_state(client.session, task_id)
        assert parked["status"] == "working" and parked["statusMessage"].startswith("sleeping until ")
        record = await store.load(task_id, time.time())
        assert record is not None and record.lease_owner is None, "the worker let go of the sleeping task"
        assert record.waiting == [{"kind": "timer", "name": None, "until": pytest.approx(began + 1.0, abs=0.3)}]
        done = await wait_status(client.session, task_id, "completed")
        assert time.time() - began >= 1.0
    assert done["result"]["content"][0]["text"] == "rested"
    assert runs == Counter(before=1, after=1)


async def test_an_event_wakes_the_task_and_an_early_event_is_kept() -> None:
    runs: Counter[str] = Counter()
    server, flows = waiting_server(runs)
    async with tasks_client(server) as client:
        task_id = await start(client, "await_ci", {})
        await asyncio.sleep(0.2)
        parked = await task_state(client.session, task_id)
        assert parked["status"] == "working" and "waiting for event 'ci'" in parked["statusMessage"]
        assert await flows.send_event(task_id, "ci", {"status": "green"}, event_id="build-1")
        done = await wait_status(client.session, task_id, "completed", timeout=2)
        assert done["result"]["content"][0]["text"] == "ci said green"
        # A resend of the same event id changes nothing; a finished task refuses new events.
        assert not await flows.send_event(task_id, "ci", {"status": "green"}, event_id="build-1")
        with pytest.raises(mrtr.EventNotDelivered) as refused:
            await flows.send_event(task_id, "ci", {"status": "red"})
        assert refused.value.reason == "task_finished"
        with pytest.raises(mrtr.EventNotDelivered) as unknown:
            await flows.send_event("no-such-task", "ci", {})
        assert unknown.value.reason == "unknown_task"
    assert runs == Counter(deploy=1)


async def test_event_before_the_wait_is_delivered_once() -> None:
    runs: Counter[str] = Counter()
    server, flows = waiting_server(runs)
    async with tasks_client(server) as client:
        task_id = await start(client, "two_events", {})
        # "b" first, while the flow waits for both: kept until its wait takes it.
        await flows.send_event(task_id, "b", "B1")
        await flows.send_event(task_id, "b", "B2")  # a second "b": nobody waits for it
        await flows.send_event(task_id, "a", "A1")
        done = await wait_status(client.session, task_id, "completed", timeout=3)
    assert done["result"]["content"][0]["text"] == "A1+B1"


async def test_first_of_two_events_replays_the_same_way() -> None:
    runs: Counter[str] = Counter()
    server, flows = waiting_server(runs)
    async with tasks_client(server) as client:
        task_id = await start(client, "first_of", {})
        await asyncio.sleep(0.2)
        await flows.send_event(task_id, "reject", {})
        done = await wait_status(client.session, task_id, "completed", timeout=3)
    assert done["result"]["content"][0]["text"] == "reject"
    assert runs == Counter(reject=1)


async def test_event_timeout_fires() -> None:
    server, _ = waiting_server(Counter())
    async with tasks_client(server) as client:
        began = time.time()
        task_id = await start(client, "await_ci", {"timeout": 0.8})
        done = await wait_status(client.session, task_id, "completed", timeout=5)
        elapsed = time.time() - began
    assert done["result"]["content"][0]["text"] == "timeout: no event 'ci' arrived within 0.8s"
    assert 0.8 <= elapsed < 3.0


async def test_sleep_outside_a_task_names_task() -> None:
    server, _ = waiting_server(Counter())
    async with Client(server) as plain:
        with pytest.raises(MCPError) as refused:
            await plain.call_tool("quick", {})
    assert "ctx.sleep()" in refused.value.error.message and "task='required'" in refused.value.error.message


async def test_plain_function_runs_as_a_task() -> None:
    runs: Counter[str] = Counter()
    server, _ = waiting_server(runs)
    async with tasks_client(server) as client:
        result = await client.call_tool("export", {"rows": 3})
    assert result.content[0].text == "3 rows under run" and runs == Counter(export=1)


async def test_callback_url_is_single_use_and_bound() -> None:
    runs: Counter[str] = Counter()
    server, flows = waiting_server(runs)
    app = flows.streamable_http_app()
    async with tasks_client(server) as client:
        task_id = await start(client, "hooked", {})
        other_id = await start(client, "hooked", {})
        await asyncio.sleep(0.3)
        urls = sorted(k[4:] for k in runs if k.startswith("url:"))
        assert len(urls) == 2
        mine = next(u for u in urls if f"/{task_id}/" in u)
        theirs = next(u for u in urls if f"/{other_id}/" in u)
        path = mine.removeprefix("http://127.0.0.1:9")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            tampered = path[:-3] + ("AAA" if not path.endswith("AAA") else "BBB")
            assert (await http.post(tampered, json={"status": "green"})).status_code == 403
            foreign = path.replace(f"/{task_id}/", f"/{other_id}/")
            assert (await http.post(foreign, json={"status": "green"})).status_code == 403
            assert (await http.post(path, content=b"{not json")).status_code == 400
            ok = await http.post(path, json={"status": "green"})
            assert ok.status_code == 202, ok.text
            assert (await http.post(path, json={"status": "green"})).status_code == 409
        asking = await wait_status(client.session, task_id, "input_required", timeout=3)
        (request,) = asking["inputRequests"].values()
        assert request["params"]["message"].startswith("CI says green.")
        other = await task_state(client.session, other_id)
        assert other["status"] == "working", "nothing reached the other task"
        assert theirs != mine


async def test_waits_are_journaled() -> None:
    store = SQLiteStore(":memory:")
    server, flows = waiting_server(Counter(), store)
    async with tasks_client(server) as client:
        task_id = await start(client, "await_ci", {})
        await asyncio.sleep(0.2)
        await flows.send_event(task_id, "ci", {"status": "green"}, event_id="e1")
        await wait_status(client.session, task_id, "completed")
    record = await flows.runtime.store.load(task_id, time.time())  # opened: the store holds it sealed at rest
    assert record is not None and record.inbox == [] and record.event_ids == ["e1"]
    steps = decode(record.journal).steps
    assert steps["@event.ci"][1] == {"due": None, "done": 1, "id": "e1", "data": {"status": "green"}}


async def test_bad_event_input_is_refused_precisely() -> None:
    server, flows = waiting_server(Counter())
    async with tasks_client(server) as client:
        task_id = await start(client, "await_ci", {})
        with pytest.raises(ValueError, match="event name"):
            await flows.send_event(task_id, "no spaces", {})
        with pytest.raises(ValueError, match="JSON"):
            await flows.send_event(task_id, "ci", object())
        with pytest.raises(ValueError, match="bytes of JSON"):
            await flows.send_event(task_id, "ci", "x" * 70_000)


async def test_a_sleeping_task_shows_its_wait_and_cancels_at_once() -> None:
    runs: Counter[str] = Counter()
    server, _ = waiting_server(runs)
    async with tasks_client(server) as client:
        task_id = await start(client, "nap", {"seconds": 600})
        await asyncio.sleep(0.3)
        parked = await task_state(client.session, task_id)
        (wait,) = parked["_meta"]["mrtr/waiting"]
        assert wait["kind"] == "timer" and wait["until"].endswith("Z")
        began = time.time()
        await cancel_task(client.session, task_id)
        cancelled = await wait_status(client.session, task_id, "cancelled", timeout=2)
        assert time.time() - began < 1.0 and "mrtr/waiting" not in cancelled.get("_meta", {})
        assert "statusMessage" not in cancelled
    assert runs == Counter(before=1)


async def test_the_ci_deploy_example_runs_as_documented() -> None:
    """The README's example: CI POSTs to the callback URL, the user confirms, the deploy runs once."""
    import importlib.util
    import sys

    from tests.support.flowkit import ROOT_DIR

    spec = importlib.util.spec_from_file_location("ci_deploy", ROOT_DIR / "examples" / "ci_deploy.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    flows = example.build(SQLiteStore(":memory:"), "http://ci-deploy.test")
    deployed: list[str] = []
    example.deploy = lambda app, ref: deployed.append(f"{app}@{ref}") or f"{app}@{ref} is live"

    async def confirm(request: Any) -> Any:
        assert request.params.message == "CI passed for shop@abc123. Deploy to production?"
        return mcp_types.ElicitResult(action="accept", content={"deploy": True})

    async def ci_reports(status: str) -> None:
        while not example.PIPELINES:
            await asyncio.sleep(0.02)
        (url,) = example.PIPELINES.values()
        transport = httpx.ASGITransport(app=flows.streamable_http_app())
        async with httpx.AsyncClient(transport=transport) as http:
            response = await http.post(url, json={"status": status})
            assert response.status_code == 202, response.text

    client = Client(flows.server, extensions=[TasksClient(confirm)], elicitation_callback=_no_answers)
    async with client, asyncio.TaskGroup() as group:
        group.create_task(ci_reports("passed"))
        result = await client.call_tool("ship", {"app": "shop", "ref": "abc123"})
    assert result.content[0].text == "shop@abc123 is live" and deployed == ["shop@abc123"]


@pytest.mark.spawns
async def test_the_cli_delivers_events_from_another_process(tmp_path: Any) -> None:
    """`mrtr tasks event` in its own process, on the store file a running instance shares."""
    import subprocess
    import sys

    path = tmp_path / "tasks.db"
    runs: Counter[str] = Counter()
    server, _ = waiting_server(runs, SQLiteStore(str(path)))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mrtr.cli", "tasks", *args, "--store", f"sqlite:///{path}"]
        env = os.environ | {"MRTR_STATE_KEY": SHARED_KEY.hex()}  # the servers' ring: records are sealed at rest
        return subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)

    async with tasks_client(server) as client:
        task_id = await start(client, "await_ci", {})
        await asyncio.sleep(0.3)
        listed = await asyncio.to_thread(cli, "ls", "--json")
        (entry,) = json.loads(listed.stdout)
        assert entry["waiting"] == [{"kind": "event", "name": "ci"}] and entry["status"] == "working"
        shown = await asyncio.to_thread(cli, "show", task_id)
        assert "waiting for" in shown.stdout and "event" in shown.stdout and "ci" in shown.stdout, shown.stdout
        bad = await asyncio.to_thread(cli, "event", task_id, "ci", "--data", "{not json")
        assert bad.returncode == 2 and bad.stderr.startswith("mrtr: --data must be JSON"), bad.stderr
        sent = await asyncio.to_thread(cli, "event", task_id, "ci", "--data", '{"status": "green"}', "--event-id", "b7")
        assert sent.returncode == 0 and "resumes at the next scan" in sent.stdout, sent.stdout + sent.stderr
        done = await wait_status(client.session, task_id, "completed", timeout=5)
        again = await asyncio.to_thread(cli, "event", task_id, "ci", "--data", "{}", "--event-id", "b7")
        assert again.returncode == 0 and "delivered before" in again.stdout
        late = await asyncio.to_thread(cli, "event", task_id, "ci", "--data", "{}")
        assert late.returncode == 2 and "is completed" in late.stderr and "Traceback" not in late.stderr
        unknown = await asyncio.to_thread(cli, "event", "nope", "ci")
        assert unknown.returncode == 2 and "no task 'nope'" in unknown.stderr
    assert done["result"]["content"][0]["text"] == "ci said green" and runs == Counter(deploy=1)


async def test_check_replay_reads_journals_with_waits() -> None:
    """`mrtr.testing.check_replay` replays a finished waiting task, and holds at an unresolved wait."""
    from mrtr.testing import check_replay

    store = SQLiteStore(":memory:")
    server, flows = waiting_server(Counter(), store)
    async with tasks_client(server) as client:
        done_id = await start(client, "await_ci", {})
        parked_id = await start(client, "await_ci", {})
        await asyncio.sleep(0.2)
        await flows.send_event(done_id, "ci", {"status": "green"})
        await wait_status(client.session, done_id, "completed")
    finished = await flows.runtime.store.load(done_id, time.time())  # opened: the store holds them sealed at rest
    parked = await flows.runtime.store.load(parked_id, time.time())
    assert finished is not None and parked is not None
    report = await check_replay(flows, "await_ci", finished.journal)
    assert report.ok and report.finished, report.explain()
    holding = await check_replay(flows, "await_ci", parked.journal)
    assert holding.ok and not holding.finished and holding.would_run == ["@event.ci"], holding.explain()


@pytest.mark.in_process
async def test_a_callback_wait_is_marked_so_operators_can_filter_on_it(tmp_path: Any) -> None:
    """A wait for the event a `ctx.callback_url` delivers lists as `callback`; a plain one as `event`."""
    from mrtr.stores import TaskQuery

    store = SQLiteStore(str(tmp_path / "tasks.db"))
    server, _ = waiting_server(Counter(), store)
    async with tasks_client(server) as client:
        hooked = str((await client.session.call_tool("hooked", {}, allow_claimed=True)).task_id)
        plain = str((await client.session.call_tool("await_ci", {}, allow_claimed=True)).task_id)
        lister = mrtr.tasks.TaskAdmin(
            SQLiteStore(str(tmp_path / "tasks.db")), seal=mrtr.stores.RecordSeal.from_keys([SHARED_KEY])
        )
        async with asyncio.timeout(10):
            while True:
                records = [await lister.get(hooked), await lister.get(plain)]
                if all(r is not None and r.waiting for r in records):
                    break
                await asyncio.sleep(0.05)
        assert records[0] is not None and records[0].waiting[0].get("via") == "callback"
        assert records[1] is not None and "via" not in records[1].waiting[0]
        callback = await lister.list_tasks(TaskQuery(waiting="callback"))
        event = await lister.list_tasks(TaskQuery(waiting="event"))
        assert [r.task_id for r in callback.records] == [hooked]
        assert [r.task_id for r in event.records] == [plain]
        await lister.store.close()
