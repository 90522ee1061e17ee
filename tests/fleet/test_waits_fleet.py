"""Durable waits (#25) across real server processes on every store: SQLite file, Redis, PostgreSQL.

Two uvicorn instances of `tests/support/task_server.py` share one store (under a namespace of
their own). Their flows sleep (`ctx.sleep`), wait for events (`ctx.wait_for_event`) and hand
out callback URLs (`ctx.callback_url`); the `send_event` tool calls `flows.send_event` on the
instance the test picks. Every side effect is a step that appends a line to the audit file
(MRTR_AUDIT), labelled with a per-task tag, so the tests count what really ran, and where.

- A sleeping task finishes after both instances are SIGKILLed and a fresh one starts (one
  falls due while the fleet is down, one after the fresh instance is up); a wait's
  timeout fires across the restart too, and an event put in the store while no instance
  lives wakes its task on the fresh one.
- An event sent on B wakes a task parked on A; one sent before the wait is kept and delivered
  once; a duplicate `event_id` (sent on both instances at once) delivers once; a burst of 60
  events through both instances loses none; a worker SIGKILLed right after taking an event
  loses nothing (the other instance replays the wait with the same payload); an event races
  a timer (`asyncio.wait`) across instances.
- A callback URL POSTed to the real HTTP route is accepted once (202; POSTed to both instances
  at once, one of them answers 409), and refused when tampered or sent to another task's path
  or event (403), expired (410) or reused (409); nothing reaches any other task.
- `EventTimeout` fires on time (measured and printed; only a loose bound is asserted).

The redis/postgres cases need the local services (127.0.0.1:6379, :5432): without them they
skip, except under `CI=true`, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from mcp import Client

from mrtr.client import CreatedTask, TasksClient
from mrtr.stores import RecordSeal, open_store
from mrtr.tasks import EngineOptions, TaskRuntime
from tests.support.flowkit import task_state
from tests.support.markers import backends
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, spawn_servers
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, cluster_url, drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = SUPPORT / "task_server.py"
READY = "task-server ready:"
PUBLIC_URL = "http://waits-fleet.invalid"
"""The fleet's public base URL as the flows mint it; the tests POST to a real instance instead
(what a load balancer in front of the fleet does)."""
STORES = backends("sqlite", "redis", "redis-cluster", "postgres")


# -- the fleet ------------------------------------------------------------------------------


async def store_for(kind: str, workdir: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """(store URL, namespace) for a fresh, private store of `kind`; skips or fails if it is missing."""
    namespace = f"mrtr_waits_{secrets.token_hex(4)}"
    if kind == "sqlite":
        return f"sqlite:///{workdir / 'tasks.db'}", namespace
    found = cluster_url(kind, request)
    if found is not None:
        return found, namespace
    problem = await service_problem(kind)
    if problem is not None:
        message = f"{kind} is not reachable ({problem})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so the {kind} store must be tested", pytrace=False)
        pytest.skip(message)
    return (REDIS_URL if kind == "redis" else POSTGRES_DSN), namespace


async def drop_store(kind: str, namespace: str) -> None:
    if kind == "redis":
        await drop_namespace("redis", namespace)
    # redis-cluster: the session's private cluster goes away with the session
    elif kind == "postgres":
        await drop_namespace("postgres", namespace)
        await drop_namespace("postgres", f"{namespace}_bus")  # the bus derived from the store


@dataclass
class Fleet:
    kind: str
    env: dict[str, str]
    audit: Path
    workdir: Path
    servers: dict[str, ServerProcess]

    def url(self, label: str) -> str:
        return self.servers[label].url

    def base(self, label: str) -> str:
        return self.servers[label].url.removesuffix("/mcp")

    def spawn(self, labels: list[str]) -> AbstractContextManager[dict[str, ServerProcess]]:
        """Start these instances on the fleet's store (stopped again when the block ends)."""
        specs = [
            ServerSpec(label, self.env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix=READY)
            for label in labels
        ]
        return spawn_servers(specs, self.workdir)


async def new_fleet(kind: str, workdir: Path, request: pytest.FixtureRequest) -> tuple[Fleet, str]:
    store, namespace = await store_for(kind, workdir, request)
    audit = workdir / "audit.jsonl"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": store,
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(audit),
        "MRTR_PUBLIC_URL": PUBLIC_URL,
    }
    return Fleet(kind, env, audit, workdir, {}), namespace


