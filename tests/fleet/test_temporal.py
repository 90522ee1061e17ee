"""Tasks on Temporal (`mrtr.temporal`), against a real dev server and real server processes.

- The tasks conformance scenarios pass against the conformance fixtures in Temporal mode.
- A worker SIGKILLed mid-step while another is alive: the step is retried on the other
  worker under the same idempotency key, the task completes, and no finished step runs twice.
- A task parked on a question survives the restart of every worker (and MCP server).
- A rolling upgrade whose new code puts a change behind `ctx.patched` keeps a task in flight
  on the old path, while tasks created on the new code take the new one.
- `tasks/cancel` (of a parked task, and mid-step) ends the workflow Canceled in Temporal while
  `tasks/get` answers `cancelled`; cancelling a finished task changes nothing.
- Workers publish every state change: a listener hears `input_required`, `completed` and
  `cancelled` exactly as `tasks/get` shows them, in version order, and mrtr's client follows
  tasks with no `tasks/get` at all; across processes (a worker-only process, an MCP server
  without a worker) the fleet bus on Redis carries them.

The dev server is shared by the session (`temporal_address` in conftest.py); each test has
its own task queue. Side effects are counted in an audit file every step appends to.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowExecutionStatus

from mrtr.client import CreatedTask, FlowClient, TasksClient, cancel_task, get_task, update_task
from mrtr.stores import RecordSeal
from mrtr.temporal._codec import sealed_client
from tests.external.conformance.harness import (
    TASKS_ALWAYS_SKIPPED,
    TASKS_FIXED_PACKAGE,
    TASKS_SCENARIOS,
    find_npx,
    fixture_server,
    load_checks,
    run_tasks_suite,
    tasks_failures,
)
from tests.support import buskit
from tests.support.flowkit import task_state
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, spawn_servers
from tests.support.storekit import REDIS_URL, service_problem
from tests.support.temporalkit import in_ci, unique_queue

pytestmark = [pytest.mark.anyio, pytest.mark.spawns, pytest.mark.needs_temporal]

SERVER = SUPPORT / "temporal_server.py"
READY = "temporal-server ready:"


@pytest.mark.needs_node
def test_tasks_conformance_on_temporal(temporal_address: str, tmp_path: Path) -> None:
    """The nine graded tasks scenarios (and the tenth, which the suite skips) on Temporal, strictly."""
    npx = find_npx()
    if npx is None:
        reason = "npx not found: install Node.js to run the MCP conformance suite"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run it, not skip it")
        pytest.skip(reason)
    env = {"MRTR_CONFORMANCE_TEMPORAL": temporal_address, "MRTR_CONFORMANCE_TASK_QUEUE": unique_queue("conf")}
    with fixture_server(tmp_path, env) as url:
        run = run_tasks_suite(npx, url, tmp_path / "out", package=TASKS_FIXED_PACKAGE)
    names = (*TASKS_SCENARIOS, TASKS_ALWAYS_SKIPPED)
    results = {name: checks for name, checks in load_checks(run.out_dir).items() if name in names}
    failing = tasks_failures(results, excuse_envelope_bug=False)
    log = (tmp_path / "server-conformance.log").read_text()[-4000:]
    assert not failing, f"tasks checks that are not SUCCESS on Temporal: {failing}\n{run.tail()}\n{log}"
    assert len(results) == 10, sorted(results)


# -- the fleet ----------------------------------------------------------------------------------


class Fleet:
    """Server (and worker) processes of one test: same key, same task queue, one audit file."""

    def __init__(self, address: str, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.audit_path = tmp_path / "audit.jsonl"
        self.env = {
            "MRTR_STATE_KEY": secrets.token_hex(32),
            "MRTR_TEMPORAL": address,
            "MRTR_TASK_QUEUE": unique_queue("fleet"),
            "MRTR_AUDIT": str(self.audit_path),
            "MRTR_HEARTBEAT": "1.5",
        }

    @contextmanager
    def run(self, labels: list[str], workers: tuple[str, ...] = (), **env: str) -> Iterator[dict[str, ServerProcess]]:
        """MCP servers (each with a worker) named `labels`, and worker-only processes named `workers`."""
        specs = [
            ServerSpec(label, self.env | env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix=READY)
            for label in labels
        ]
        specs += [
            ServerSpec(label, self.env | env | {"MRTR_INSTANCE": label, "MRTR_WORKER": "only"}, SERVER, READY)
            for label in workers
        ]
        with spawn_servers(specs, self.tmp_path) as servers:
            yield servers

    def audit(self) -> list[dict[str, str]]:
        path = self.audit_path
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def steps(self, step: str, phase: str | None = None) -> list[dict[str, str]]:
        return [e for e in self.audit() if e["step"] == step and (phase is None or e["phase"] == phase)]


async def _never(*args: Any) -> Any:
    raise AssertionError("answers go through tasks/update here")


def client(url: str) -> Client:
    return Client(url, extensions=[TasksClient(_never)], elicitation_callback=_never)


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    with anyio.move_on_after(timeout):
        while True:
            value = await predicate()
            if value:
                return value
            await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_status(session: Any, task_id: str, status: str, timeout: float = 20) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        task = await task_state(session, task_id)
        assert task["status"] in ("working", "input_required", status), task
        return task if task["status"] == status else None

    return await wait_until(reached, timeout, f"task {task_id} to be {status}")


def kill(server: ServerProcess) -> None:
    server.process.send_signal(signal.SIGKILL)  # no cleanup, no goodbye to Temporal
    server.process.wait()


async def publish_yes(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"publish": True})


async def answer(session: Any, task_id: str, publish: bool) -> None:
    task = await wait_status(session, task_id, "input_required")
    (key,) = task["inputRequests"]
    await update_task(session, task_id, {key: {"action": "accept", "content": {"publish": publish}}})


async def test_a_worker_killed_mid_step_loses_nothing(temporal_address: str, tmp_path: Path) -> None:
    fleet = Fleet(temporal_address, tmp_path)
    with fleet.run(["A", "B"]) as servers:
        created = None
        async with client(servers["A"].url) as on_a:
            created = await on_a.session.call_tool("pipeline", {"job": "j1", "slow": 3.0}, allow_claimed=True)
            assert isinstance(created, CreatedTask)

        async def transform_started() -> list[dict[str, str]]:
            return fleet.steps("transform", "start")

        (first,) = await wait_until(transform_started, 15, "a worker to start the slow step")
        victim = first["instance"]
        survivor = "B" if victim == "A" else "A"
        kill(servers[victim])  # mid-step: Temporal hears nothing more from it

        async with client(servers[survivor].url) as session:
            await answer(session.session, created.task_id, publish=True)
            done = await wait_status(session.session, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "published DATA(J1)"
    fetches, starts = fleet.steps("fetch"), fleet.steps("transform", "start")
    assert len(fetches) == 1, "a finished step is never re-run"
    assert [e["instance"] for e in starts] == [victim, survivor], "the interrupted step runs again elsewhere"
    assert starts[0]["key"] == starts[1]["key"], "under the same idempotency key"
    assert [e["instance"] for e in fleet.steps("transform", "end")] == [survivor]
    assert len(fleet.steps("publish")) == 1


async def test_a_parked_task_survives_the_restart_of_every_worker(temporal_address: str, tmp_path: Path) -> None:
    fleet = Fleet(temporal_address, tmp_path)
    with fleet.run(["A", "B"]) as first:
        async with client(first["A"].url) as on_a:
            created = await on_a.session.call_tool("pipeline", {"job": "j2", "slow": 0}, allow_claimed=True)
            await wait_status(on_a.session, created.task_id, "input_required")
        for server in first.values():
            kill(server)  # every worker and every MCP server of the fleet is gone
    with fleet.run(["C", "D"], workers=("W",)) as second:
        async with client(second["C"].url) as on_c:
            task = await wait_status(on_c.session, created.task_id, "input_required")
            assert next(iter(task["inputRequests"].values()))["params"]["message"] == "Publish DATA(J2)?"
            await answer(on_c.session, created.task_id, publish=True)
        async with client(second["D"].url) as on_d:
            done = await wait_status(on_d.session, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "published DATA(J2)"
    assert [len(fleet.steps(step)) for step in ("fetch", "publish")] == [1, 1]
    assert len(fleet.steps("transform", "start")) == 1, "no step before the question ran twice"


async def test_a_rolling_upgrade_keeps_tasks_in_flight_on_the_old_path(temporal_address: str, tmp_path: Path) -> None:
    fleet = Fleet(temporal_address, tmp_path)
    with fleet.run(["old1", "old2"], MRTR_FLOW_VERSION="1") as old:
        async with client(old["old1"].url) as on_old:
            in_flight = await on_old.session.call_tool("release", {"name": "r1"}, allow_claimed=True)
            await wait_status(on_old.session, in_flight.task_id, "input_required")
        with fleet.run(["new1"], MRTR_FLOW_VERSION="2") as new:  # one by one: never zero workers
            old["old1"].process.terminate()
            old["old1"].process.wait()
            with fleet.run(["new2"], MRTR_FLOW_VERSION="2") as newer:
                old["old2"].process.terminate()
                old["old2"].process.wait()
                async with client(new["new1"].url) as on_new, client(newer["new2"].url) as on_newer:
                    await answer(on_new.session, in_flight.task_id, publish=True)
                    done = await wait_status(on_newer.session, in_flight.task_id, "completed")
                    fresh = await on_newer.session.call_tool("release", {"name": "r2"}, allow_claimed=True)
                    await answer(on_new.session, fresh.task_id, publish=False)
                    fresh_done = await wait_status(on_new.session, fresh.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "build-v1 done; shipped=True; by v2"
    assert fresh_done["result"]["content"][0]["text"] == "build-v2 done; shipped=False; by v2"
    builds = [(e["step"], e["instance"][:3]) for e in fleet.audit()]
    assert builds == [("build-v1", "old"), ("build-v2", "new")], "each task built once, each on its own path"


async def test_principals_and_idempotency_keys_hold_on_any_instance(temporal_address: str, tmp_path: Path) -> None:
    """A (with a worker) and B (`worker=False`, an MCP server only) serve the same tasks: a task is
    its creator's alone, and a resend with the same idempotency key finds the task on any instance."""
    from tests.fleet.test_ownership import KEY, TOKENS, _refusal, _same_as_unknown, as_user

    fleet = Fleet(temporal_address, tmp_path)
    tokens = ",".join(f"{name}={token}" for name, token in TOKENS.items())
    with fleet.run(["A"], MRTR_TOKENS=tokens) as a, fleet.run(["B"], MRTR_TOKENS=tokens, MRTR_WORKER="0") as b:
        url_a, url_b = a["A"].url, b["B"].url
        async with as_user(url_a, "alice") as alice_a, as_user(url_b, "alice") as alice_b, as_user(url_b, "bob") as bob:
            args = {"job": "k", "slow": 0}
            key = secrets.token_hex(8)
            created = await alice_b.session.call_tool("pipeline", args, meta={KEY: key}, allow_claimed=True)
            again = await alice_a.session.call_tool("pipeline", args, meta={KEY: key}, allow_claimed=True)
            assert isinstance(created, CreatedTask) and isinstance(again, CreatedTask)
            assert again.task_id == created.task_id, "one workflow per task id: the resend finds the task"
            reused = await _refusal(
                alice_b.session.call_tool("pipeline", {"job": "x", "slow": 0}, meta={KEY: key}, allow_claimed=True)
            )
            assert reused.code == t.INVALID_PARAMS and reused.data == {"reason": "idempotency_key_reused"}
            task = await wait_status(alice_b.session, created.task_id, "input_required")
            (question,) = task["inputRequests"]
            # Workers report every state change: a listen accepts the task's id, on any instance.
            async with buskit.listen(f"{url_a}", {"taskIds": [created.task_id]}, token=TOKENS["alice"]) as stream:
                ack = stream.frames[0]
                assert ack["method"] == "notifications/subscriptions/acknowledged", ack
                assert ack["params"]["notifications"]["taskIds"] == [created.task_id], ack
            missing = "x" * len(created.task_id)
            unknown = await _refusal(get_task(bob.session, missing))
            for call in (
                get_task(bob.session, created.task_id),
                update_task(bob.session, created.task_id, {question: {"action": "accept", "content": {"publish": 1}}}),
                cancel_task(bob.session, created.task_id),
            ):
                assert _same_as_unknown(await _refusal(call), unknown, created.task_id, missing)
            bad = await _refusal(update_task(alice_b.session, created.task_id, {question: {"action": "accept"}}))
            assert bad.code == t.INVALID_PARAMS, (
                "an answer that does not fit its request is refused, as on the lease runtime"
            )
            await answer(alice_b.session, created.task_id, publish=False)
            done = await wait_status(alice_a.session, created.task_id, "completed")
            assert done["result"]["content"][0]["text"] == "not published"
            # mrtr's own client, polling: B shares no bus with A's worker here, whose reports a
            # listener on B would only hear of through a fleet bus (see the tests below).
            headers = {"authorization": f"Bearer {TOKENS['alice']}"}
            flows = FlowClient(url_b, elicitation_callback=publish_yes, tasks=True, headers=headers, listen=False)
            async with flows:
                for job in ("p", "q"):
                    with anyio.fail_after(60):
                        result = await flows.call_tool("pipeline", {"job": job, "slow": 0})
                    assert result.content[0].text == f"published DATA({job.upper()})"
            assert _same_as_unknown(
                await _refusal(get_task(bob.session, created.task_id)), unknown, created.task_id, missing
            )


