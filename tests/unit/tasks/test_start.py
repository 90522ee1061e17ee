"""The opening of `start` every engine shares (`NewTask`), the host's half of the seam
(`HostStarter`), and the task options' one set of defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import ClientCapabilities

from mrtr._engine.journal import Journal
from mrtr._host.options import HostOptions
from mrtr._wire import CreateTaskResult
from mrtr.tasks._records import keyed_task_id
from mrtr.tasks._seam import (
    ANONYMOUS,
    TASK_LEASE,
    TASK_POLL_INTERVAL,
    TASK_SCAN_INTERVAL,
    TASK_TTL,
    Creator,
    EngineOptions,
    TaskCall,
)
from mrtr.tasks._start import HostStarter, NewTask
from tests.unit.tasks.kit import COUNT, fresh

pytestmark = pytest.mark.anyio


def new_task(creator: Creator = ANONYMOUS, options: EngineOptions | None = None, **arguments: Any) -> NewTask:
    return NewTask.of(TaskCall(COUNT, arguments, None, Journal.start()), creator, options or EngineOptions(), 100.0)


def test_without_a_key_every_task_gets_a_fresh_id() -> None:
    first, second = new_task(), new_task()
    assert first.key is None and first.kept["task_id"] != second.kept["task_id"]


def test_with_a_key_the_id_is_the_one_creator_tool_and_key_map_to() -> None:
    alice = Creator(owner="alice", idempotency_key="k")
    task = new_task(alice)
    assert task.key == "k" and task.kept["task_id"] == keyed_task_id("alice", "count", "k")
    assert new_task(alice).kept["task_id"] == task.kept["task_id"]
    assert new_task(Creator(owner="bob", idempotency_key="k")).kept["task_id"] != task.kept["task_id"]


def test_the_task_keeps_its_call_as_engines_store_it() -> None:
    journal = Journal.start()
    journal.pending = {"q": {"asked": "inline"}}  # type: ignore[dict-item]
    capabilities = ClientCapabilities.model_validate({"elicitation": {"form": {}}})
    options = EngineOptions(ttl=None, poll_interval=0.0001)
    task = NewTask.of(TaskCall(COUNT, {"upto": 2}, capabilities, journal), Creator(owner="o"), options, 42.0)
    assert journal.pending == {}, "an inline round's questions are not the task's"
    kept = task.kept
    assert kept["arguments"] == {"upto": 2} and kept["capabilities"] == {"elicitation": {"form": {}}}
    assert (kept["owner"], kept["created_at"], kept["ttl_ms"], kept["poll_interval_ms"]) == ("o", 42.0, None, 1)
    assert kept["flow"] == "count" and kept["journal"].startswith("j")


def test_a_resend_with_the_same_arguments_gets_the_existing_task_and_other_arguments_are_refused() -> None:
    task = new_task(Creator(idempotency_key="k"), upto=3)
    existing = fresh(task.kept["task_id"], "count", arguments={"upto": 3}, status="input_required")
    answered = task.resent(existing)
    assert isinstance(answered, CreateTaskResult)
    assert (answered.task_id, answered.status) == (existing.task_id, "input_required")
    with pytest.raises(MCPError) as refused:
        task.resent(fresh(task.kept["task_id"], "count", arguments={"upto": 4}))
    assert refused.value.error.data == {"reason": "idempotency_key_reused"}


class Engine:
    """Records what the host hands `start` (a `TaskEngine`'s start and owner_of, nothing more)."""

    def __init__(self) -> None:
        self.started: list[tuple[TaskCall, Creator]] = []

    def owner_of(self, request: Any) -> str | None:
        return f"owner-of-{request.who}"

    async def start(self, call: TaskCall, creator: Creator = ANONYMOUS) -> CreateTaskResult:
        self.started.append((call, creator))
        return CreateTaskResult(task_id="t", status="working")


class Request:
    """The two things a request tells the task seam: who sent it, and its `params._meta`."""

    def __init__(self, who: str, meta: Mapping[str, Any]) -> None:
        self.who = who
        self.params = {"_meta": dict(meta)}


async def test_the_host_reads_the_request_once_into_the_creator_the_engine_gets() -> None:
    engine = Engine()
    starter = HostStarter(engine)  # type: ignore[arg-type]
    journal = Journal.start()
    created = await starter.start(COUNT, {"upto": 1}, None, journal, Request("ada", {"mrtr/idempotencyKey": "k"}))
    await starter.start(COUNT, {}, None, Journal.start())  # no request: an unowned task without a key
    assert created.task_id == "t"
    (call, creator), (_, nobody) = engine.started
    assert call == TaskCall(COUNT, {"upto": 1}, None, journal)
    assert creator == Creator(owner="owner-of-ada", idempotency_key="k") and nobody == ANONYMOUS


async def test_a_malformed_key_is_refused_before_the_engine_is_asked() -> None:
    engine = Engine()
    with pytest.raises(MCPError):
        await HostStarter(engine).start(COUNT, {}, None, Journal.start(), Request("ada", {"mrtr/idempotencyKey": ""}))  # type: ignore[arg-type]
    assert engine.started == []


def test_the_task_options_defaults_are_written_once() -> None:
    defaults = EngineOptions()
    host = {f.name: f.default for f in fields(HostOptions)}
    assert (defaults.ttl, defaults.poll_interval, defaults.lease, defaults.scan_interval) == (
        TASK_TTL,
        TASK_POLL_INTERVAL,
        TASK_LEASE,
        TASK_SCAN_INTERVAL,
    )
    assert (host["task_ttl"], host["task_poll_interval"], host["task_lease"], host["task_scan_interval"]) == (
        TASK_TTL,
        TASK_POLL_INTERVAL,
        TASK_LEASE,
        TASK_SCAN_INTERVAL,
    )
    assert (defaults.ttl_ms, defaults.poll_interval_ms) == (3_600_000, 500)
