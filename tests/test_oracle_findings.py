"""Engine bugs the replay oracle (tests/test_replay_oracle.py) led to, each as a minimal reproducer.

Both programs are ordinary Python that runs right straight through; each test states what the
straight-through run does and fails while mrtr does otherwise.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import anyio
import mcp_types as t
import pytest
from pydantic import BaseModel

import mrtr
from tests.flowkit import Driver, accept, connect, new_server, text_of

pytestmark = pytest.mark.anyio

TRANSPORTS = ["memory", "http"]


class Word(BaseModel):
    word: str


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_task_started_by_unwinding_code_does_not_outlive_the_round(transport: str) -> None:
    """Suspension unwinds the flow; tasks its `finally` starts then are not the flow's, and run on.

    `branches._factory` adopts a new task only while `not replay.suspended`, so a task created by
    unwinding code (here `asyncio.gather`'s) is never cancelled or awaited by `Replay.close()`:
    it keeps running after the round returned, against "nothing of a flow runs after its round
    ended" (and a sibling that raised `FlowSuspended` unobserved logs "Task exception was never
    retrieved"). Straight through, `late` runs once; here it also runs after round 1.
    """
    server = new_server()
    flows = mrtr.Flows(server)
    runs: Counter[str] = Counter()

    async def late() -> None:
        await asyncio.sleep(0.05)
        runs["late"] += 1

    @flows.tool()
    async def parallel_cleanup(ctx: mrtr.FlowContext) -> str:
        try:
            answer = await ctx.elicit("Go?", Word)
        finally:
            await asyncio.gather(late(), ctx.step("cleanup", lambda: runs.update(["cleanup"])))
        return answer.word

    async with connect(server, transport) as client:
        call = Driver(client, "parallel_cleanup")
        with anyio.fail_after(10):
            first = await call.send()
        assert isinstance(first, t.InputRequiredResult)
        await asyncio.sleep(0.3)  # ample time for a leftover task to act (bounded)
        assert runs == Counter(), "nothing of the flow runs after its round returned"
        with anyio.fail_after(10):
            done = await call.send({call.key_for_message("Go?"): accept(word="x")})
        assert text_of(done) == "x"
        assert runs == Counter(late=1, cleanup=1)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_wait_for_around_an_ask_parks_instead_of_timing_out(transport: str) -> None:
    """`asyncio.wait_for(ctx.elicit(...), timeout)` holds round 1 open until the timeout fires.

    On Python 3.11 `wait_for` runs the ask in an inner task and waits on a future guarded by a
    `call_later` timer; `quiescence.classify` counts any waiter a timer will complete as busy
    (`_first_timed`), so the round does not settle while the inner task is parked: it waits the
    whole timeout, then `TimeoutError` ends the call as "Error executing tool". Straight through
    (and with `asyncio.timeout(...)`, which awaits in the same task) the ask is answered and the
    flow returns the answer. A timer that only guards parked work cannot move the flow forward.
    """
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def guarded(ctx: mrtr.FlowContext) -> str:
        answer = await asyncio.wait_for(ctx.elicit("Quick?", Word), timeout=1)
        return answer.word

    async with connect(server, transport) as client:
        call = Driver(client, "guarded")
        with anyio.fail_after(10):
            first = await call.send()
        assert isinstance(first, t.InputRequiredResult), text_of(first)  # type: ignore[arg-type]
        with anyio.fail_after(10):
            done = await call.send({call.key_for_message("Quick?"): accept(word="y")})
        assert isinstance(done, t.CallToolResult) and text_of(done) == "y"
