"""Engine bugs the replay oracle (tests/integration/test_replay_oracle.py) led to, each as a minimal reproducer.

Both programs are ordinary Python that runs right straight through; each test states what the
straight-through run does and fails while mrtr does otherwise.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import mcp_types as t
import pytest
from pydantic import BaseModel

import mrtr
from tests.support.flowkit import Driver, accept, connect, new_server, text_of

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
async def test_a_task_started_by_unwinding_code_is_not_leaked_waiting_forever(transport: str) -> None:
    """The same root cause as above, worse: an unadopted task that waits on a sibling never ends.

    In the `finally`, the producer's `ctx.step` raises `FlowSuspended`, so the consumer waits on
    the queue forever; nobody cancels it, so every round of such a flow leaks one pending task
    (and what it holds) for the life of the process.
    """
    server = new_server()
    flows = mrtr.Flows(server)

    async def consume(queue: asyncio.Queue[int]) -> int:
        return await queue.get()

    @flows.tool()
    async def piped_cleanup(ctx: mrtr.FlowContext) -> str:
        try:
            answer = await ctx.elicit("Go?", Word)
        finally:
            queue: asyncio.Queue[int] = asyncio.Queue()

            async def produce() -> None:
                queue.put_nowait(await ctx.step("produce", lambda: 1))

            await asyncio.gather(produce(), consume(queue))
        return answer.word

    async with connect(server, transport) as client:
        call = Driver(client, "piped_cleanup")
        with anyio.fail_after(10):
            await call.send()
        await asyncio.sleep(0.1)
        leaked = [task for task in asyncio.all_tasks() if task.get_coro().__qualname__ == consume.__qualname__]
        for task in leaked:  # leave nothing behind for the next test
            task.cancel()
        assert not leaked, "every task the flow started ends with its round"


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


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_patched_is_true_for_a_new_run_even_behind_a_lagging_branch(transport: str) -> None:
    """`ctx.patched` says False to a brand-new run when a sibling branch has not replayed yet.

    `Replay.patched` decides "no old code ran past here" by `_at_frontier()`: consumed entries
    >= journal entries, counted over the *whole* flow. Concurrent branches replay in any order,
    so in round 2 the `patched` branch (its ask now answered, it runs on at once) gets there
    while the other branch is still sleeping before replaying its journaled step: 1 consumed < 2
    journaled, so `patched` returns False and records nothing. This run started under the new
    code, so straight through (and per Temporal's semantics) it is True; the flow silently takes
    the old path, and may take the other path in a later round once the sibling is ahead.
    """
    server = new_server()
    flows = mrtr.Flows(server)

    async def lagging(ctx: mrtr.FlowContext) -> str:
        await asyncio.sleep(0.01)  # on replay this branch is still asleep when the other decides
        await ctx.step("fetch", lambda: "fetched")
        return (await ctx.elicit("A?", Word)).word

    async def deciding(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("B?", Word)
        return "new" if ctx.patched("v2") else "old"

    @flows.tool()
    async def upgraded(ctx: mrtr.FlowContext) -> list[str]:
        return await ctx.gather(lagging(ctx), deciding(ctx))

    async with connect(server, transport) as client:
        call = Driver(client, "upgraded")
        with anyio.fail_after(10):
            await call.send()
            answers = {call.key_for_message("A?"): accept(word="a"), call.key_for_message("B?"): accept(word="b")}
            done = await call.send(answers)
        assert isinstance(done, t.CallToolResult)
        assert done.structured_content == {"result": ["a", "new"]}, "a run that began under the new code is patched"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_unfinished_async_generator_does_not_shift_branch_identity(transport: str) -> None:
    """asyncio's async-generator finalizer starts `aclose()` as a task in the flow's context.

    Leaving an `async for` early (`break`) drops an unfinished async generator; asyncio's
    finalizer hook schedules `loop.create_task(agen.aclose())` with `call_soon_threadsafe`,
    i.e. with the flow task's context, so `branches._factory` numbers that task as the flow's
    next child — *whenever the callback gets to run*. In round 1 the "warm" step yields to the
    loop first, so `aclose()` becomes child 0 and the branches 1 and 2 (keys `...@1`, `...@2`,
    steps `1/fetch`, `2/fetch`); on replay the journaled step returns at once, the branches
    become 0 and 1 and `aclose()` 2. Branch A now finds nothing under `0/fetch` and runs its
    function again; B reads A's journaled `1/fetch` (with arguments, a `NondeterminismError`
    that blames deterministic code); both asks get new keys and are asked again.
    """
    server = new_server()
    flows = mrtr.Flows(server)
    runs: Counter[str] = Counter()

    async def numbers() -> AsyncIterator[int]:
        yield 1
        yield 2

    def fetch(who: str) -> str:
        runs[who] += 1
        return f"{who}-value"

    async def branch(ctx: mrtr.FlowContext, who: str) -> str:
        value = await ctx.step("fetch", lambda: fetch(who))
        await ctx.elicit(f"{who}?", Word)
        return value

    @flows.tool()
    async def streamed(ctx: mrtr.FlowContext) -> list[str]:
        async for _ in numbers():
            break
        await ctx.step("warm", fetch, "warm")  # a thread hop in round 1; replays at once
        return await ctx.gather(branch(ctx, "A"), branch(ctx, "B"))

    async with connect(server, transport) as client:
        call = Driver(client, "streamed")
        with anyio.fail_after(10):
            result = await call.send()
            for _ in range(4):
                if not isinstance(result, t.InputRequiredResult):
                    break
                result = await call.send({key: accept(word="w") for key in call.asked})
        assert isinstance(result, t.CallToolResult)
        assert result.structured_content == {"result": ["A-value", "B-value"]}
        assert len(call.rounds) == 1, "both asks were answered in round 2"
        assert runs == Counter(warm=1, A=1, B=1), "each step's function ran once"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_patched_is_true_for_a_new_run_beside_a_task_it_started_earlier(transport: str) -> None:
    """A branch's *earlier* children run alongside it: their journal entries are not its progress.

    `_at_frontier` counted every unconsumed entry of the branch's subtree as evidence that old
    code ran past the `patched` call. A background task started just before it had not replayed
    its step yet in round 2 (it had not run at all), so the root's `patched` said False to a
    run that began under the new code, and asked the old path's question.
    """
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def upgraded(ctx: mrtr.FlowContext) -> list[str]:
        background = asyncio.create_task(ctx.step("fetch", lambda: "fetched"))
        await ctx.elicit("Go?", Word)
        path = "new" if ctx.patched("v2") else (await ctx.elicit("Old path?", Word)).word
        return [await background, path]

    async with connect(server, transport) as client:
        call = Driver(client, "upgraded")
        with anyio.fail_after(10):
            await call.send()
            done = await call.send({call.key_for_message("Go?"): accept(word="go")})
        assert isinstance(done, t.CallToolResult)
        assert done.structured_content == {"result": ["fetched", "new"]}, "a run that began under the new code"
