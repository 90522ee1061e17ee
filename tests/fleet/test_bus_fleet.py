"""Pushed across the fleet: two real uvicorn instances sharing a bus on real Redis and PostgreSQL.

- A listener on A receives `notifications/tasks` for a task that B runs, answers and completes:
  every state, each exactly as `tasks/get` shows it.
- `notifications/resources/updated` raised on B reaches a listener on A, with and without `Flows`.
- Another principal's subscription is refused like its `tasks/get`; a client without the tasks
  extension gets -32021; the acknowledgement lists only accepted ids.
- mrtr's clients listen instead of polling, and a Redis restart mid-stream (a private
  `redis-server`, killed and restarted) loses no terminal state: the client re-listens and refetches.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client

from mrtr.client import FlowClient, TasksClient, follow_task
from tests.support import buskit
from tests.support.markers import backends
from tests.support.redis_proc import RedisProcess
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, spawn_servers
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, cluster_url, drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = SUPPORT / "task_server.py"
READY = "task-server ready:"
TOKENS = {"alice": "tok-alice-" + secrets.token_hex(8), "bob": "tok-bob-" + secrets.token_hex(8)}
URLS = {"redis": REDIS_URL, "postgres": POSTGRES_DSN}


def need(kind: str) -> None:
    """Skip (fail on CI) unless the broker answers; from sync code (fixtures)."""
    settle(kind, asyncio.run(service_problem(kind)))


def settle(kind: str, problem: str | None) -> None:
    if problem is not None:
        message = f"{kind} is not reachable: {problem}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@contextmanager
def fleet(
    workdir: Path, bus: str, store: str | None = None, labels: tuple[str, ...] = ("A", "B"), **extra: str
) -> Iterator[dict[str, ServerProcess]]:
    """Instances sharing one bus (and store); `P` is a plain `MCPServer`, without `mrtr.Flows`."""
    namespace = f"mrtr_busfleet_{secrets.token_hex(4)}"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": store or f"sqlite:///{workdir / 'tasks.db'}",
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(workdir / "audit.jsonl"),
        "MRTR_BUS": bus,
        **extra,
    }
    specs = [
        ServerSpec(label, env | {"MRTR_INSTANCE": label, "MRTR_PLAIN": "1" if label == "P" else "0"}, SERVER, READY)
        for label in labels
    ]
    try:
        with spawn_servers(specs, workdir) as servers:
            yield servers
    finally:
        if bus.startswith("postgresql") or (not bus and (store or "").startswith("postgresql")):
            asyncio.run(drop_namespace("postgres", f"{namespace}_bus"))  # explicit, or derived from the store
        if store is not None:  # the bus's by-reference keys share the store's Redis prefix
            kind = "redis-cluster" if "+cluster" in store else "redis" if store.startswith("redis") else "postgres"
            asyncio.run(drop_namespace(kind, namespace, url=store if kind == "redis-cluster" else None))


@pytest.fixture(scope="module", params=backends("redis", "redis-cluster", "postgres"))
def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One fleet per broker for the tests that need no special setup: A and B with flows, P without
    (`redis-cluster`: the session's private cluster, store and sharded bus)."""
    kind = request.param
    url = cluster_url(kind, request)
    if url is None:
        need(kind)
        url = URLS[kind]
    workdir = tmp_path_factory.mktemp(f"bus-{kind}")
    with fleet(workdir, url, store=url, labels=("A", "B", "P")) as servers:
        yield {label: server.url for label, server in servers.items()}


def is_task(status: str) -> Any:
    return lambda f: f.get("method") == "notifications/tasks" and f["params"]["status"] == status


def without_meta(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in ("_meta", "resultType")}


async def answer(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"publish": True})


async def served(http: httpx2.AsyncClient, url: str) -> dict[str, int]:
    reply = await buskit.call(http, url, "tools/call", {"name": "requests", "arguments": {}}, name="requests")
    return reply["result"]["structuredContent"]  # type: ignore[no-any-return]


