"""Durable tasks in one process: the tasks extension, flows as tasks, the task client."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr._engine.journal import Journal, decode
from mrtr.client import (
    CreatedTask,
    FlowClient,
    TaskCancelled,
    TasksClient,
    TaskSnapshot,
    cancel_task,
    get_task,
    update_task,
)
from mrtr.stores import RecordSeal, TaskRecord
from mrtr.stores._sqlite import SQLiteStore
from mrtr.tasks._seam import TaskCall
from tests.support.flowkit import SHARED_KEY, accept, new_server, sampled, task_state

pytestmark = pytest.mark.anyio


class Confirm(BaseModel):
    confirm: bool


class Name(BaseModel):
    name: str


def task_server(runs: Counter[str], **options: Any):
    server = new_server("tasks-under-test")
    flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), task_poll_interval=0.05, **options)

    @flows.tool(task="optional")
    async def confirm_delete(filename: str, ctx: mrtr.FlowContext) -> str:
        size = await ctx.step("stat", lambda: runs.update(["stat"]) or 42)
        ok = await ctx.elicit(f"Delete {filename} ({size} bytes)?", Confirm)
        if not ok.confirm:
            return "kept"
        await ctx.step("delete", lambda: runs.update(["delete"]))
        return f"deleted {filename}"

    @flows.tool(task="optional")
    async def survey(ctx: mrtr.FlowContext) -> str:
        first, second = await ctx.gather(ctx.elicit("First name?", Name), ctx.elicit("Last name?", Name))
        mood = await ctx.sample("Mood?", max_tokens=5)
        folders = await ctx.list_roots()
        return f"{first.name} {second.name}, {mood.content.text}, {len(folders)} roots"

    @flows.tool(task="optional")
    async def slow_compute(seconds: float, ctx: mrtr.FlowContext) -> str:
        try:
            await ctx.step("sleep", asyncio.sleep, seconds)
        except asyncio.CancelledError:
            runs["cancel-seen"] += 1
            raise
        return "done"

    @flows.tool(task="required")
    async def failing_job(ctx: mrtr.FlowContext) -> str:
        raise ValueError("disk on fire")  # an unexpected error: its text stays in the server log

    @flows.tool(task="required")
    async def protocol_error_job(ctx: mrtr.FlowContext) -> str:
        raise MCPError(code=-32050, message="backend refused")

    @flows.tool(task="optional", mrtr_first=True)
    async def greet_later(ctx: mrtr.FlowContext) -> str:
        who = await ctx.elicit("Who?", Name)
        await ctx.continue_as_task()
        await ctx.step("log", lambda: runs.update(["greeted"]))
        return f"Hello, {who.name}!"

    return server


async def answer(request: t.InputRequest) -> Any:
    if isinstance(request, t.ElicitRequest):
        message = request.params.message
        if "Delete" in message:
            return accept(confirm=True)
        return accept(name="Ada" if "First" in message else "Lovelace")
    if isinstance(request, t.CreateMessageRequest):
        return sampled("curious")
    return t.ListRootsResult(roots=[t.Root(uri="file:///a"), t.Root(uri="file:///b")])


def tasks_client(server, **kwargs: Any) -> Client:
    """A client that declares every capability; task inputs go through `TasksClient`, not callbacks."""
    return Client(
        server,
        extensions=[TasksClient(answer, **kwargs)],
        elicitation_callback=_unused,
        sampling_callback=_unused,
        list_roots_callback=_unused,
    )


async def _unused(*args: Any) -> Any:
    raise AssertionError("task inputs go through tasks/update, not callbacks")


async def wait_for(session, task_id: str, status: str, timeout: float = 5.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.02)


async def test_official_client_follows_a_task_transparently() -> None:
    runs: Counter[str] = Counter()
    seen: list[TaskSnapshot] = []
    async with tasks_client(task_server(runs), on_status=seen.append) as client:
        result = await client.call_tool("confirm_delete", {"filename": "a.txt"})
    assert result.content[0].text == "deleted a.txt" and not result.is_error
    assert runs == Counter(stat=1, delete=1), "steps run once although the flow replayed after the answer"
    statuses = [s.status for s in seen]
    # `working` first: the state the create answered with, reported although the task may be asking by now.
    assert statuses[0] == "working" and "input_required" in statuses and statuses[-1] == "completed"


async def test_create_result_is_flat_and_get_is_detailed() -> None:
    async with tasks_client(task_server(Counter())) as client:
        created = await client.session.call_tool("confirm_delete", {"filename": "b"}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        wire = created.model_dump(by_alias=True, exclude_none=True)
        assert wire["resultType"] == "task" and wire["status"] == "working"
        assert {"taskId", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} <= set(wire)
        assert not {"task", "result", "error", "inputRequests", "requestState"} & set(wire)
        task = await wait_for(client.session, created.task_id, "input_required")
        ((key, request),) = task["inputRequests"].items()
        assert request["method"] == "elicitation/create" and "Delete b (42 bytes)?" in request["params"]["message"]
        assert "requestState" not in task and task["resultType"] == "complete"
        await update_task(client.session, created.task_id, {key: {"action": "accept", "content": {"confirm": True}}})
        done = await wait_for(client.session, created.task_id, "completed")
        assert done["result"]["content"][0]["text"] == "deleted b"
        assert "_meta" not in done["result"] or "io.modelcontextprotocol/related-task" not in done["result"]["_meta"]


async def test_every_kind_of_input_and_partial_updates() -> None:
    async with tasks_client(task_server(Counter())) as client:
        created = await client.session.call_tool("survey", {}, allow_claimed=True)
        task = await wait_for(client.session, created.task_id, "input_required")
        keys = {r["params"]["message"]: k for k, r in task["inputRequests"].items()}
        assert set(keys) == {"First name?", "Last name?"}
        await update_task(
            client.session,
            created.task_id,
            {keys["First name?"]: {"action": "accept", "content": {"name": "Ada"}}, "never-asked": {"roots": []}},
        )
        partial = await task_state(client.session, created.task_id)  # read at once: the update is visible
        assert partial["status"] == "input_required"
        assert list(partial["inputRequests"]) == [keys["Last name?"]]
        # A wrong-schema answer is refused precisely and loses nothing.
        with pytest.raises(MCPError) as caught:
            await update_task(
                client.session, created.task_id, {keys["Last name?"]: {"action": "accept", "content": {}}}
            )
        assert caught.value.error.code == t.INVALID_PARAMS
        still = await task_state(client.session, created.task_id)
        assert list(still["inputRequests"]) == [keys["Last name?"]]
    # The client driver answers elicitation, sampling and roots alike.
    async with tasks_client(task_server(Counter())) as client:
        result = await client.call_tool("survey", {})
        assert result.content[0].text == "Ada Lovelace, curious, 2 roots"


async def test_errors_end_tasks_the_right_way() -> None:
    async with tasks_client(task_server(Counter())) as client:
        failing = await client.call_tool("failing_job", {})
        assert failing.is_error and failing.content[0].text == "Error executing tool failing_job"
        with pytest.raises(MCPError) as caught:
            await client.call_tool("protocol_error_job", {})
        assert caught.value.error.code == -32050 and caught.value.error.message == "backend refused"
        created = await client.session.call_tool("protocol_error_job", {}, allow_claimed=True)
        failed = await wait_for(client.session, created.task_id, "failed")
        assert failed["error"]["code"] == -32050 and "result" not in failed


async def test_without_the_extension() -> None:
    server = task_server(Counter())
    async with Client(server) as plain:
        # Optional task tools simply run inline.
        result = await plain.call_tool("slow_compute", {"seconds": 0})
        assert result.content[0].text == "done"
        with pytest.raises(MCPError) as caught:
            await plain.call_tool("failing_job", {})
        assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY
        assert caught.value.error.data == {
            "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        }
        with pytest.raises(MCPError) as caught:
            await task_state(plain.session, "anything")
        assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY
    async with tasks_client(server) as client:
        for call in (get_task, cancel_task):
            with pytest.raises(MCPError) as caught:
                await call(client.session, "no-such-task")
            assert caught.value.error.code == t.INVALID_PARAMS


async def test_cancel_reaches_the_flow_and_is_idempotent() -> None:
    runs: Counter[str] = Counter()
    async with tasks_client(task_server(runs)) as client:
        created = await client.session.call_tool("slow_compute", {"seconds": 30}, allow_claimed=True)
        await asyncio.sleep(0.1)
        await cancel_task(client.session, created.task_id)
        await wait_for(client.session, created.task_id, "cancelled", timeout=3)
        assert runs["cancel-seen"] == 1
        await cancel_task(client.session, created.task_id)  # terminal: same empty ack

        waiting = await client.session.call_tool("confirm_delete", {"filename": "c"}, allow_claimed=True)
        await wait_for(client.session, waiting.task_id, "input_required")
        await cancel_task(client.session, waiting.task_id)
        cancelled = await task_state(client.session, waiting.task_id)
        assert cancelled["status"] == "cancelled" and "inputRequests" not in cancelled

    created_ids: list[str] = []
    async with Client(
        task_server(runs), extensions=[TasksClient(answer, on_created=lambda c: created_ids.append(c.task_id))]
    ) as client:
        follower = asyncio.create_task(client.call_tool("slow_compute", {"seconds": 30}))
        await asyncio.sleep(0.2)
        (task_id,) = created_ids
        await cancel_task(client.session, task_id)
        with pytest.raises(TaskCancelled):
            await follower


async def test_mrtr_rounds_then_a_task() -> None:
    runs: Counter[str] = Counter()
    async with tasks_client(task_server(runs)) as client:
        first = await client.session.call_tool("greet_later", {}, allow_input_required=True, allow_claimed=True)
        assert isinstance(first, t.InputRequiredResult)
        (key,) = first.input_requests or {}
        second = await client.session.call_tool(
            "greet_later",
            {},
            input_responses={key: accept(name="Alice")},
            request_state=first.request_state,
            allow_input_required=True,
            allow_claimed=True,
        )
        assert isinstance(second, CreatedTask)
        assert not {"requestState", "inputRequests"} & set(second.model_dump(by_alias=True, exclude_none=True))
        done = await wait_for(client.session, second.task_id, "completed")
        assert done["result"]["content"][0]["text"] == "Hello, Alice!"
    assert runs["greeted"] == 1


async def test_flow_client_follows_tasks_and_reports_status() -> None:
    statuses: list[str] = []

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        return accept(confirm=True)

    async with FlowClient(
        task_server(Counter()), elicit=elicit, tasks=True, on_task=lambda s: statuses.append(s.status)
    ) as flows:
        result = await flows.call_tool("confirm_delete", {"filename": "d"})
    assert result.content[0].text == "deleted d"
    assert statuses[0] == "working" and statuses[-1] == "completed" and "input_required" in statuses


async def test_expired_tasks_are_unknown() -> None:
    async with tasks_client(task_server(Counter(), task_ttl=0.3)) as client:
        created = await client.session.call_tool("slow_compute", {"seconds": 0}, allow_claimed=True)
        await wait_for(client.session, created.task_id, "completed")
        await asyncio.sleep(0.4)
        with pytest.raises(MCPError) as caught:
            await task_state(client.session, created.task_id)
        assert caught.value.error.code == t.INVALID_PARAMS


class _TaskParams(t.RequestParams):
    task_id: str


class _SeedResult(t.Request[_TaskParams, str]):
    name_param = "taskId"


class _SeedAnswer(t.RequestParams):
    input_responses: dict[str, Any]


class _SeedInputResponse(t.Request[_SeedAnswer, str]):
    pass


async def test_seed_dialect_is_off_by_default_and_works_when_asked() -> None:
    from pydantic import TypeAdapter

    any_dict = TypeAdapter(dict[str, Any])
    async with tasks_client(task_server(Counter())) as client:
        with pytest.raises(MCPError) as caught:
            await client.session.send_request(
                _SeedResult(method="tasks/result", params=_TaskParams(task_id="x")), any_dict
            )
        assert caught.value.error.code == t.METHOD_NOT_FOUND

    async with tasks_client(task_server(Counter(), dialects=["sep-2322-tasks"])) as client:
        created = await client.session.call_tool("confirm_delete", {"filename": "e"}, allow_claimed=True)
        await wait_for(client.session, created.task_id, "input_required")
        asked = await client.session.send_request(
            _SeedResult(method="tasks/result", params=_TaskParams(task_id=created.task_id)), any_dict
        )
        assert asked["resultType"] == "input_required"
        (key,) = asked["inputRequests"]
        related = {"io.modelcontextprotocol/related-task": {"taskId": created.task_id}}
        # Off-schema first: acknowledged, and the question stays open (the seed's rule).
        for content in ({"nonsense": 1}, {"confirm": True}):
            params = _SeedAnswer(input_responses={key: {"action": "accept", "content": content}}, _meta=related)
            ack = await client.session.send_request(
                _SeedInputResponse(method="tasks/input_response", params=params), any_dict
            )
            assert ack["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": created.task_id}
            if "nonsense" in content:
                assert (await task_state(client.session, created.task_id))["status"] == "input_required"
        final = await client.session.send_request(
            _SeedResult(method="tasks/result", params=_TaskParams(task_id=created.task_id)), any_dict
        )
        assert final["content"][0]["text"] == "deleted e"


def opened(record: TaskRecord) -> TaskRecord:
    """A record as the store holds it (sealed at rest with the server's key), opened to look inside."""
    return RecordSeal.from_keys([SHARED_KEY]).open(record)


class _SlowSaves:
    """A real store whose writes take a while, recording any write cancelled half-way."""

    def __init__(self, inner: SQLiteStore) -> None:
        self._inner = inner
        self.cancelled_writes = 0
        self.step_writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save(self, record: Any) -> bool:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.cancelled_writes += 1
            raise
        saved = await self._inner.save(record)
        if saved and any(key.endswith("lookup") for key in decode(opened(record).journal).steps):
            self.step_writes += 1
        return saved


async def test_a_steps_checkpoint_write_is_part_of_the_step_and_never_cancelled_by_settling() -> None:
    runs: Counter[str] = Counter()
    store = _SlowSaves(SQLiteStore(":memory:"))
    server = new_server("tasks-under-test")
    flows = mrtr.Flows(server, store=store, task_poll_interval=0.05)  # type: ignore[arg-type]

    @flows.tool(task="required")
    async def lookup_and_ask(ctx: mrtr.FlowContext) -> str:
        name, found = await ctx.gather(
            ctx.elicit("Who?", Name), ctx.step("lookup", lambda: runs.update(["lookup"]) or "found")
        )
        return f"{name.name}: {found}"

    async with tasks_client(server) as client:
        created = await client.session.call_tool("lookup_and_ask", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        task = await wait_for(client.session, created.task_id, "input_required")
        assert store.step_writes >= 1, "the step's checkpoint reached the store before the task parked"
        ((key, _),) = task["inputRequests"].items()
        await update_task(client.session, created.task_id, {key: {"action": "accept", "content": {"name": "Ada"}}})
        done = await wait_for(client.session, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "Ada: found"
    assert runs == Counter(lookup=1)
    assert store.cancelled_writes == 0, "settling cancelled a store write mid-flight"


class _CountedSaves:
    """A real store that remembers the journal's steps at each save."""

    def __init__(self, inner: SQLiteStore) -> None:
        self._inner = inner
        self.saved_steps: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save(self, record: Any) -> bool:
        saved = await self._inner.save(record)
        if saved and record.status == "working" and record.lease_owner is not None:
            self.saved_steps.append(sorted(decode(opened(record).journal).steps))
        return saved


async def test_a_step_followed_by_the_end_is_written_once_with_the_end() -> None:
    """Group commit: no checkpoint write of its own when nothing could happen between a step and the run's end."""
    store = _CountedSaves(SQLiteStore(":memory:"))
    flows = mrtr.Flows(new_server("tasks-under-test"), store=store, task_poll_interval=0.02)  # type: ignore[arg-type]
    runs: Counter[str] = Counter()

    @flows.tool(task="required")
    async def one_step(ctx: mrtr.FlowContext) -> str:
        return await ctx.step("work", lambda: runs.update(["work"]) or "done")

    async with tasks_client(flows.server) as client:
        created = await client.session.call_tool("one_step", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        done = await wait_for(client.session, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "done" and runs == Counter(work=1)
    record = await store.load(created.task_id, time.time())
    assert record is not None
    steps = decode(opened(record).journal).steps
    assert [key.split("/")[-1] for key in steps] == ["work"], "the final write carries it"
    # one write before the step (its start, for the history: a run cut short still shows), none
    # between the step and the final one
    assert store.saved_steps == [[]], f"no write between the step and the final one: {store.saved_steps}"


async def test_a_finished_step_is_stored_before_the_flow_waits_on_anything() -> None:
    """A worker that dies while the flow sleeps after a step must not run the step again."""
    store = _CountedSaves(SQLiteStore(":memory:"))
    flows = mrtr.Flows(new_server("tasks-under-test"), store=store, task_poll_interval=0.02)  # type: ignore[arg-type]
    sleeping = asyncio.Event()

    @flows.tool(task="required")
    async def step_then_wait(ctx: mrtr.FlowContext) -> str:
        first = await ctx.step("first", lambda: "one")
        sleeping.set()
        await asyncio.sleep(0.3)
        second = await ctx.step("second", lambda: "two")
        return f"{first} {second}"

    async with tasks_client(flows.server) as client:
        created = await client.session.call_tool("step_then_wait", {}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        await asyncio.wait_for(sleeping.wait(), 5)
        await asyncio.sleep(0.1)  # well inside the sleep
        record = await store.load(created.task_id, time.time())
        assert record is not None and record.status == "working"
        steps = decode(opened(record).journal).steps
        assert [key.split("/")[-1] for key in steps] == ["first"], "stored while it sleeps"
        done = await wait_for(client.session, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "one two"
    assert store.saved_steps[0] == [], "the first step's start, before it runs"
    assert store.saved_steps[1] == sorted(decode(opened(record).journal).steps), "one checkpoint, before the sleep"


async def test_an_instance_shutting_down_keeps_the_steps_that_finished() -> None:
    """A checkpoint write in flight when the instance stops lands; the next instance does not redo the step."""
    store = _SlowSaves(SQLiteStore(":memory:"))
    runs: Counter[str] = Counter()
    stepped = asyncio.Event()

    def lookup() -> str:
        runs.update(["lookup"])
        stepped.set()
        return "found"

    async def flow(ctx: mrtr.FlowContext) -> str:
        found = await ctx.step("lookup", lookup)
        await asyncio.sleep(0.5)
        return found

    first = mrtr.Flows(new_server("tasks-under-test"), store=store, task_lease=0.3)  # type: ignore[arg-type]
    first.tool(task="required", name="lookup_then_wait")(flow)
    created = await first.runtime.start(TaskCall(first.runtime.flows["lookup_then_wait"][0], {}, None, Journal.start()))
    await asyncio.wait_for(stepped.wait(), 5)
    await asyncio.sleep(0)  # the checkpoint write has started (a save takes 50 ms here)
    await first.runtime.close()  # shutting down mid-write
    assert store.cancelled_writes == 0 and store.step_writes == 1, "the write landed"

    second = mrtr.Flows(new_server("tasks-under-test"), store=store, task_lease=0.3)  # type: ignore[arg-type]
    second.tool(task="required", name="lookup_then_wait")(flow)
    async with asyncio.timeout(10):
        while (done := await store.load(created.task_id, time.time())) is None or done.status != "completed":
            await second.runtime.worker.scan_once()
            await asyncio.sleep(0.05)
    assert runs == Counter(lookup=1), "resumed past the step"
    await second.runtime.close()


async def test_a_task_of_a_flow_this_instance_does_not_know_is_left_for_one_that_does() -> None:
    """Rolling upgrades: an instance without the flow (or the journal format) gives the task back, untouched."""
    store = SQLiteStore(":memory:")
    old = mrtr.Flows(new_server("tasks-under-test"), store=store, task_lease=0.5)
    new = mrtr.Flows(new_server("tasks-under-test"), store=store, task_lease=0.5)
    runs: Counter[str] = Counter()

    @new.tool(task="required")
    async def added_in_v2(ctx: mrtr.FlowContext) -> str:
        await ctx.step("work", lambda: runs.update(["work"]))
        return "done by v2"

    @old.tool(task="required")
    async def something_else(ctx: mrtr.FlowContext) -> str:
        return "v1"

    spec = new.runtime.flows["added_in_v2"][0]
    new.runtime.worker.launch = lambda record: None  # type: ignore[method-assign]  # the v2 instance dies right after creating it
    created = await new.runtime.start(TaskCall(spec, {}, None, Journal.start()))
    await new.runtime.close()  # its lease lapses
    record = await store.load(created.task_id, time.time())
    assert record is not None
    await store.save(record.copy(lease_owner=None, lease_until=0.0))

    assert await old.runtime.worker.scan_once() == 1  # claims it, finds no such flow, gives it back
    await asyncio.sleep(0.1)
    left = await store.load(created.task_id, time.time())
    assert left is not None and left.status == "working" and left.lease_owner is None, "not failed, not held"
    assert await old.runtime.worker.scan_once() == 0, "and it does not try again at once"

    newer = mrtr.Flows(new_server("tasks-under-test"), store=store)
    newer.tool(task="required", name="added_in_v2")(added_in_v2)
    assert await newer.runtime.worker.scan_once() == 1
    async with asyncio.timeout(5):
        while (done := await store.load(created.task_id, time.time())) is None or done.status != "completed":
            await asyncio.sleep(0.02)
    assert runs == Counter(work=1)
    await old.runtime.close()
    await newer.runtime.close()


async def test_one_set_of_mcp_client_callbacks_answers_rounds_tasks_and_declares_capabilities() -> None:
    """mcp.Client's callbacks serve FlowClient, TasksClient and tasks_client alike (first-hour issue)."""
    from mrtr.client import tasks_client

    seen: list[str] = []

    async def elicitation_callback(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        seen.append(params.message)
        if "Delete" in params.message:
            return accept(confirm=True)
        return accept(name="Ada" if "First" in params.message else "Lovelace")

    async def sampling_callback(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return sampled("curious")

    async def list_roots_callback(context: Any) -> t.ListRootsResult:
        return t.ListRootsResult(roots=[t.Root(uri="file:///a")])

    callbacks = {
        "elicitation_callback": elicitation_callback,
        "sampling_callback": sampling_callback,
        "list_roots_callback": list_roots_callback,
    }
    runs: Counter[str] = Counter()
    server = task_server(runs)
    # A plain Client + TasksClient(callbacks) + tasks_client(...): the capabilities come with the callbacks.
    async with tasks_client(server, **callbacks) as client:
        result = await client.call_tool("survey", {})
    assert not result.is_error and result.content[0].text == "Ada Lovelace, curious, 1 roots"
    async with FlowClient(server, tasks=True, **callbacks) as flows:
        result = await flows.call_tool("confirm_delete", {"filename": "c.txt"})
    assert result.content[0].text == "deleted c.txt"
    assert "Delete c.txt (42 bytes)?" in seen
    with pytest.raises(ValueError, match="not both"):
        FlowClient(server, elicit=lambda params: None, elicitation_callback=elicitation_callback)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="answer= or at least one"):
        TasksClient()