@pytest.fixture(scope="module", params=STORES)
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Instances A and B on one store, shared by this module's tests of that store (they never kill)."""
    kind: str = request.param
    fleet, namespace = asyncio.run(new_fleet(kind, tmp_path_factory.mktemp(f"waits-{kind}"), request))
    try:
        with fleet.spawn(["A", "B"]) as servers:
            fleet.servers = servers
            yield fleet
    finally:
        asyncio.run(drop_store(kind, namespace))


# -- helpers --------------------------------------------------------------------------------


async def _never(*args: Any) -> Any:
    raise AssertionError("these flows never ask the client")


def client(url: str) -> Client:
    return Client(url, extensions=[TasksClient(_never)], elicitation_callback=_never)


def new_tag() -> str:
    return secrets.token_hex(6)


def audit(path: Path, tag: str, step: str | None = None) -> list[dict[str, Any]]:
    """The side effects the task labelled `tag` really ran (optionally: of one step)."""
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e.get("tag") == tag and (step is None or e["step"] == step)]


async def start(on: Client, tool: str, args: dict[str, Any]) -> str:
    created = await on.session.call_tool(tool, args, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return str(created.task_id)


async def until(predicate: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def parked(on: Client, task_id: str, message: str, timeout: float = 10.0) -> dict[str, Any]:
    """The task once it is parked `working` with `message` in its statusMessage."""

    async def check() -> dict[str, Any] | None:
        task = await task_state(on.session, task_id)
        assert task["status"] == "working", task
        return task if message in task.get("statusMessage", "") else None

    return await until(check, timeout, f"task {task_id} to park on {message!r}")  # type: ignore[no-any-return]


async def completed(on: Client, task_id: str, timeout: float) -> tuple[str, float]:
    """The completed task's result text, and when (time.time()) the poll saw it complete."""

    async def check() -> dict[str, Any] | None:
        task = await task_state(on.session, task_id)
        assert task["status"] in ("working", "completed"), task
        return task if task["status"] == "completed" else None

    done = await until(check, timeout, f"task {task_id} to complete")
    assert not done["result"].get("isError"), done["result"]
    return str(done["result"]["content"][0]["text"]), time.time()


async def send(on: Client, task_id: str, name: str, payload: Any, event_id: str | None = None) -> dict[str, Any]:
    """`flows.send_event` on the instance `on` talks to."""
    result = await on.call_tool(
        "send_event", {"task_id": task_id, "name": name, "payload": payload, "event_id": event_id}
    )
    assert not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


# -- 1. a sleep outlives the whole fleet ------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
async def test_a_sleeping_task_outlives_the_whole_fleet(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    fleet, namespace = await new_fleet(kind, tmp_path, request)
    nap_tag, short_tag, wait_tag, event_tag = new_tag(), new_tag(), new_tag(), new_tag()
    try:
        with fleet.spawn(["A", "B"]) as servers:
            fleet.servers = servers
            async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
                began = time.time()
                napping = await start(on_a, "nap", {"tag": nap_tag, "seconds": 3.0})
                dozing = await start(on_b, "nap", {"tag": short_tag, "seconds": 1.5})  # overdue when C boots
                waiting = await start(on_b, "await_event", {"tag": wait_tag, "name": "never", "timeout": 3.0})
                hearing = await start(on_a, "await_event", {"tag": event_tag, "name": "go"})
                await parked(on_b, napping, "sleeping until")
                await parked(on_a, dozing, "sleeping until")
                await parked(on_a, waiting, "waiting for event 'never' (timeout until")
                await parked(on_b, hearing, "waiting for event 'go'")
            for server in servers.values():
                server.process.kill()  # SIGKILL: no shutdown, no cleanup
                server.process.wait()
            killed = time.time() - began
        assert not audit(fleet.audit, nap_tag, "nap.after"), f"the sleep ended before the fleet died ({killed:.2f}s)"
        assert not audit(fleet.audit, short_tag, "nap.after"), f"the short nap ended before the kill ({killed:.2f}s)"
        assert not audit(fleet.audit, wait_tag, "await.timeout")
        # While no instance lives, an event goes straight into the store (as `mrtr tasks event` does).
        store = open_store(fleet.env["MRTR_STORE"], namespace=namespace)
        try:
            ring = RecordSeal.from_keys([bytes.fromhex(fleet.env["MRTR_STATE_KEY"])])  # records are sealed at rest
            assert await TaskRuntime(store, EngineOptions(seal=ring)).send_event(
                hearing, "go", {"sent": "while dead"}, event_id="e-1"
            )
        finally:
            await store.close()
        await asyncio.sleep(max(0.0, began + 2.0 - time.time()))
        with fleet.spawn(["C"]) as servers:  # a fresh instance: no request reaches it before the tasks end
            fleet.servers = servers
            booted = time.time() - began
            async with client(fleet.url("C")) as on_c:
                short_text, short_done = await completed(on_c, dozing, timeout=20)
                nap_text, nap_done = await completed(on_c, napping, timeout=20)
                wait_text, wait_done = await completed(on_c, waiting, timeout=20)
                event_text, _ = await completed(on_c, hearing, timeout=20)
    finally:
        await drop_store(kind, namespace)
    print(
        f"\n[{kind}] fleet killed at {killed:.2f}s, fresh instance up at {booted:.2f}s; completed on it: "
        f"the 1.5s nap at {short_done - began:.2f}s, the 3s nap at {nap_done - began:.2f}s, "
        f"the 3s event timeout at {wait_done - began:.2f}s"
    )
    assert nap_text == f"{nap_tag} rested 3.0s" and short_text == f"{short_tag} rested 1.5s"
    assert [e["instance"] for e in audit(fleet.audit, short_tag, "nap.before")] == ["B"]
    assert [e["instance"] for e in audit(fleet.audit, short_tag, "nap.after")] == ["C"], "overdue: run at boot"
    assert nap_done - began >= 3.0, "it slept its 3 seconds"
    assert [e["instance"] for e in audit(fleet.audit, nap_tag, "nap.before")] == ["A"], "run once, before the sleep"
    assert [e["instance"] for e in audit(fleet.audit, nap_tag, "nap.after")] == ["C"], "run once, after it"
    assert json.loads(wait_text) == [{"timeout": "no event 'never' arrived within 3s"}]
    assert [e["instance"] for e in audit(fleet.audit, wait_tag, "await.before")] == ["B"]
    assert [e["instance"] for e in audit(fleet.audit, wait_tag, "await.timeout")] == ["C"]
    assert json.loads(event_text) == [{"payload": {"sent": "while dead"}}]
    assert [e["instance"] for e in audit(fleet.audit, event_tag, "await.before")] == ["A"]
    assert [e["instance"] for e in audit(fleet.audit, event_tag, "await.got")] == ["C"]


# -- 2-4. events across instances -------------------------------------------------------------


async def test_an_event_sent_on_b_wakes_a_task_parked_on_a(fleet: Fleet) -> None:
    tag = new_tag()
    async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
        task_id = await start(on_a, "await_event", {"tag": tag, "name": "go"})
        await parked(on_a, task_id, "waiting for event 'go'")
        assert [e["instance"] for e in audit(fleet.audit, tag, "await.before")] == ["A"]
        sent = time.time()
        assert await send(on_b, task_id, "go", {"build": 7}) == {"delivered": True, "instance": "B"}
        text, done = await completed(on_a, task_id, timeout=10)
    print(f"\n[{fleet.kind}] event sent on B -> task completed (seen by polls on A) in {done - sent:.3f}s")
    assert json.loads(text) == [{"payload": {"build": 7}}]
    (got,) = audit(fleet.audit, tag, "await.got")
    assert got["payload"] == {"build": 7}
    assert len(audit(fleet.audit, tag, "await.before")) == 1, "the step before the wait ran once"


@pytest.mark.parametrize("before", ["sleeping", "running"])
async def test_an_event_sent_before_the_wait_is_delivered_once(fleet: Fleet, before: str) -> None:
    """The flow first sleeps (parked, no worker) or runs a slow step on A (its worker holds the
    lease); the event, sent on B meanwhile, is kept and taken by exactly one wait: the flow's
    second wait for the same name times out."""
    tag = new_tag()
    args: dict[str, Any] = {"tag": tag, "name": "early", "times": 2, "timeout": 1.0}
    args |= {"delay": 1.5} if before == "sleeping" else {"lead": 1.5}
    async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
        task_id = await start(on_a, "await_event", args)
        if before == "sleeping":
            await parked(on_a, task_id, "sleeping until")
        else:

            async def leading() -> list[dict[str, Any]]:
                return audit(fleet.audit, tag, "await.lead")

            await until(leading, 10, "the slow step before the wait to start")
        assert await send(on_b, task_id, "early", "first and only") == {"delivered": True, "instance": "B"}
        still = await task_state(on_b.session, task_id)
        assert still["status"] == "working" and "waiting for event" not in still.get("statusMessage", ""), still
        if before == "sleeping":
            assert still["statusMessage"].startswith("sleeping until"), "an early event does not wake the sleeper"
        text, _ = await completed(on_b, task_id, timeout=15)
    assert json.loads(text) == [
        {"payload": "first and only"},
        {"timeout": "no event 'early' arrived within 1s"},
    ]
    assert [e["payload"] for e in audit(fleet.audit, tag, "await.got")] == ["first and only"]
    assert len(audit(fleet.audit, tag, "await.timeout")) == 1
    if before == "running":
        assert [(e["phase"], e["instance"]) for e in audit(fleet.audit, tag, "await.lead")] == [
            ("start", "A"),
            ("end", "A"),
        ]


async def test_a_duplicate_event_id_is_delivered_once(fleet: Fleet) -> None:
    """The same `event_id`, sent on both instances at once (each with its own payload), then again:
    one delivery, whose payload the flow gets; its second wait for the name times out."""
    tag = new_tag()
    async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
        task_id = await start(on_a, "await_event", {"tag": tag, "name": "paid", "times": 2, "timeout": 1.5})
        await parked(on_b, task_id, "waiting for event 'paid'")
        replies = await asyncio.gather(
            send(on_a, task_id, "paid", {"via": "A"}, event_id="charge-1"),
            send(on_b, task_id, "paid", {"via": "B"}, event_id="charge-1"),
        )
        assert sorted(r["delivered"] for r in replies) == [False, True], replies
        (winner,) = [r["instance"] for r in replies if r["delivered"]]
        assert await send(on_a, task_id, "paid", {"via": "late"}, event_id="charge-1") == {
            "delivered": False,
            "instance": "A",
        }
        text, _ = await completed(on_a, task_id, timeout=15)
        assert await send(on_b, task_id, "paid", {"via": "later"}, event_id="charge-1") == {
            "delivered": False,
            "instance": "B",
        }, "a finished task still recognises the id"
        refused = await send(on_b, task_id, "paid", {"via": "new"}, event_id="charge-2")
        assert refused == {"delivered": False, "refused": "task_finished", "instance": "B"}
    assert json.loads(text) == [{"payload": {"via": winner}}, {"timeout": "no event 'paid' arrived within 1.5s"}]
    assert [e["payload"] for e in audit(fleet.audit, tag, "await.got")] == [{"via": winner}]


async def test_a_burst_of_events_from_both_instances_is_delivered_whole(fleet: Fleet) -> None:
    """60 distinct events sent at once, half through A, half through B, to one task that waits for
    them one by one: every send is accepted (compare-and-set retries, not `busy`), the flow gets
    each payload exactly once."""
    tag = new_tag()
    n = 60
    async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
        task_id = await start(on_a, "await_event", {"tag": tag, "name": "tick", "times": n, "timeout": 5.0})
        await parked(on_b, task_id, "waiting for event 'tick'")
        began = time.time()
        replies = await asyncio.gather(
            *(send(on_a if i % 2 else on_b, task_id, "tick", i, event_id=f"tick-{i}") for i in range(n))
        )
        assert [r for r in replies if not r["delivered"]] == []
        text, done = await completed(on_a, task_id, timeout=20)
    print(f"\n[{fleet.kind}] {n} events sent at once through A and B, all consumed in {done - began:.2f}s")
    assert sorted(got["payload"] for got in json.loads(text)) == list(range(n))
    assert sorted(e["payload"] for e in audit(fleet.audit, tag, "await.got")) == list(range(n))


@pytest.mark.parametrize("kind", STORES)
async def test_a_worker_killed_after_taking_an_event_loses_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The event wakes the task; its worker runs the step after the wait and is SIGKILLed in it.
    The other instance takes over once the lease lapses: the wait returns the same payload, the
    finished step is not run again, the interrupted one runs again under the same key."""
    fleet, namespace = await new_fleet(kind, tmp_path, request)
    tag = new_tag()
    try:
        with fleet.spawn(["A", "B"]) as servers:
            fleet.servers = servers
            async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
                task_id = await start(on_a, "await_event", {"tag": tag, "name": "go", "work": 2.0})
                await parked(on_a, task_id, "waiting for event 'go'")
                assert (await send(on_b, task_id, "go", {"n": 1}))["delivered"]

                async def working() -> list[dict[str, Any]]:
                    return audit(fleet.audit, tag, "await.work")

                (began,) = await until(working, 10, "the step after the wait to start")
                doomed = began["instance"]
                survivor, on_survivor = ("A", on_a) if doomed == "B" else ("B", on_b)
                servers[doomed].process.kill()
                servers[doomed].process.wait()
                text, _ = await completed(on_survivor, task_id, timeout=20)
    finally:
        await drop_store(kind, namespace)
    assert json.loads(text) == [{"payload": {"n": 1}}]
    assert [e["instance"] for e in audit(fleet.audit, tag, "await.got")] == [doomed], "a finished step runs once"
    work = audit(fleet.audit, tag, "await.work")
    starts = [e for e in work if e["phase"] == "start"]
    assert [e["instance"] for e in starts] == [doomed, survivor], "the interrupted step runs again"
    assert starts[0]["key"] == starts[1]["key"], "under the same idempotency key"
    assert [e["instance"] for e in work if e["phase"] == "end"] == [survivor]


async def test_first_of_an_event_and_a_timer_across_instances(fleet: Fleet) -> None:
    """`asyncio.wait` over `wait_for_event` and `sleep`: an event sent on B beats a 3 s timer on a
    task started on A (it does not wait the timer out); with no event, a 1 s timer wins. Either
    way the decision is taken once, and the flow parks and replays after it the same way."""
    approved_tag, lapsed_tag = new_tag(), new_tag()
    async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
        began = time.time()
        approved = await start(on_a, "deadline", {"tag": approved_tag, "seconds": 3.0})
        lapsed = await start(on_b, "deadline", {"tag": lapsed_tag, "seconds": 1.0})
        state = await parked(on_a, approved, "waiting for event 'approve'")
        assert "sleeping until" in state["statusMessage"], state
        assert (await send(on_b, approved, "approve", "yes"))["delivered"]
        approved_text, approved_done = await completed(on_a, approved, timeout=10)
        lapsed_text, lapsed_done = await completed(on_a, lapsed, timeout=10)
    print(
        f"\n[{fleet.kind}] event beat the 3s timer: done at {approved_done - began:.2f}s; "
        f"the 1s timer (no event): done at {lapsed_done - began:.2f}s"
    )
    assert approved_text == "approved yes" and approved_done - began < 2.5, "the event did not wait for the timer"
    assert lapsed_text == "timed out" and lapsed_done - began >= 1.2  # 1 s, then the 0.2 s sleep after it
    for tag, winner in ((approved_tag, "approved yes"), (lapsed_tag, "timed out")):
        assert [e["winner"] for e in audit(fleet.audit, tag, "deadline.decide")] == [winner]
        assert len(audit(fleet.audit, tag, "deadline.after")) == 1


# -- 5. callback URLs over real HTTP ----------------------------------------------------------


def tampered(url: str) -> str:
    """The URL with one character in the middle of its sealed token changed."""
    head, token = url.rsplit("/", 1)
    middle = len(token) // 2
    swapped = "B" if token[middle] != "B" else "C"
    return f"{head}/{token[:middle]}{swapped}{token[middle + 1 :]}"


async def test_a_callback_url_is_accepted_once_and_bound(fleet: Fleet) -> None:
    mine, theirs, brief = new_tag(), new_tag(), new_tag()
    async with AsyncExitStack() as stack:
        on_a = await stack.enter_async_context(client(fleet.url("A")))
        on_b = await stack.enter_async_context(client(fleet.url("B")))
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        my_task = await start(on_a, "hooked", {"tag": mine})
        their_task = await start(on_b, "hooked", {"tag": theirs})
        brief_task = await start(on_a, "hooked", {"tag": brief, "expires": 0.5})

        async def urls() -> dict[str, str] | None:
            found = {tag: audit(fleet.audit, tag, "hooked.url") for tag in (mine, theirs, brief)}
            return {tag: e[0]["url"] for tag, e in found.items()} if all(found.values()) else None

        minted: dict[str, str] = await until(urls, 10, "the three callback URLs")
        brief_seen = time.time()  # the brief URL was minted before this: it expires before brief_seen + 0.5
        for tag, task_id in ((mine, my_task), (theirs, their_task), (brief, brief_task)):
            assert minted[tag].startswith(f"{PUBLIC_URL}/mrtr/events/{task_id}/ci/")
            await parked(on_a, task_id, "waiting for event 'ci'")

        def at(label: str, url: str) -> str:
            return url.replace(PUBLIC_URL, fleet.base(label), 1)

        async def post(label: str, url: str, body: Any) -> tuple[int, dict[str, Any]]:
            response = await http.post(at(label, url), json=body)
            return response.status_code, response.json()

        my_url, their_url = minted[mine], minted[theirs]
        their_token = their_url.rsplit("/", 1)[1]
        status, reply = await post("A", tampered(my_url), {"status": "forged"})
        assert status == 403 and reply["delivered"] is False, reply
        foreign = my_url.rsplit("/", 1)[0] + "/" + their_token  # their token on my task's path
        assert (await post("B", foreign, {"status": "forged"}))[0] == 403
        assert (await post("A", their_url.replace(f"/{their_task}/", f"/{my_task}/"), {"status": "x"}))[0] == 403
        assert (await post("B", my_url.replace("/ci/", "/cd/"), {"status": "other event"}))[0] == 403

        await asyncio.sleep(max(0.0, brief_seen + 0.5 + 0.3 - time.time()))
        status, reply = await post("B", minted[brief], {"status": "too late"})
        assert status == 410, reply

        # The same URL POSTed to both instances at once: one is accepted, the other refused as reused.
        on_both = await asyncio.gather(post("A", my_url, {"status": "green"}), post("B", my_url, {"status": "green"}))
        assert sorted(status for status, _ in on_both) == [202, 409], on_both
        accepted = next(reply for status, reply in on_both if status == 202)
        assert accepted == {"delivered": True, "task": my_task, "event": "ci"}, accepted
        assert (await post("A", my_url, {"status": "again"}))[0] == 409
        assert (await post("B", my_url, {"status": "again"}))[0] == 409

        text, _ = await completed(on_a, my_task, timeout=10)
        assert json.loads(text) == {"status": "green"}
        for task_id in (their_task, brief_task):
            task = await task_state(on_b.session, task_id)
            assert task["status"] == "working" and "waiting for event 'ci'" in task["statusMessage"], task
    assert [e["payload"] for e in audit(fleet.audit, mine, "hooked.deploy")] == [{"status": "green"}]
    assert len(audit(fleet.audit, mine, "hooked.url")) == 1, "the URL was minted and handed out once"
    assert not audit(fleet.audit, theirs, "hooked.deploy") and not audit(fleet.audit, brief, "hooked.deploy")


# -- 6. timeouts ----------------------------------------------------------------------------


async def test_event_timeout_fires_on_time(fleet: Fleet) -> None:
    tag = new_tag()
    timeout = 2.0
    async with client(fleet.url("A")) as on_a, client(fleet.url("B")) as on_b:
        began = time.time()
        task_id = await start(on_a, "await_event", {"tag": tag, "name": "never", "timeout": timeout})
        text, done = await completed(on_b, task_id, timeout=15)
    (before,) = audit(fleet.audit, tag, "await.before")
    (fired,) = audit(fleet.audit, tag, "await.timeout")
    late = done - began - timeout
    print(
        f"\n[{fleet.kind}] a {timeout}s EventTimeout: completion seen {late:+.3f}s after the timeout "
        f"(counted from the call; polls every 50 ms), fired on {fired['instance']}"
    )
    assert json.loads(text) == [{"timeout": f"no event 'never' arrived within {timeout:g}s"}]
    assert before["instance"] == "A"
    assert 0.0 <= late < 2.0, f"the timeout fired {late:.3f}s late"