async def follow_across(a: str, b: str, job: str) -> list[dict[str, Any]]:
    """A listener on A follows a task that B runs, asks, is answered on and completes; returns
    the `notifications/tasks` it heard (each pushed state checked against `tasks/get`)."""
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        reply = await buskit.call(http, b, "tools/call", {"name": "pipeline", "arguments": {"job": job, "slow": 0.3}})
        task_id = reply["result"]["taskId"]
        notifications = {"taskIds": [task_id], "mrtr/taskSnapshots": True}
        async with buskit.listen(a, notifications) as stream:
            ack = stream.frames[0]
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"]["notifications"]["taskIds"] == [task_id]
            asked = await stream.wait_for(is_task("input_required"), 10, "the question, pushed from B")
            seen = await buskit.call(http, b, "tasks/get", {"taskId": task_id}, name=task_id)
            assert without_meta(asked["params"]) == without_meta(seen["result"]), "exactly what tasks/get shows"
            (key,) = asked["params"]["inputRequests"]
            answers = {key: {"action": "accept", "content": {"publish": True}}}
            await buskit.call(http, b, "tasks/update", {"taskId": task_id, "inputResponses": answers}, name=task_id)
            done = await stream.wait_for(is_task("completed"), 10, "completion, pushed from B")
            final = await buskit.call(http, a, "tasks/get", {"taskId": task_id}, name=task_id)
            assert without_meta(done["params"]) == without_meta(final["result"])
            assert done["params"]["result"]["content"][0]["text"] == f"published DATA({job.upper()})"
            return [f["params"] for f in stream.of("notifications/tasks")]


