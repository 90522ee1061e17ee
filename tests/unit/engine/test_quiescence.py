"""Quiescence: a round ends only when no task of the flow can move without the client.

First `quiescence.classify` on real asyncio tasks in each waiting state, then the rule as a
flow sees it: whatever time or a thread will move forward keeps the round open (so its asks
join the round), whatever only the client can move lets it settle, and a settled round
leaves nothing of the flow running.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

import mrtr
from mrtr._engine import quiescence
from mrtr._engine.quiescence import Busy
from tests.support.enginekit import Rounds, accept, result_of

pytestmark = pytest.mark.anyio


class Target(BaseModel):
    env: str


async def started(coro: Any) -> asyncio.Task[Any]:
    """A task that has run up to its first real wait."""
    task = asyncio.get_running_loop().create_task(coro)
    for _ in range(3):
        await asyncio.sleep(0)
    return task


async def until(future: asyncio.Future[Any]) -> Any:
    return await future


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- classify ---------------------------------------------------------------------------


async def test_no_tasks_and_finished_tasks_are_quiet() -> None:
    done = await started(asyncio.sleep(0))
    assert done.done()
    assert quiescence.classify([], set()) is None
    assert quiescence.classify([done], set()) is None


async def test_a_task_that_has_not_run_yet_is_runnable() -> None:
    task = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    try:
        assert quiescence.classify([task], set()) is Busy.RUNNABLE
    finally:
        await cancel(task)


async def test_a_task_waiting_on_a_future_already_done_is_runnable() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = await started(until(gate))
    gate.set_result(None)  # its wake-up is scheduled, but it has not run yet
    try:
        assert quiescence.classify([task], set()) is Busy.RUNNABLE
    finally:
        await cancel(task)


async def test_a_sleeping_task_keeps_the_flow_busy_until_its_timer() -> None:
    task = await started(asyncio.sleep(30))
    try:
        busy = quiescence.classify([task], set())
        assert isinstance(busy, asyncio.Future) and not busy.done()
    finally:
        await cancel(task)


async def test_a_task_waiting_on_a_thread_keeps_the_flow_busy() -> None:
    gate = threading.Event()
    task = await started(asyncio.to_thread(gate.wait, 5))
    try:
        busy = quiescence.classify([task], set())
        assert isinstance(busy, asyncio.Future)
    finally:
        gate.set()
        await task


@pytest.mark.parametrize("kind", ["event", "queue", "lock", "future"])
async def test_a_task_only_another_task_can_wake_is_quiet(kind: str) -> None:
    lock = asyncio.Lock()
    await lock.acquire()
    waits = {
        "event": lambda: asyncio.Event().wait(),
        "queue": lambda: asyncio.Queue[int]().get(),
        "lock": lock.acquire,
        "future": lambda: until(asyncio.get_running_loop().create_future()),
    }
    task = await started(waits[kind]())
    try:
        assert quiescence.classify([task], set()) is None
    finally:
        await cancel(task)


async def test_a_timeout_around_waiting_work_does_not_count_as_a_timer() -> None:
    """`asyncio.wait_for` only races the work it guards: the client's think time is not the flow's."""
    event = asyncio.Event()
    guarded = await started(asyncio.wait_for(event.wait(), timeout=30))
    try:
        # Python 3.11's wait_for runs the guarded work in a task of its own: count it too.
        inner = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "Event.wait"]
        assert len(inner) == (1 if sys.version_info < (3, 12) else 0)
        tasks = [guarded, *inner]
        assert quiescence.classify(tasks, set()) is None
    finally:
        await cancel(guarded)


async def test_parked_tasks_are_quiet_whatever_they_wait_on() -> None:
    task = await started(asyncio.sleep(30))
    other = await started(asyncio.sleep(30))
    try:
        assert quiescence.classify([task], {task}) is None
        assert quiescence.classify([task, other], {task}) is not None
    finally:
        await cancel(task, other)


async def test_a_task_waiting_on_a_sleeping_task_is_busy_through_it() -> None:
    inner = await started(asyncio.sleep(30))
    outer = await started(asyncio.wait({inner}))
    try:
        assert quiescence.classify([outer], set()) is None  # alone, a wait on a sibling is quiet
        busy = quiescence.classify([outer, inner], set())
        assert isinstance(busy, asyncio.Future) and not busy.done()
    finally:
        await cancel(outer, inner)


# -- the rule, as a flow sees it -----------------------------------------------------------


async def test_a_branch_sleeping_before_it_asks_joins_the_same_round() -> None:
    async def staggered(ctx: mrtr.FlowContext) -> list[str]:
        async def late() -> Target:
            await asyncio.sleep(0.05)
            return await ctx.elicit("Late?", Target)

        results = await asyncio.gather(ctx.elicit("Early?", Target), late())
        return [r.env for r in results]

    call = Rounds(staggered)
    began = time.perf_counter()
    assert (await call.send()).parked
    assert time.perf_counter() - began >= 0.04
    answers = {call.key_asking("Early?"): accept(env="e"), call.key_asking("Late?"): accept(env="l")}
    assert result_of(await call.send(answers)) == ["e", "l"]


async def test_a_branch_waiting_on_a_thread_before_it_asks_joins_the_same_round() -> None:
    async def threaded(ctx: mrtr.FlowContext) -> list[str]:
        async def after_io() -> Target:
            await asyncio.to_thread(time.sleep, 0.05)
            return await ctx.elicit("After I/O?", Target)

        results = await asyncio.gather(ctx.elicit("Now?", Target), after_io())
        return [r.env for r in results]

    call = Rounds(threaded)
    assert (await call.send()).parked
    assert len(call.asked) == 2
    answers = {call.key_asking("Now?"): accept(env="n"), call.key_asking("After I/O?"): accept(env="i")}
    assert result_of(await call.send(answers)) == ["n", "i"]


async def test_a_branch_waiting_for_another_branchs_answer_lets_the_round_settle() -> None:
    async def handoff(ctx: mrtr.FlowContext) -> str:
        ready = asyncio.Event()
        box: list[str] = []

        async def asker() -> None:
            box.append((await ctx.elicit("Where?", Target)).env)
            ready.set()

        async def waiter() -> str:
            await ready.wait()
            return box[0]

        _, got = await asyncio.gather(asker(), waiter())
        return got

    call = Rounds(handoff)
    assert (await asyncio.wait_for(call.send(), 5)).parked
    assert result_of(await call.send({call.only_key(): accept(env="z")})) == "z"


@pytest.mark.parametrize("guard", ["wait_for", "timeout"])
async def test_an_ask_under_a_timeout_waits_for_the_client_without_timing_out(guard: str) -> None:
    limit = 0.3

    async def patient(ctx: mrtr.FlowContext) -> str:
        if guard == "wait_for":
            target = await asyncio.wait_for(ctx.elicit("Where?", Target), timeout=limit)
        else:
            async with asyncio.timeout(limit):
                target = await ctx.elicit("Where?", Target)
        return target.env

    call = Rounds(patient)
    began = time.perf_counter()
    outcome = await call.send()
    assert outcome.parked and outcome.error is None
    assert time.perf_counter() - began < limit  # settled at once: the timer is not the flow's work
    await asyncio.sleep(limit + 0.05)  # the client takes longer than the timeout to answer
    assert result_of(await call.send({call.only_key(): accept(env="t")})) == "t"


async def test_a_settled_round_leaves_no_task_of_the_flow_running() -> None:
    tasks: list[asyncio.Task[Any]] = []
    unwound: list[str] = []

    async def sprawling(ctx: mrtr.FlowContext) -> None:
        async def idle(name: str) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                unwound.append(name)

        tasks.extend(asyncio.get_running_loop().create_task(idle(n)) for n in ("a", "b"))
        await ctx.elicit("Where?", Target)

    assert (await Rounds(sprawling).send()).parked
    assert len(tasks) == 2 and all(t.done() for t in tasks)
    assert sorted(unwound) == ["a", "b"]


async def test_a_round_settles_promptly_when_only_the_client_can_move_it() -> None:
    async def fan_out(ctx: mrtr.FlowContext) -> None:
        await asyncio.gather(*(ctx.elicit(f"Q{i}?", Target) for i in range(20)))

    call = Rounds(fan_out)
    began = time.perf_counter()
    assert (await call.send()).parked
    assert time.perf_counter() - began < 1.0
    assert len(call.asked) == 20
