"""Branches: concurrent parts of a flow are named by where they were created, not by when they ran.

Keys of asks and steps made in concurrent branches (`ctx.gather`, `asyncio.gather`,
`TaskGroup`, `create_task`) must be the same on every replay and every instance, however
the branches interleave; and the loop's task factory that names them must leave every
other task alone.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

import mrtr
from mrtr._engine import branches
from tests.support.enginekit import Rounds, accept, result_of

pytestmark = pytest.mark.anyio


class Target(BaseModel):
    env: str


async def test_the_same_question_in_two_branches_gets_two_keys_and_each_branch_its_own_answer() -> None:
    async def pair(ctx: mrtr.FlowContext) -> list[str]:
        a, b = await ctx.gather(ctx.elicit("Where?", Target), ctx.elicit("Where?", Target))
        return [a.env, b.env]

    call = Rounds(pair)
    await call.send()
    keys = sorted(call.asked)
    assert len(keys) == 2 and [k.rsplit("@", 1)[1] for k in keys] == ["0", "1"]
    assert keys[0].rsplit("@", 1)[0] == keys[1].rsplit("@", 1)[0]  # one question, two branches
    assert result_of(await call.send({keys[0]: accept(env="first"), keys[1]: accept(env="second")})) == [
        "first",
        "second",
    ]


@pytest.mark.parametrize("slow", ["a", "b"])
async def test_keys_follow_creation_order_whichever_branch_runs_first(slow: str) -> None:
    """Branch `slow` reaches its ask later than the other: the keys do not change."""

    async def race(slow: str, ctx: mrtr.FlowContext) -> list[str]:
        async def branch(name: str) -> str:
            if name == slow:
                await asyncio.sleep(0.02)
            return (await ctx.elicit(f"Where for {name}?", Target)).env

        return list(await asyncio.gather(branch("a"), branch("b")))

    call = Rounds(race, {"slow": slow})
    await call.send()
    assert call.key_asking("for a?").endswith("@0") and call.key_asking("for b?").endswith("@1")
    reference = Rounds(race, {"slow": "a" if slow == "b" else "b"})
    await reference.send()
    assert sorted(reference.asked) == sorted(call.asked)


async def test_branches_answered_in_separate_rounds_keep_their_keys() -> None:
    async def pair(ctx: mrtr.FlowContext) -> list[str]:
        results = await asyncio.gather(ctx.elicit("A?", Target), ctx.elicit("B?", Target))
        return [r.env for r in results]

    call = Rounds(pair)
    await call.send()
    key_a, key_b = call.key_asking("A?"), call.key_asking("B?")
    assert (await call.send({key_b: accept(env="b")})).parked  # only branch 1 answered
    assert call.asked.keys() == {key_a}
    assert result_of(await call.send({key_a: accept(env="a")})) == ["a", "b"]


async def test_nested_branches_are_named_by_their_path() -> None:
    async def nested(ctx: mrtr.FlowContext) -> list[Any]:
        async def inner() -> list[Target]:
            return await ctx.gather(ctx.elicit("X?", Target), ctx.elicit("Y?", Target))

        return await ctx.gather(ctx.elicit("W?", Target), inner())

    call = Rounds(nested)
    await call.send()
    suffixes = {text: call.key_asking(text).rsplit("@", 1)[1] for text in ("W?", "X?", "Y?")}
    assert suffixes == {"W?": "0", "X?": "1.0", "Y?": "1.1"}


@pytest.mark.parametrize("how", ["task_group", "create_task"])
async def test_task_groups_and_created_tasks_are_branches_too(how: str) -> None:
    async def fan(ctx: mrtr.FlowContext) -> list[str]:
        coros = [ctx.elicit("One?", Target), ctx.elicit("Two?", Target)]
        if how == "task_group":
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(c) for c in coros]
        else:
            tasks = [asyncio.create_task(c) for c in coros]
            await asyncio.wait(tasks)
        return [t.result().env for t in tasks]

    call = Rounds(fan)
    await call.send()
    one, two = call.key_asking("One?"), call.key_asking("Two?")
    assert one.endswith("@0") and two.endswith("@1")
    assert result_of(await call.send({one: accept(env="1"), two: accept(env="2")})) == ["1", "2"]


async def test_steps_of_the_same_name_in_concurrent_branches_are_kept_apart_and_run_once() -> None:
    runs = Counter[str]()

    def work(branch: str) -> str:
        runs[branch] += 1
        return branch

    async def parallel(ctx: mrtr.FlowContext) -> list[str]:
        async def branch(name: str) -> str:
            value = await ctx.step("work", work, name)
            await ctx.elicit(f"After {name}?", Target)
            return value

        return list(await asyncio.gather(branch("a"), branch("b")))

    call = Rounds(parallel)
    await call.send()
    assert {k: v for k, (_, v) in call.journal.steps.items()} == {"0/work": "a", "1/work": "b"}
    answers = {call.key_asking("After a?"): accept(env="x"), call.key_asking("After b?"): accept(env="y")}
    assert result_of(await call.send(answers)) == ["a", "b"]
    assert runs == Counter(a=1, b=1)


async def test_an_explicit_key_asked_in_a_branch_remembers_its_branch() -> None:
    async def keyed(ctx: mrtr.FlowContext) -> None:
        await ctx.gather(ctx.elicit("Plain?", Target), ctx.elicit("Named?", Target, key="named"))

    call = Rounds(keyed)
    await call.send()
    assert "named" in call.asked
    assert call.journal.origins == {"named": "1"}


async def test_a_flow_whose_branches_end_in_different_rounds_gets_every_step_value_back() -> None:
    """A long-lived branch and a short one: the replay of each finds its own journal entries."""
    runs = Counter[str]()

    async def staged(ctx: mrtr.FlowContext) -> list[str]:
        async def long() -> str:
            first = await ctx.elicit("Long 1?", Target)
            second = await ctx.elicit("Long 2?", Target)
            return await ctx.step("join", lambda a, b: runs.update(["join"]) or a + b, first.env, second.env)

        async def short() -> str:
            return await ctx.step("quick", lambda: runs.update(["quick"]) or "q")

        return list(await asyncio.gather(long(), short()))

    call = Rounds(staged)
    outcome = await call.send()
    while outcome.parked:
        outcome = await call.send({call.only_key(): accept(env=str(len(call.outcomes)))})
    assert result_of(outcome) == ["12", "q"]
    assert runs == Counter(join=1, quick=1)


# -- the task factory ---------------------------------------------------------------------


async def test_installing_is_idempotent_and_keeps_a_factory_already_set() -> None:
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    made: list[str] = []

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(counting)
    try:
        branches.install(loop)
        installed = loop.get_task_factory()
        branches.install(loop)
        assert loop.get_task_factory() is installed  # not wrapped twice

        async def plain() -> int:
            return 7

        assert await loop.create_task(plain()) == 7
        assert made == ["test_installing_is_idempotent_and_keeps_a_factory_already_set.<locals>.plain"]
    finally:
        loop.set_task_factory(previous)


async def test_tasks_made_outside_a_flow_are_nobodys_branch() -> None:
    branches.install(asyncio.get_running_loop())

    async def where() -> Any:
        return branches.current_branch.get()

    assert await asyncio.create_task(where()) is None


async def test_mrtrs_own_awaits_inside_a_flow_make_no_branch() -> None:
    class Run:
        suspended = False

        def __init__(self) -> None:
            self.adopted: list[str] = []

        def adopt(self, task: asyncio.Task[Any], branch: branches.Branch) -> None:
            self.adopted.append(branch.path)

    branches.install(asyncio.get_running_loop())
    run = Run()
    root = branches.Branch(run, "")
    root.task = asyncio.current_task()
    token = branches.current_branch.set(root)
    try:

        async def nothing() -> None:
            return None

        await asyncio.create_task(nothing())
        with branches.outside_branch():
            await asyncio.create_task(nothing())  # e.g. a driver's internals inside a step
        await asyncio.create_task(nothing())
    finally:
        branches.current_branch.reset(token)
    assert run.adopted == ["0", "1"]
    assert root.children == 2


async def test_a_task_created_from_a_copied_context_is_not_numbered() -> None:
    """A task made by a callback that merely carries the flow's context belongs to the flow but has no identity."""

    class Run:
        suspended = False

        def __init__(self) -> None:
            self.adopted: list[branches.Branch] = []

        def adopt(self, task: asyncio.Task[Any], branch: branches.Branch) -> None:
            self.adopted.append(branch)

    branches.install(asyncio.get_running_loop())
    run = Run()
    root = branches.Branch(run, "")
    root.task = asyncio.current_task()
    token = branches.current_branch.set(root)
    try:
        carried = contextvars.copy_context()
    finally:
        branches.current_branch.reset(token)

    async def nothing() -> None:
        return None

    made: list[asyncio.Task[None]] = []
    asyncio.get_running_loop().call_soon(lambda: made.append(asyncio.create_task(nothing())), context=carried)
    await asyncio.sleep(0)
    await made[0]
    (branch,) = run.adopted
    assert branch.detached and root.children == 0