async def test_a_listener_on_a_follows_a_task_that_b_runs_answers_and_completes(shared: dict[str, str]) -> None:
    tasks = await follow_across(shared["A"], shared["B"], "j")
    assert [p["status"] for p in tasks] == ["working", "input_required", "working", "completed"]
    versions = [p["_meta"]["mrtr/taskVersion"] for p in tasks]
    assert versions == sorted(set(versions)), "each state once, in order"
    assert all(p["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1" for p in tasks)


async def test_resources_updated_on_one_instance_reaches_listeners_on_the_others(shared: dict[str, str]) -> None:
    a, b, plain = shared["A"], shared["B"], shared["P"]
    on_a = buskit.listen(a, {"resourceSubscriptions": ["res://watched"]})
    on_plain = buskit.listen(plain, {"resourceSubscriptions": ["res://watched"]})  # the SDK's own listen handler
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http, on_a as stream_a, on_plain as stream_p:
        for origin, uri in ((b, "res://other"), (b, "res://watched"), (plain, "res://watched")):
            await buskit.call(http, origin, "tools/call", {"name": "touch", "arguments": {"uri": uri}})
        for stream in (stream_a, stream_p):
            await stream.until(lambda s: len(s.of("notifications/resources/updated")) == 2, 10, "both events")
        await anyio.sleep(0.3)  # a duplicate would arrive by now
        for stream in (stream_a, stream_p):
            updates = stream.of("notifications/resources/updated")
            assert [u["params"]["uri"] for u in updates] == ["res://watched"] * 2, "once each, only what was asked"


@pytest.mark.needs_redis
async def test_only_the_tasks_own_principal_may_listen_to_it(tmp_path: Path) -> None:
    settle("redis", await service_problem("redis"))
    tokens = ",".join(f"{name}={token}" for name, token in TOKENS.items())
    with fleet(tmp_path, REDIS_URL, MRTR_TOKENS=tokens) as servers:
        a, b = servers["A"].url, servers["B"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            mine = await buskit.call(
                http, b, "tools/call", {"name": "pipeline", "arguments": {"job": "j", "slow": 0}}, token=TOKENS["alice"]
            )
            task_id = mine["result"]["taskId"]
            as_get = await buskit.call(http, a, "tasks/get", {"taskId": task_id}, name=task_id, token=TOKENS["bob"])
            async with buskit.listen(a, {"taskIds": [task_id]}, token=TOKENS["bob"]) as refused:
                (reply,) = refused.frames
            assert reply["error"] == as_get["error"], "refused exactly like tasks/get"
            assert reply["error"]["code"] == t.INVALID_PARAMS
            async with buskit.listen(a, {"taskIds": [task_id, "not-a-task"]}, token=TOKENS["alice"]) as accepted:
                assert accepted.frames[0]["params"]["notifications"]["taskIds"] == [task_id], "only accepted ids"
            async with buskit.listen(a, {"taskIds": [task_id]}, token=TOKENS["alice"], tasks=False) as no_extension:
                (reply,) = no_extension.frames
            assert reply["error"]["code"] == t.MISSING_REQUIRED_CLIENT_CAPABILITY


@pytest.mark.needs_redis
async def test_a_stream_opened_ahead_watches_the_tasks_its_keys_will_create(tmp_path: Path) -> None:
    settle("redis", await service_problem("redis"))
    tokens = ",".join(f"{name}={token}" for name, token in TOKENS.items())
    keys = [{"tool": "pipeline", "key": f"key-{i}-{secrets.token_hex(4)}"} for i in range(3)]
    ahead = {"mrtr/taskKeys": keys, "mrtr/taskSnapshots": True}
    with fleet(tmp_path, REDIS_URL, MRTR_TOKENS=tokens) as servers:
        a, b = servers["A"].url, servers["B"].url
        async with (
            httpx2.AsyncClient(trust_env=False, timeout=10) as http,
            buskit.listen(a, ahead, token=TOKENS["alice"]) as mine,
            buskit.listen(a, ahead, token=TOKENS["bob"]) as bobs,
        ):
            acked = mine.frames[0]["params"]["notifications"]
            assert [{k: p[k] for k in ("tool", "key")} for p in acked["mrtr/taskKeys"]] == keys
            assert acked["mrtr/taskSnapshots"] is True and "taskIds" not in acked
            ids = [p["taskId"] for p in acked["mrtr/taskKeys"]]
            bob_ids = [p["taskId"] for p in bobs.frames[0]["params"]["notifications"]["mrtr/taskKeys"]]
            assert not set(ids) & set(bob_ids), "the same keys name another principal's tasks for bob"
            assert len(mine.frames) == 1, "no state before the tasks exist"

            params = {
                "name": "pipeline",
                "arguments": {"job": "k", "slow": 0},
                "_meta": {"mrtr/idempotencyKey": keys[1]["key"]},
            }
            created = await buskit.call(http, b, "tools/call", params, token=TOKENS["alice"])
            assert created["result"]["taskId"] == ids[1], "the id the acknowledgement promised"
            asked = await mine.wait_for(is_task("input_required"), 10, "the question, pushed from B")
            assert asked["params"]["taskId"] == ids[1]
            (question,) = asked["params"]["inputRequests"]
            answers = {question: {"action": "accept", "content": {"publish": True}}}
            update = {"taskId": ids[1], "inputResponses": answers}
            await buskit.call(http, b, "tasks/update", update, name=ids[1], token=TOKENS["alice"])
            done = await mine.wait_for(is_task("completed"), 10, "completion, pushed from B")
            assert done["params"]["result"]["content"][0]["text"] == "published DATA(K)"
            await anyio.sleep(0.3)  # anything meant for bob would have arrived by now
            assert bobs.of("notifications/tasks") == [], "another principal hears nothing of alice's task"

        # Listening again with a used key: its task's state now, as a snapshot.
        async with buskit.listen(a, ahead, token=TOKENS["alice"]) as again:
            snapshot = await again.wait_for(is_task("completed"), 10, "the snapshot of the keyed task")
            assert snapshot["params"]["taskId"] == ids[1]
        malformed = {"mrtr/taskKeys": [{"tool": "pipeline"}]}
        async with buskit.listen(a, malformed, token=TOKENS["alice"]) as refused:
            (reply,) = refused.frames
        assert reply["error"]["code"] == t.INVALID_PARAMS
        async with buskit.listen(a, ahead, token=TOKENS["alice"], tasks=False) as no_extension:
            (reply,) = no_extension.frames
        assert reply["error"]["code"] == t.MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_a_flow_client_follows_many_tasks_on_one_stream_opened_ahead(shared: dict[str, str]) -> None:
    a, b = shared["A"], shared["B"]
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        before = {url: await served(http, url) for url in (a, b)}
        async with FlowClient(b, elicitation_callback=answer, tasks=True) as flows:
            results = [await flows.call_tool("pipeline", {"job": f"j{i}", "slow": 0}) for i in range(6)]
            results += await asyncio.gather(
                *(flows.call_tool("pipeline", {"job": f"c{i}", "slow": 0}) for i in range(4))
            )
        assert [r.content[0].text for r in results] == [f"published DATA(J{i})" for i in range(6)] + [
            f"published DATA(C{i})" for i in range(4)
        ]
        after = {url: await served(http, url) for url in (a, b)}
    count = {m: after[b].get(m, 0) - before[b].get(m, 0) for m in after[b]}
    assert count.get("tasks/get", 0) == 0, f"no polls while listening: {count}"
    assert count["tools/call"] == 10 + 1 and count["tasks/update"] == 10, count  # + 1: the `requests` count itself
    # The first task showed the tool makes tasks (a stream of its own); one batch stream watched the rest.
    assert count["subscriptions/listen"] == 2, f"one stream for nine tasks, opened ahead: {count}"


async def test_mrtr_clients_listen_instead_of_polling(shared: dict[str, str]) -> None:
    a = shared["A"]
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        before = await served(http, a)
        statuses: list[str] = []
        extension = TasksClient(elicitation_callback=answer, on_status=lambda s: statuses.append(s.status))
        async with Client(a, extensions=[extension], elicitation_callback=answer) as client:
            result = await client.call_tool("pipeline", {"job": "k", "slow": 0.3})
        assert result.content[0].text == "published DATA(K)"
        # Each new state in order; a `working` between the answer and the end may be superseded
        # by `completed` before the client takes it (a follower acts on the newest state).
        assert statuses in (
            ["working", "input_required", "working", "completed"],
            ["working", "input_required", "completed"],
        )
        async with FlowClient(a, elicitation_callback=answer, tasks=True) as flows:
            result = await flows.call_tool("pipeline", {"job": "m", "slow": 0.3})
        assert result.content[0].text == "published DATA(M)"
        after = await served(http, a)
    count = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    assert count.get("tasks/get", 0) == 0, f"no polls while listening: {count}"
    assert count["subscriptions/listen"] == 2 and count["tasks/update"] == 2


@pytest.mark.needs_redis
async def test_a_redis_restart_mid_stream_loses_no_terminal_state(tmp_path: Path) -> None:
    if RedisProcess.binary() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with RedisProcess(tmp_path) as redis, fleet(tmp_path, redis.url) as servers:
        a, b = servers["A"].url, servers["B"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            reply = await buskit.call(
                http, b, "tools/call", {"name": "pipeline", "arguments": {"job": "r", "slow": 1.5}}
            )
            task_id = reply["result"]["taskId"]
            extension = TasksClient(elicitation_callback=answer)
            async with Client(a, extensions=[extension], elicitation_callback=answer) as client:

                async def restart_mid_stream() -> None:
                    await anyio.sleep(0.3)  # the stream on A is open; B is in its slow step
                    redis.kill()
                    await anyio.sleep(1.8)  # B parks the task on its question while Redis is gone
                    redis.start()

                async with anyio.create_task_group() as group:
                    group.start_soon(restart_mid_stream)
                    with anyio.fail_after(30):
                        result = await follow_task(client.session, task_id, extension._answer, feed=extension.feed)
            assert result.content[0].text == "published DATA(R)"
            count = await served(http, a)
        assert count["subscriptions/listen"] >= 2, f"the client listened again after the gap: {count}"


@pytest.mark.needs_redis
async def test_a_redis_restart_ends_a_batch_stream_and_its_followers_carry_on(tmp_path: Path) -> None:
    if RedisProcess.binary() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with RedisProcess(tmp_path) as redis, fleet(tmp_path, redis.url) as servers:
        a = servers["A"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            async with FlowClient(a, elicitation_callback=answer, tasks=True) as flows:
                first = await flows.call_tool("pipeline", {"job": "f", "slow": 0})  # shows the tool makes tasks
                assert first.content[0].text == "published DATA(F)"
                before = await served(http, a)

                async def restart_mid_stream() -> None:
                    # Both calls are followed on the batch stream, in 6 s steps: the bus reconnects
                    # (backoff capped at 2 s) and reports its gap well before they end.
                    await anyio.sleep(0.4)
                    redis.kill()
                    await anyio.sleep(1.8)
                    redis.start()

                async with anyio.create_task_group() as group:
                    group.start_soon(restart_mid_stream)
                    with anyio.fail_after(30):
                        results = await asyncio.gather(
                            *(flows.call_tool("pipeline", {"job": job, "slow": 6.0}) for job in ("x", "y"))
                        )
            assert [r.content[0].text for r in results] == ["published DATA(X)", "published DATA(Y)"]
            after = await served(http, a)
        count = {m: after.get(m, 0) - before.get(m, 0) for m in after}
        # One batch stream, ended by the gap; then each follower caught up and listened alone.
        assert count["subscriptions/listen"] >= 3, f"the followers listened again after the gap: {count}"
        assert count["tasks/get"] >= 2, f"each follower refetched after its stream ended: {count}"


@pytest.mark.needs_redis
async def test_a_server_without_listening_ahead_is_followed_a_stream_per_task(tmp_path: Path) -> None:
    settle("redis", await service_problem("redis"))
    with fleet(tmp_path, REDIS_URL, labels=("A",), MRTR_NO_TASK_KEYS="1") as servers:
        a = servers["A"].url
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            async with FlowClient(a, elicitation_callback=answer, tasks=True) as flows:
                results = [await flows.call_tool("pipeline", {"job": f"o{i}", "slow": 0}) for i in range(4)]
            assert [r.content[0].text for r in results] == [f"published DATA(O{i})" for i in range(4)]
            count = await served(http, a)
    assert count.get("tasks/get", 0) == 0, f"still no polls: {count}"
    # One stream per task, and the one batch stream the server did not honour (asked once).
    assert count["subscriptions/listen"] == 4 + 1, count