# -- cancellation, and the workers' reports ----------------------------------------------------


def is_task(status: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f.get("method") == "notifications/tasks" and f["params"]["status"] == status


def without_meta(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in ("_meta", "resultType")}


async def create(http: httpx2.AsyncClient, url: str, job: str, slow: float) -> str:
    reply = await buskit.call(http, url, "tools/call", {"name": "pipeline", "arguments": {"job": job, "slow": slow}})
    return str(reply["result"]["taskId"])


async def task_call(http: httpx2.AsyncClient, url: str, method: str, task_id: str, **params: Any) -> dict[str, Any]:
    reply = await buskit.call(http, url, method, {"taskId": task_id, **params}, name=task_id)
    assert "result" in reply, reply
    return reply["result"]  # type: ignore[no-any-return]


async def served(http: httpx2.AsyncClient, url: str) -> dict[str, int]:
    reply = await buskit.call(http, url, "tools/call", {"name": "requests", "arguments": {}}, name="requests")
    return reply["result"]["structuredContent"]  # type: ignore[no-any-return]


def published(stream: buskit.Listening) -> list[dict[str, Any]]:
    return [f["params"] for f in stream.of("notifications/tasks")]


async def test_cancel_ends_the_workflow_canceled_and_tasks_get_says_cancelled(
    temporal_address: str, tmp_path: Path
) -> None:
    fleet = Fleet(temporal_address, tmp_path)
    # The fleet seals Temporal's payloads (the memo too) with its key ring: read them with it.
    ring = RecordSeal.from_keys([bytes.fromhex(fleet.env["MRTR_STATE_KEY"])])
    temporal = sealed_client(await TemporalClient.connect(temporal_address), ring)
    with fleet.run(["A"]) as servers:
        url = servers["A"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=30) as http, client(url) as session:
            parked, busy, done = [
                await create(http, url, job, slow) for job, slow in (("c1", 0), ("c2", 60), ("c3", 0))
            ]
            await answer(session.session, done, publish=False)
            await wait_status(session.session, done, "completed")
            await wait_status(session.session, parked, "input_required")

            async def slow_step_started() -> bool:
                return len(fleet.steps("transform", "start")) == 3  # c1's and c3's ended at once

            await wait_until(slow_step_started, 20, "c2's slow step to start")
            notifications = {"taskIds": [parked, busy], "mrtr/taskSnapshots": True}
            async with buskit.listen(url, notifications) as stream:
                assert stream.frames[0]["params"]["notifications"]["taskIds"] == [parked, busy]
                for task_id in (parked, busy, done):
                    assert (await task_call(http, url, "tasks/cancel", task_id))["resultType"] == "complete"

                def both_cancelled(s: buskit.Listening) -> bool:
                    return {p["taskId"] for p in published(s) if p["status"] == "cancelled"} == {parked, busy}

                await stream.until(both_cancelled, 20, "both cancellations, pushed by the worker")
            for task_id in (parked, busy):
                seen = await wait_status(session.session, task_id, "cancelled")
                assert "inputRequests" not in seen or not seen["inputRequests"], seen
                (pushed,) = [p for p in published(stream) if p["taskId"] == task_id and p["status"] == "cancelled"]
                assert without_meta(pushed) == without_meta(await task_call(http, url, "tasks/get", task_id)), (
                    "pushed exactly as tasks/get shows it"
                )
                description = await temporal.get_workflow_handle(task_id).describe()
                assert description.status == WorkflowExecutionStatus.CANCELED, (task_id, description.status)
                assert (await description.memo())["mrtr.task"]["status"] == "cancelled"
                # Cancelling again is an acknowledgement that changes nothing.
                assert (await task_call(http, url, "tasks/cancel", task_id))["resultType"] == "complete"
                assert (await task_call(http, url, "tasks/get", task_id))["status"] == "cancelled"
            finished = await task_call(http, url, "tasks/get", done)
            assert finished["status"] == "completed", "cancelling a finished task changes nothing"
            assert finished["result"]["content"][0]["text"] == "not published"
            description = await temporal.get_workflow_handle(done).describe()
            assert description.status == WorkflowExecutionStatus.COMPLETED
    assert len(fleet.steps("transform", "end")) == 2, "c2 was cancelled mid-step"


async def follow_one_task(http: httpx2.AsyncClient, listen_on: str, create_on: str, job: str) -> None:
    """A listener on `listen_on` hears the task's states (the question, the end) exactly as
    `tasks/get` shows them, in version order, without asking for them."""
    task_id = await create(http, create_on, job, 0)
    async with buskit.listen(listen_on, {"taskIds": [task_id], "mrtr/taskSnapshots": True}) as stream:
        assert stream.frames[0]["params"]["notifications"]["taskIds"] == [task_id], stream.frames[0]
        asked = await stream.wait_for(is_task("input_required"), 20, "the question, pushed by a worker")
        seen = await task_call(http, listen_on, "tasks/get", task_id)
        assert without_meta(asked["params"]) == without_meta(seen), "exactly what tasks/get shows"
        (key,) = asked["params"]["inputRequests"]
        answers = {key: {"action": "accept", "content": {"publish": True}}}
        await task_call(http, create_on, "tasks/update", task_id, inputResponses=answers)
        done = await stream.wait_for(is_task("completed"), 20, "completion, pushed by a worker")
        assert done["params"]["result"]["content"][0]["text"] == f"published DATA({job.upper()})"
        assert without_meta(done["params"]) == without_meta(await task_call(http, listen_on, "tasks/get", task_id))
        tasks = published(stream)
    statuses = [p["status"] for p in tasks]
    assert statuses[-1] == "completed" and statuses.count("input_required") == 1, statuses
    versions = [p["_meta"]["mrtr/taskVersion"] for p in tasks]
    assert versions == sorted(set(versions)), f"each state once, in order: {list(zip(statuses, versions, strict=True))}"


async def test_a_listener_hears_every_state_the_workers_reach_without_polling(
    temporal_address: str, tmp_path: Path
) -> None:
    fleet = Fleet(temporal_address, tmp_path)
    with fleet.run(["A"]) as servers:
        url = servers["A"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=30) as http:
            await follow_one_task(http, url, url, "n")
            before = await served(http, url)
            async with FlowClient(url, elicitation_callback=publish_yes, tasks=True) as flows:
                for job in ("p", "q"):
                    with anyio.fail_after(30):  # well inside the feed's resync (10 s) per state
                        result = await flows.call_tool("pipeline", {"job": job, "slow": 0})
                    assert result.content[0].text == f"published DATA({job.upper()})"
            after = await served(http, url)
    count = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    assert count.get("tasks/get", 0) == 0, f"every state pushed, none polled: {count}"
    assert count["tasks/update"] == 2 and count["subscriptions/listen"] >= 1, count


@pytest.mark.needs_redis
async def test_the_fleet_bus_carries_the_reports_of_a_worker_only_process(
    temporal_address: str, tmp_path: Path
) -> None:
    """A: an MCP server without a worker; W: a worker with no HTTP. Only the bus on Redis they
    share brings A's listeners what W's workflows reach."""
    problem = await service_problem("redis")
    if problem is not None:
        if in_ci():
            pytest.fail(f"redis is not reachable: {problem}")
        pytest.skip(f"redis is not reachable: {problem}")
    fleet = Fleet(temporal_address, tmp_path)
    with fleet.run(["A"], workers=("W",), MRTR_WORKER="0", MRTR_BUS=REDIS_URL) as servers:
        url = servers["A"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=30) as http:
            await follow_one_task(http, url, url, "w")
            before = await served(http, url)
            async with FlowClient(url, elicitation_callback=publish_yes, tasks=True) as flows:
                with anyio.fail_after(30):
                    result = await flows.call_tool("pipeline", {"job": "x", "slow": 0})
            assert result.content[0].text == "published DATA(X)"
            after = await served(http, url)
    count = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    assert count.get("tasks/get", 0) == 0, f"every state pushed across processes, none polled: {count}"
    assert {e["instance"] for e in fleet.audit()} == {"W"}, "every step ran on the worker-only process"
