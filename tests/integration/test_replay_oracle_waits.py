"""The replay oracle with durable waits: random task programs that also sleep and wait for events.

The programs of `tests/support/oracle_programs.py`, with `Wait` leaves (`ctx.sleep`,
`ctx.wait_for_event` for events the driver sends, and for events it never sends, which time
out), run as durable tasks on two instances sharing one SQLite file. The driver answers asks as
the task oracle does, and delivers each event the task says it waits for (`_meta["mrtr/waiting"]`)
through a random instance: sometimes all of them before the flow gets there, sometimes twice
under one `event_id` (the second must change nothing). A wait's new outcome is taken only when
the flow is quiescent, so waits inside `ctx.gather`, `asyncio.gather`, task groups, pipes and
loops must replay exactly as they first ran: the task completes with the straight-through
reference's value, and every step's function runs exactly once.

Budget: `ORACLE_WAIT_EXAMPLES` examples (default 60) of up to 10 leaves: ~6 s on an idle 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import Counter
from typing import Any

import anyio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mrtr
from mrtr.client import CreatedTask, update_task
from tests.integration.test_replay_oracle_tasks import instance
from tests.support.flowkit import task_state
from tests.support.oracle_programs import Node, event_payload, programs, reference_run, user_reply

EXAMPLES = int(os.environ.get("ORACLE_WAIT_EXAMPLES", "60"))
PHASE_TIMEOUT = 15.0


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(program=programs(max_leaves=10, waits=True), data=st.data())
def test_random_programs_with_waits_complete_as_if_run_straight_through(program: Node, data: st.DataObject) -> None:
    asyncio.run(_waiting_example(program, data))


async def _waiting_example(program: Node, data: st.DataObject) -> None:
    reference = await reference_run(program)
    runs: Counter[str] = Counter()
    sent: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="mrtr-oracle-waits-") as folder:
        path = os.path.join(folder, "tasks.db")
        async with instance(program, runs, path) as a, instance(program, runs, path) as b:
            fleet = {"A": a, "B": b}

            async def deliver(name: str) -> None:
                which = data.draw(st.sampled_from(("A", "B")), label="event via")
                flows: mrtr.Flows = fleet[which].mrtr_flows  # type: ignore[attr-defined]
                first = await flows.send_event(task_id, name, event_payload(name), event_id=name)
                assert first or name in sent, f"event {name} was new, yet not delivered"
                if data.draw(st.booleans(), label="resend the same event id"):
                    assert not await flows.send_event(task_id, name, event_payload(name), event_id=name)
                sent.add(name)

            with anyio.fail_after(PHASE_TIMEOUT):
                created = await a.session.call_tool("program", {}, allow_claimed=True)
            assert isinstance(created, CreatedTask)
            task_id = created.task_id
            if reference.events and data.draw(st.booleans(), label="send every event first"):
                for name in reference.events:
                    await deliver(name)
            task: dict[str, Any] = {}
            with anyio.move_on_after(PHASE_TIMEOUT * 4) as timer:
                while True:
                    task = await task_state(a.session, task_id)
                    status = task["status"]
                    if status in ("completed", "failed", "cancelled"):
                        break
                    if status == "input_required":
                        asked: dict[str, Any] = task["inputRequests"]
                        which = data.draw(st.sampled_from(("A", "B")), label="instance")
                        responses = {key: user_reply(request) for key, request in asked.items()}
                        await update_task(fleet[which].session, task_id, responses)
                        while True:  # until the task took the answers (it moved on, or asks anew)
                            now = await task_state(a.session, task_id)
                            if now["status"] != "input_required" or set(now["inputRequests"]) != set(asked):
                                break
                            await asyncio.sleep(0.01)
                        continue
                    waiting = (task.get("_meta") or {}).get("mrtr/waiting", [])
                    for wait in waiting:
                        name = wait.get("name")
                        if wait.get("kind") == "event" and name and name.startswith("e") and name not in sent:
                            await deliver(name)
                    await asyncio.sleep(0.01)
            if timer.cancelled_caught:
                raise AssertionError(f"the task did not finish; last seen: {task} (events sent: {sorted(sent)})")
            event(f"events: {min(len(reference.events), 4)}")
    assert task["status"] == "completed", task
    result = task["result"]
    assert not result.get("isError"), result
    assert result["content"][0]["text"] == reference.value, "the task's value differs from the straight-through run"
    assert runs == reference.runs, "every step's function runs exactly once across the fleet"
    assert sent == set(reference.events), "exactly the events the program waited for were needed"
