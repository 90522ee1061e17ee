"""Ordinary Python in a flow behaves as if it ran once, straight through — or fails at once, clearly.

Each test is a case that broke before the engine suspended unwinding flows, named concurrent
branches by position, settled by accounting and bounded its state. Every case runs with the
official `Client` both in memory and over real HTTP (uvicorn on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
import tracemalloc
from collections import Counter

import anyio
import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from tests.support.flowkit import Driver, accept, connect, new_server, text_of

pytestmark = pytest.mark.anyio

TRANSPORTS = ["memory", "http"]


class Pick(BaseModel):
    n: int


class Word(BaseModel):
    word: str


async def finish(call: Driver, answer_for: dict[str, t.ElicitResult], *, limit: int = 10) -> t.CallToolResult:
    """Answer every round by question text until the call completes (bounded, and never hangs)."""
    result = await call.send()
    for _ in range(limit):
        if isinstance(result, t.CallToolResult):
            return result
        answers = {}
        for key, request in call.asked.items():
            assert isinstance(request, t.ElicitRequest)
            answers[key] = answer_for[request.params.message]
        with anyio.fail_after(10):
            result = await call.send(answers)
    raise AssertionError("the flow did not finish")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_ask_in_finally_is_asked_when_the_flow_really_unwinds_and_never_hangs(transport: str) -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def careful(ctx: mrtr.FlowContext) -> str:
        try:
            first = await ctx.elicit("First?", Word)
        finally:
            last = await ctx.elicit("Anything to add?", Word)
        return f"{first.word}+{last.word}"

    async with connect(server, transport) as client:
        call = Driver(client, "careful")
        with anyio.fail_after(10):
            result = await finish(call, {"First?": accept(word="a"), "Anything to add?": accept(word="b")})
        assert text_of(result) == "a+b"
        asked = [next(iter(r.input_requests.values())).params.message for r in call.rounds]
        assert asked == ["First?", "Anything to add?"], "the finally's ask comes after the first, once"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_step_in_finally_runs_once_at_the_real_end_not_at_a_suspension(transport: str) -> None:
    server = new_server()
    flows = mrtr.Flows(server)
    runs: Counter[str] = Counter()

    @flows.tool()
    async def with_cleanup(ctx: mrtr.FlowContext) -> str:
        try:
            answer = await ctx.elicit("Go?", Word)
        finally:
            await ctx.step("cleanup", lambda: runs.update(["cleanup"]))
        return answer.word

    async with connect(server, transport) as client:
        call = Driver(client, "with_cleanup")
        await call.send()
        assert runs["cleanup"] == 0, "suspending for an answer is not the flow's end"
        result = await call.send({call.key_for_message("Go?"): accept(word="yes")})
        assert text_of(result) == "yes"
        assert runs["cleanup"] == 1


def _two_fetchers(runs: Counter[str], *, same_args: bool, style: str):
    server = new_server()
    flows = mrtr.Flows(server)

    def fetch(who: str) -> str:
        runs[who] += 1
        return f"{who}-value"

    async def branch_a(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("A?", Word)  # answered at once on replay: A then overtakes B
        return await ctx.step("fetch", fetch, "same" if same_args else "A")

    async def branch_b(ctx: mrtr.FlowContext) -> str:
        value = await ctx.step("fetch", fetch, "B")
        await ctx.elicit("B?", Word)
        return value

    @flows.tool()
    async def fetchers(ctx: mrtr.FlowContext) -> list[str]:
        if style == "ctx.gather":
            return await ctx.gather(branch_a(ctx), branch_b(ctx))
        if style == "asyncio.gather":
            return list(await asyncio.gather(branch_a(ctx), branch_b(ctx)))
        if style == "TaskGroup":
            async with asyncio.TaskGroup() as group:
                a = group.create_task(branch_a(ctx))
                b = group.create_task(branch_b(ctx))
            return [a.result(), b.result()]
        a, b = asyncio.create_task(branch_a(ctx)), asyncio.create_task(branch_b(ctx))
        return [await a, await b]

    return server


@pytest.mark.parametrize("style", ["ctx.gather", "asyncio.gather", "TaskGroup", "create_task"])
@pytest.mark.parametrize("same_args", [True, False])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_concurrent_branches_keep_their_own_step_values(transport: str, same_args: bool, style: str) -> None:
    runs: Counter[str] = Counter()
    server = _two_fetchers(runs, same_args=same_args, style=style)
    async with connect(server, transport) as client:
        call = Driver(client, "fetchers")
        result = await finish(call, {"A?": accept(word="a"), "B?": accept(word="b")})
        assert not result.is_error, text_of(result)
        first = "same-value" if same_args else "A-value"
        assert result.structured_content == {"result": [first, "B-value"]}
        assert runs == Counter({"same" if same_args else "A": 1, "B": 1}), "each branch's function ran once"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_same_question_in_two_branches_gets_each_branch_its_own_answer(transport: str) -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    async def pick(ctx: mrtr.FlowContext, label: str) -> str:
        if label == "second":
            await ctx.elicit("Warm up?", Word)  # shifts this branch behind the other on replay
        return f"{label}={(await ctx.elicit('Pick', Pick)).n}"

    @flows.tool()
    async def twins(ctx: mrtr.FlowContext) -> list[str]:
        return await ctx.gather(pick(ctx, "first"), pick(ctx, "second"))

    async with connect(server, transport) as client:
        call = Driver(client, "twins")
        await call.send()
        (first_pick,) = [k for k, r in call.asked.items() if r.params.message == "Pick"]
        warm = call.key_for_message("Warm up?")
        await call.send({first_pick: accept(n=1), warm: accept(word="ok")})
        (second_pick,) = call.asked
        assert second_pick != first_pick
        result = await call.send({second_pick: accept(n=2)})
        assert result.structured_content == {"result": ["first=1", "second=2"]}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reserved_step_names_and_derived_looking_keys_are_definition_errors(transport: str) -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def numbered_by_hand(ctx: mrtr.FlowContext) -> str:
        await ctx.step("x", lambda: 1)
        await ctx.step("x#2", lambda: 2)
        return "unreachable"

    @flows.tool()
    async def impostor_key(ctx: mrtr.FlowContext) -> str:
        await ctx.elicit("Hi?", Word, key="elicit_AAAAAAAAAA")
        return "unreachable"

    async with connect(server, transport) as client:
        for tool, fragment in [("numbered_by_hand", "'x#2' is not allowed"), ("impostor_key", "shape of a key")]:
            with pytest.raises(MCPError) as caught:
                await Driver(client, tool).send()
            assert caught.value.error.data["reason"] == "invalid_flow"
            assert fragment in caught.value.error.message
            assert tool in caught.value.error.message, "the error names the flow"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_declining_in_a_prompt_or_resource_is_a_clear_client_error_without_a_traceback(
    transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.prompt()
    async def greeting(ctx: mrtr.FlowContext) -> str:
        return f"Hello {(await ctx.elicit('Your name?', Word)).word}"

    @flows.resource("notes://{topic}")
    async def notes(topic: str, ctx: mrtr.FlowContext) -> str:
        return f"{topic}: {(await ctx.elicit('Unlock?', Word)).word}"

    caplog.set_level(logging.INFO)
    async with connect(server, transport) as client:
        for action in ("decline", "cancel"):
            first = await client.session.get_prompt("greeting", {}, allow_input_required=True)
            assert isinstance(first, t.InputRequiredResult)
            (key,) = first.input_requests
            with pytest.raises(MCPError) as caught:
                await client.session.get_prompt(
                    "greeting",
                    {},
                    input_responses={key: t.ElicitResult(action=action)},
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            word = "declined" if action == "decline" else "cancelled"
            assert caught.value.error.code == t.INVALID_PARAMS
            assert caught.value.error.message == f"The user {word} the request: Your name?"
            assert caught.value.error.data == {"reason": f"input_{word}", "flow": "greeting", "key": key}

            first = await client.session.read_resource("notes://x", allow_input_required=True)
            assert isinstance(first, t.InputRequiredResult)
            (key,) = first.input_requests
            with pytest.raises(MCPError) as caught:
                await client.session.read_resource(
                    "notes://x",
                    input_responses={key: t.ElicitResult(action=action)},
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            assert caught.value.error.code == t.INVALID_PARAMS
            assert caught.value.error.data["reason"] == f"input_{word}"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_answers_are_journaled_lean_and_an_oversize_answer_is_reasked_before_any_later_step(
    transport: str,
) -> None:
    server = new_server()
    flows = mrtr.Flows(server, max_state_bytes=16 * 1024)
    runs: Counter[str] = Counter()

    @flows.tool()
    async def profile(ctx: mrtr.FlowContext) -> str:
        await ctx.step("before", lambda: runs.update(["before"]))
        bio = await ctx.elicit("Bio?", Word)
        await ctx.step("after", lambda: runs.update(["after"]))
        color = await ctx.elicit("Colour?", Word)
        return f"{len(bio.word)}:{color.word}"

    async with connect(server, transport) as client:
        call = Driver(client, "profile")
        await call.send()
        bio = call.key_for_message("Bio?")
        small_state = len(call.state or "")

        junk = {"action": "accept", "content": {"word": "short", "junk": "x" * 40_000}}
        await call.send({bio: junk})
        assert "Colour?" in call.asked[next(iter(call.asked))].params.message
        assert len(call.state or "") < small_state + 400, "fields the form never asked for are not journaled"

        call = Driver(client, "profile")
        await call.send()
        oversize = accept(word=secrets.token_urlsafe(30_000))  # incompressible: it really cannot fit
        again = await call.send({bio: oversize})
        assert isinstance(again, t.InputRequiredResult)
        assert list(call.asked) == [bio], "an answer that cannot travel is asked again"
        assert call.asked[bio].params.message.startswith("Bio?\n\n(Asked again: the answer is too large")
        assert runs == Counter(before=2, after=1), "no step ran early, none ran twice"
        await call.send({bio: accept(word="fits")})
        done = await call.send({call.key_for_message("Colour?"): accept(word="red")})
        assert text_of(done) == "4:red"
        assert runs == Counter(before=2, after=2)


async def test_server_memory_stays_flat_across_rounds_with_distinct_large_questions_and_answers() -> None:
    """Nothing a client controls is cached: questions carry client text, answers client data."""
    server = new_server()
    flows = mrtr.Flows(server)

    @flows.tool()
    async def echo(text: str, ctx: mrtr.FlowContext) -> int:
        answer = await ctx.elicit(f"About {text}?", Word)
        return len(answer.word)

    async def one_call(client, i: int) -> None:
        call = Driver(client, "echo", {"text": f"{i}:" + secrets.token_hex(60_000)})
        await call.send()
        done = await call.send({next(iter(call.asked)): accept(word=secrets.token_hex(24_000))})
        assert done.structured_content == {"result": 48_000}

    async with connect(server, "memory") as client:
        for i in range(20):  # warm up: imports, pydantic schemas, the SDK's own caches
            await one_call(client, i)
        gc.collect()
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            for i in range(20, 120):
                await one_call(client, i)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - baseline
        finally:
            tracemalloc.stop()
    # 100 calls moved ~17 MB of distinct questions (120 kB each) and answers (48 kB) through the
    # server: a cache of either, even one bounded like functools.lru_cache's 128, passes the limit.
    assert grown < 3 * 1024 * 1024, f"server memory grew by {grown:,} bytes"
