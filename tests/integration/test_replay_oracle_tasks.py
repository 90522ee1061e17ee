"""The replay oracle for durable tasks: random programs as `task="required"` tools.

The same generated programs (`tests/support/oracle_programs.py`) run as durable tasks on two server
instances sharing one SQLite file store (a fleet on one host). The client answers each
`input_required` phase through `tasks/update` with a random non-empty subset of the asks in a
random order (sometimes first with an unfit form answer, which must be refused with -32602 and
change nothing), each update sent to instance A, instance B or a fresh instance that joins for
that update (the instance whose update completes the set claims the task and replays it).
The task must complete with the straight-through reference's value, every step's function
must run exactly once, and every request and every status change is bounded in time.

Budget: `ORACLE_TASK_EXAMPLES` examples (default 80) on smaller programs (12 leaves): ~8 s on
an idle 2-core machine, under 30 s on a busy one, when the engine passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

import mrtr
from mrtr.client import CreatedTask, TasksClient, update_task
from mrtr.stores._sqlite import SQLiteStore
from tests.integration.test_replay_oracle import UNFIT
from tests.support.flowkit import new_server, task_state
from tests.support.oracle_programs import Node, programs, reference_run, register, user_reply

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("ORACLE_TASK_EXAMPLES", "80"))
PHASE_TIMEOUT = 10.0
POLL = 0.01


async def _never(*args: Any) -> Any:
    raise AssertionError("task inputs are answered through tasks/update by the test")


@contextlib.asynccontextmanager
async def instance(program: Node, runs: Counter[str], path: str) -> AsyncIterator[Client]:
    """One server instance of the task fleet (own runtime, shared store file) and a client to it."""
    server = new_server("oracle-tasks")
    store = SQLiteStore(path)
    flows = mrtr.Flows(server, store=store, max_rounds=200, task_poll_interval=POLL, task_scan_interval=0.05)
    register(flows, program, runs, task="required")
    client = Client(
        server,
        extensions=[TasksClient(_never)],
        elicitation_callback=_never,
        sampling_callback=_never,
        list_roots_callback=_never,
    )
    client.mrtr_flows = flows  # type: ignore[attr-defined]  # the waits oracle delivers events through it
    try:
        async with client:
            yield client
    finally:
        await flows.runtime.close()
        await store.close()


async def next_phase(client: Client, task_id: str) -> dict[str, Any]:
    """Poll (bounded) until the task leaves `working`."""
    with anyio.fail_after(PHASE_TIMEOUT):
        while True:
            task = await task_state(client.session, task_id)
            if task["status"] != "working":
                return task
            await asyncio.sleep(POLL)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    report_multiple_bugs=False,  # while a bug is open, shrink one failure instead of all of them
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(program=programs(max_leaves=12), data=st.data())
def test_random_programs_as_durable_tasks_complete_as_if_run_straight_through(
    program: Node, data: st.DataObject
) -> None:
    # A fresh event loop per example (not the anyio plugin's): hypothesis stops examples
    # with exceptions of its own, which must not outlive the example in a shared loop.
    asyncio.run(_durable_example(program, data))


async def _durable_example(program: Node, data: st.DataObject) -> None:
    reference = await reference_run(program)
    runs: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="mrtr-oracle-") as folder:
        path = os.path.join(folder, "tasks.db")
        async with instance(program, runs, path) as a, instance(program, runs, path) as b:
            with anyio.fail_after(PHASE_TIMEOUT):
                created = await a.session.call_tool("program", {}, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            task = await next_phase(a, created.task_id)
            phases = 1
            while task["status"] == "input_required":
                assert phases <= reference.asks, f"phase {phases + 1}, but the program asks only {reference.asks}"
                asked: dict[str, Any] = task["inputRequests"]
                order = data.draw(st.permutations(sorted(asked)), label="answer order")
                count = data.draw(st.integers(1, len(order)), label="answered in this update")
                which = data.draw(st.sampled_from(("A", "B", "fresh")), label="instance")
                async with contextlib.AsyncExitStack() as stack:
                    if which == "fresh":  # a new process joins, takes this update and replays the task
                        client = await stack.enter_async_context(instance(program, runs, path))
                    else:
                        client = a if which == "A" else b
                    task = await answer_phase(client, created.task_id, asked, order, count, data)
                if count == len(order):
                    phases += 1
            event(f"phases: {min(phases, 5)}{'+' if phases >= 5 else ''}")
    assert task["status"] == "completed", task
    result = task["result"]
    assert not result.get("isError"), result
    assert result["content"][0]["text"] == reference.value, "the task's value differs from the straight-through run"
    assert runs == reference.runs, "every step's function runs exactly once across the fleet"


async def answer_phase(
    client: Client, task_id: str, asked: dict[str, Any], order: list[str], count: int, data: st.DataObject
) -> dict[str, Any]:
    """Send this update (maybe after an unfit one) through `client`; returns the task's next phase."""
    responses = {key: user_reply(asked[key]) for key in order[:count]}
    forms = [key for key in order if asked[key]["method"] == "elicitation/create"]
    if forms and data.draw(st.sampled_from((False, False, False, True)), label="unfit answer first"):
        # A form answer that does not fit is refused precisely, and nothing is recorded.
        with anyio.fail_after(PHASE_TIMEOUT), pytest.raises(MCPError) as refused:
            await update_task(client.session, task_id, {forms[0]: UNFIT})
        assert refused.value.error.code == INVALID_PARAMS
        still = await task_state(client.session, task_id)
        assert still["status"] == "input_required" and set(still["inputRequests"]) == set(asked)
    with anyio.fail_after(PHASE_TIMEOUT):
        await update_task(client.session, task_id, responses)
    return await next_phase(client, task_id)
