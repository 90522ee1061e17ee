"""FastMCP 3.x's `ctx.sample(tools=..., result_type=...)`, `ctx.sample_step` and `ctx.elicit(response_type=None)`
on FastMCP 4 through `mrtr.fastmcp`, on the 2026-07-28 wire.

Written as FastMCP's own tests are: the server is FastMCP 3.x code, and the client is
`fastmcp.Client` with a `sampling_handler(messages, params, context)` as a 3.x user writes
it: it plays the LLM, returning text, or a `CreateMessageResultWithTools` whose content is a
list of `tool_use` blocks. Served by a real uvicorn; every round is a new HTTP request, and
every tool run is counted in memory, so "each tool call runs once per flow" is checked as
the loop replays round after round.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as t
import pytest
from fastmcp import Client as FastMCPClient
from fastmcp import Context, FastMCP
from fastmcp.client.elicitation import ElicitResult as FastMCPElicitResult
from fastmcp.exceptions import FastMCPDeprecationWarning, ToolError
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
import mrtr.fastmcp
from mrtr.fastmcp import FlowsContext, SamplingTool
from tests.support.flowkit import SHARED_KEY, served

pytestmark = pytest.mark.anyio

TOOLS = t.SamplingCapability(tools=t.SamplingToolsCapability())


class Verdict(BaseModel):
    score: int
    reason: str


def new_server(name: str = "fm-sampling", **options: Any) -> tuple[FastMCP[Any], mrtr.fastmcp.Flows]:
    mcp: FastMCP[Any] = FastMCP(name, request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    return mcp, mrtr.fastmcp.Flows(mcp, **options)


Handler = Callable[[list[t.SamplingMessage], t.CreateMessageRequestParams, Any], Any]


@asynccontextmanager
async def client_for(mcp: FastMCP[Any], handler: Handler, **options: Any) -> AsyncIterator[FastMCPClient[Any]]:
    async with served(mcp) as url:
        client: FastMCPClient[Any] = FastMCPClient(
            url, sampling_handler=handler, sampling_capabilities=TOOLS, timeout=20.0, **options
        )
        async with client:
            yield client


def uses(*calls: tuple[str, str, dict[str, Any]], text: str | None = None) -> t.CreateMessageResultWithTools:
    """An LLM turn that calls tools: `(id, name, input)` each."""
    blocks: list[Any] = [t.TextContent(type="text", text=text)] if text else []
    blocks += [t.ToolUseContent(type="tool_use", id=i, name=n, input=a) for i, n, a in calls]
    return t.CreateMessageResultWithTools(role="assistant", content=blocks, model="llm", stop_reason="toolUse")


def tool_results(messages: list[t.SamplingMessage]) -> list[t.ToolResultContent]:
    """The tool results the server sent back in its last message (empty on the first turn)."""
    last = messages[-1].content_as_list
    return [block for block in last if isinstance(block, t.ToolResultContent)]


def result_text(block: t.ToolResultContent) -> str:
    assert isinstance(block.content[0], t.TextContent)
    return block.content[0].text


# -- the tool loop ----------------------------------------------------------------------------------


async def test_the_tool_loop_runs_each_tool_call_once_and_returns_the_final_answer() -> None:
    runs: Counter[str] = Counter()
    mcp, flows = new_server()

    def search(query: str) -> str:
        """Search the docs."""
        runs["search"] += 1
        return f"found {query}"

    async def add(a: int, b: int) -> int:
        runs["add"] += 1
        return a + b

    @flows.tool()
    async def research(topic: str, ctx: Context) -> str:
        result = await ctx.sample(f"Research {topic}", system_prompt="be brief", tools=[search, add])  # type: ignore[attr-defined]
        roles = "/".join(m.role for m in result.history)
        return f"{result.text} | {result.result} | {roles}"

    turns: list[t.CreateMessageRequestParams] = []

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        turns.append(params)
        results = tool_results(messages)
        if not results:
            return uses(("c1", "search", {"query": "mrtr"}), ("c2", "add", {"a": 2, "b": 3}), text="let me look")
        assert [(r.tool_use_id, result_text(r), r.is_error) for r in results] == [
            ("c1", "found mrtr", None),
            ("c2", "5", None),
        ]
        return "mrtr replays flows"

    async with client_for(mcp, llm) as client:
        result = await client.call_tool("research", {"topic": "replay"})

    assert result.content[0].text == "mrtr replays flows | mrtr replays flows | user/assistant/user/assistant"  # type: ignore[union-attr]
    assert runs == Counter(search=1, add=1)  # the second turn's round replayed both from the journal
    assert len(turns) == 2
    first = turns[0]
    assert first.system_prompt == "be brief" and first.max_tokens == 512 and first.tool_choice is None
    described = [(tool.name, tool.description) for tool in first.tools or []]
    assert described == [("search", "Search the docs."), ("add", None)]
    assert first.tools is not None and set(first.tools[1].input_schema["properties"]) == {"a", "b"}


async def test_tool_concurrency_bounds_parallel_calls_and_keeps_the_results_in_call_order() -> None:
    active = 0
    peaks: list[int] = []
    mcp, flows = new_server()

    async def slow(n: int) -> str:
        nonlocal active
        active += 1
        peaks.append(active)
        await asyncio.sleep(0.05 * (4 - n))  # later calls finish first
        active -= 1
        return f"r{n}"

    @flows.tool()
    async def fan_out(limit: int | None, ctx: Context) -> str:
        result = await ctx.sample("go", tools=[slow], tool_concurrency=limit)  # type: ignore[attr-defined]
        return str(result.text)

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        results = tool_results(messages)
        if not results:
            return uses(*[(f"c{n}", "slow", {"n": n}) for n in (1, 2, 3)])
        return ",".join(f"{r.tool_use_id}={result_text(r)}" for r in results)

    async with client_for(mcp, llm) as client:
        for limit, peak in ((None, 1), (2, 2), (0, 3)):
            peaks.clear()
            result = await client.call_tool("fan_out", {"limit": limit})
            assert result.content[0].text == "c1=r1,c2=r2,c3=r3"  # type: ignore[union-attr]
            assert max(peaks) == peak, (limit, peaks)


async def test_unknown_and_raising_tools_are_reported_to_the_model_and_never_rerun() -> None:
    runs: Counter[str] = Counter()
    mcp, flows = new_server()

    def boom() -> str:
        runs["boom"] += 1
        raise ValueError("kaput")

    def refuse() -> str:
        runs["refuse"] += 1
        raise ToolError("not today")

    @flows.tool()
    async def risky(mask: bool, ctx: Context) -> str:
        result = await ctx.sample("try", tools=[boom, refuse], mask_error_details=mask)  # type: ignore[attr-defined]
        return str(result.text)

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        results = tool_results(messages)
        if not results:
            return uses(("a", "nope", {}), ("b", "boom", {}), ("c", "refuse", {}))
        assert all(r.is_error for r in results)
        return " / ".join(result_text(r) for r in results)

    async with client_for(mcp, llm) as client:
        told = await client.call_tool("risky", {"mask": False})
        masked = await client.call_tool("risky", {"mask": True})

    assert told.content[0].text == (  # type: ignore[union-attr]
        "Error: Unknown tool 'nope' / Error executing tool 'boom': kaput / not today"
    )
    assert masked.content[0].text == "Error: Unknown tool 'nope' / Error executing tool 'boom' / not today"  # type: ignore[union-attr]
    assert runs == Counter(boom=2, refuse=2)  # once per call: an error is journaled like a value


async def test_a_fastmcp_tool_and_a_named_sampling_tool_serve_the_loop() -> None:
    from fastmcp.tools import FunctionTool

    mcp, flows = new_server()

    def double(x: int) -> int:
        return 2 * x

    def shout(text: str) -> str:
        return text.upper()

    as_tool = FunctionTool.from_function(double)
    named = SamplingTool.from_function(shout, name="loud", description="Shout it")

    @flows.tool()
    async def both(ctx: Context) -> str:
        result = await ctx.sample("go", tools=[as_tool, named])  # type: ignore[attr-defined]
        return str(result.text)

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        results = tool_results(messages)
        if not results:
            described = [(tool.name, tool.description) for tool in params.tools or []]
            assert described == [("double", None), ("loud", "Shout it")]
            return uses(("a", "double", {"x": 21}), ("b", "loud", {"text": "hi"}))
        return "+".join(result_text(r) for r in results)

    async with client_for(mcp, llm) as client:
        result = await client.call_tool("both", {})
    assert result.content[0].text == "42+HI"  # type: ignore[union-attr]


async def test_a_fastmcp_tool_the_caller_may_not_call_is_refused_to_the_model_too() -> None:
    from fastmcp.tools import FunctionTool

    runs: Counter[str] = Counter()
    mcp, flows = new_server()

    def secret() -> str:
        runs["secret"] += 1
        return "the vault code"

    def nobody(ctx: Any) -> bool:
        return False  # an auth check that admits no one

    guarded = FunctionTool.from_function(secret, auth=nobody)

    @flows.tool()
    async def snoop(ctx: Context) -> str:
        return str((await ctx.sample("go", tools=[guarded])).text)  # type: ignore[attr-defined]

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        results = tool_results(messages)
        if not results:
            return uses(("s", "secret", {}))
        return f"{results[0].is_error}: {result_text(results[0])}"

    async with client_for(mcp, llm) as client:
        result = await client.call_tool("snoop", {})
    assert result.content[0].text == (  # type: ignore[union-attr]
        "True: Error executing tool 'secret': not authorized to call tool 'secret'"
    )
    assert runs == Counter()


# -- result_type ----------------------------------------------------------------------------------


async def test_result_type_validates_through_final_response_and_retries_a_bad_answer() -> None:
    mcp, flows = new_server()

    @flows.tool()
    async def judge(ctx: Context) -> str:
        verdict = await ctx.sample("Judge it", result_type=Verdict)  # type: ignore[attr-defined]
        count = await ctx.sample("How many?", result_type=int)  # type: ignore[attr-defined]
        assert isinstance(verdict.result, Verdict) and isinstance(count.result, int)
        return f"{verdict.result.score} {verdict.result.reason} {verdict.text} {count.result} {count.text}"

    seen: list[str] = []

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        assert params.tool_choice is not None and params.tool_choice.mode == "required"
        [tool] = params.tools or []
        assert tool.name == "final_response"
        prompt = messages[0].content
        assert isinstance(prompt, t.TextContent)
        if prompt.text == "How many?":
            assert tool.input_schema["properties"] == {"value": {"type": "integer"}}  # a non-object, wrapped
            return uses(("n", "final_response", {"value": 3}))
        results = tool_results(messages)
        if not results:
            return uses(("v1", "final_response", {"score": "high", "reason": "r"}))
        seen.append(result_text(results[0]))
        assert results[0].tool_use_id == "v1" and results[0].is_error
        return uses(("v2", "final_response", {"score": 9, "reason": "solid"}))

    async with client_for(mcp, llm) as client:
        result = await client.call_tool("judge", {})
    assert result.content[0].text == '9 solid {"score": 9, "reason": "solid"} 3 3'  # type: ignore[union-attr]
    [error] = seen
    assert error.startswith("Validation error: 1 validation error for Verdict\nscore")
    assert error.endswith("Please try again with valid data.")


async def test_result_type_gives_up_after_three_retries_as_fastmcp_3_did() -> None:
    mcp, flows = new_server(max_rounds=20)

    @flows.tool()
    async def stubborn(kind: str, ctx: Context) -> str:
        result = await ctx.sample(kind, result_type=Verdict)  # type: ignore[attr-defined]
        return str(result.result)

    turns: Counter[str] = Counter()
    nudges: list[str] = []

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        prompt = messages[0].content
        assert isinstance(prompt, t.TextContent)
        turns[prompt.text] += 1
        if prompt.text == "text":
            if len(messages) > 1:
                last = messages[-1].content
                assert isinstance(last, t.TextContent)
                nudges.append(last.text)
            return "just text"
        return uses((f"x{turns['invalid']}", "final_response", {"score": "never"}))

    async with client_for(mcp, llm) as client:
        invalid = await client.call_tool("stubborn", {"kind": "invalid"}, raise_on_error=False)
        text = await client.call_tool("stubborn", {"kind": "text"}, raise_on_error=False)

    assert invalid.is_error and text.is_error
    assert invalid.content[0].text.startswith(  # type: ignore[union-attr]
        "Error calling tool 'stubborn': Structured output validation failed 4 consecutive times for type Verdict: "
    )
    assert text.content[0].text == (  # type: ignore[union-attr]
        "Error calling tool 'stubborn': Expected structured output of type Verdict, but the LLM returned a text "
        "response instead of calling the final_response tool (4 attempts)."
    )
    assert turns == Counter(invalid=4, text=4)  # the first try and three retries, each a round
    nudge = "You must call the `final_response` tool to provide your answer. Do not respond with text — use the tool."
    assert nudges == [nudge] * 3


# -- sample_step -----------------------------------------------------------------------------------


async def test_sample_step_is_one_turn_under_the_callers_control() -> None:
    runs: Counter[str] = Counter()
    mcp, flows = new_server()

    def lookup(key: str) -> str:
        runs[key] += 1
        return key * 2

    @flows.tool()
    async def loop(ctx: FlowsContext) -> str:
        messages: Any = "start"
        turns = 0
        while True:
            step = await ctx.sample_step(messages, tools=[lookup], tool_choice="auto")
            turns += 1
            if not step.is_tool_use:
                return f"{step.text} after {turns} turns, {len(step.history)} messages"
            messages = step.history

    @flows.tool()
    async def manual(ctx: FlowsContext) -> str:
        step = await ctx.sample_step("start", tools=[lookup], execute_tools=False)
        calls = [(call.name, call.input) for call in step.tool_calls]
        return f"{step.is_tool_use} {calls} {[m.role for m in step.history]}"

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        assert params.tool_choice is None or params.tool_choice.mode == "auto"
        done = len(tool_results(messages))
        if len(messages) < 5:  # two tool turns, then an answer
            return uses((f"k{len(messages)}", "lookup", {"key": "ab"}))
        return f"ok ({done} result)"

    async with client_for(mcp, llm) as client:
        looped = await client.call_tool("loop", {})
        held = await client.call_tool("manual", {})
    assert looped.content[0].text == "ok (1 result) after 3 turns, 6 messages"  # type: ignore[union-attr]
    assert held.content[0].text == "True [('lookup', {'key': 'ab'})] ['user', 'assistant']"  # type: ignore[union-attr]
    assert runs == Counter(ab=2)  # two tool turns in `loop`, none in `manual`


# -- response_type=None ---------------------------------------------------------------------------


async def test_elicit_without_a_response_type_asks_an_empty_form_and_warns() -> None:
    mcp, flows = new_server()

    @flows.tool()
    async def confirm(what: str, ctx: Context) -> str:
        answer = await ctx.elicit(f"Really {what}?", response_type=None)
        if isinstance(answer, AcceptedElicitation):
            return f"{what}: accepted {answer.data!r}"
        return f"{what}: {answer.action}"

    schemas: list[dict[str, Any]] = []

    async def user(message: str, response_type: Any, params: Any, context: Any) -> FastMCPElicitResult[Any]:
        schemas.append(params.requested_schema)
        if message.startswith("Really delete"):
            return FastMCPElicitResult(action="decline")
        return FastMCPElicitResult(action="accept", content={} if message.startswith("Really ship") else None)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with served(mcp) as url, FastMCPClient(url, elicitation_handler=user, timeout=20.0) as client:
            shipped = await client.call_tool("confirm", {"what": "ship"})
            bare = await client.call_tool("confirm", {"what": "go"})
            deleted = await client.call_tool("confirm", {"what": "delete"})
    assert shipped.content[0].text == "ship: accepted None"  # type: ignore[union-attr]
    assert bare.content[0].text == "go: accepted None"  # type: ignore[union-attr]  # accepted without content
    assert deleted.content[0].text == "delete: decline"  # type: ignore[union-attr]
    assert schemas and all(schema == {"type": "object", "properties": {}} for schema in schemas)
    deprecations = [w for w in caught if issubclass(w.category, FastMCPDeprecationWarning)]
    assert deprecations and "response_type" in str(deprecations[0].message)


# -- the wire ---------------------------------------------------------------------------------------


async def test_tools_need_the_clients_sampling_tools_capability() -> None:
    mcp, flows = new_server()

    def noop() -> str:
        return ""

    @flows.tool()
    async def research(ctx: Context) -> str:
        return str((await ctx.sample("go", tools=[noop])).text)  # type: ignore[attr-defined]

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        raise AssertionError("never asked: the client did not declare sampling.tools")

    async with served(mcp) as url, FastMCPClient(url, sampling_handler=llm, timeout=20.0) as client:
        with pytest.raises(MCPError, match=r"client capability 'sampling\.tools'") as raised:
            await client.call_tool("research", {})
    assert raised.value.error.code == -32021
    assert raised.value.error.data == {"requiredCapabilities": {"sampling": {"tools": {}}}}


async def test_a_list_answer_without_tools_is_taken_by_a_plain_sample() -> None:
    mcp, flows = new_server()

    @flows.tool()
    async def note(ctx: Context) -> str:
        return str((await ctx.sample("One line")).text)  # type: ignore[attr-defined]

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        assert params.tools is None
        return t.CreateMessageResultWithTools(
            role="assistant", content=[t.TextContent(type="text", text="listed")], model="llm", stop_reason="endTurn"
        )

    async with client_for(mcp, llm) as client:
        result = await client.call_tool("note", {})
    assert result.content[0].text == "listed"  # type: ignore[union-attr]


def test_tool_concurrency_and_tool_choice_are_checked_before_asking() -> None:
    from mrtr.fastmcp._sampling import _tool_choice, check_concurrency, prepare_tools

    with pytest.raises(ValueError, match="tool_concurrency must be"):
        check_concurrency(-1)
    with pytest.raises(ValueError, match="Invalid tool_choice: 'sometimes'"):
        _tool_choice("sometimes")
    with pytest.raises(ValueError, match="lambda"):
        prepare_tools([lambda: 1])
    assert json.dumps(prepare_tools([SamplingTool.from_function(lambda: 1, name="one")])[0].parameters)


# -- client-caused errors ---------------------------------------------------------------------------


async def test_client_caused_errors_are_one_info_line_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """On the wire they are what `MCPServer` sends (-32602, a declined call's tool error); in the log, one line."""
    from mcp.client.streamable_http import streamable_http_client

    from mrtr._guard import ReplayGuard
    from mrtr.stores._sqlite import SQLiteStore
    from tests.support.flowkit import Driver, manual_client

    mcp, flows = new_server(replay_guard=ReplayGuard(SQLiteStore(":memory:"), back=False))  # the fork: refused

    @flows.tool()
    async def note(ctx: Context) -> str:
        go = await ctx.elicit("Go?", response_type=bool)
        return f"{go.action}: {(await ctx.sample('One line')).text}"  # type: ignore[attr-defined]

    class Approval(BaseModel):
        ok: bool

    @flows.tool()
    async def pay(ctx: mrtr.FlowContext) -> str:
        return str((await ctx.elicit("Pay?", Approval)).ok)  # a decline raises, and ends the call

    errors: list[MCPError] = []
    with caplog.at_level(logging.DEBUG):
        async with served(mcp) as url, manual_client(streamable_http_client(url)) as client:
            malformed = Driver(client, "note")
            await malformed.send()
            go = malformed.key_for_message("Go?")
            await malformed.send({go: {"action": "accept", "content": {"value": True}}})
            (sample,) = malformed.asked
            state = malformed.state
            with pytest.raises(MCPError) as bad:
                await malformed.send({sample: {"action": "accept", "content": {}}})
            errors.append(bad.value)
            # the same round sent again with another answer: a fork the replay guard refuses
            malformed.state = state
            with pytest.raises(MCPError) as forked:
                await malformed.send(
                    {sample: {"role": "assistant", "model": "m", "content": {"type": "text", "text": "x"}}}
                )
            errors.append(forked.value)
            declined = Driver(client, "pay")
            await declined.send()
            refused = await declined.send({declined.key_for_message("Pay?"): {"action": "decline"}})

    assert [error.error.code for error in errors] == [-32602, -32602]
    assert errors[0].error.message.startswith(f"inputResponses[{sample!r}] is not a valid sampling/createMessage")
    assert errors[0].error.data is not None and errors[0].error.data["inputKey"] == sample
    assert errors[1].error.data is not None and errors[1].error.data["reason"] == "request_state_forked"
    assert isinstance(refused, t.CallToolResult) and refused.is_error
    assert refused.content[0].text == "The user declined the request: Pay?"  # type: ignore[union-attr]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.levelname, r.getMessage()) for r in loud]
    lines = [
        r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name.startswith(("mrtr", "fastmcp"))
    ]
    assert lines == [
        f"flow note: refused the client's request: {errors[0].error.message}",
        f"flow note: refused the client's request: {errors[1].error.message}",
        "Error calling tool 'pay'",  # FastMCP's line for the user's refusal
    ]


# -- in a durable task ------------------------------------------------------------------------------


async def test_the_tool_loop_runs_in_a_durable_task_each_tool_once() -> None:
    """As a task, the loop's asks go out through `tasks/update` and its tool calls are steps in the store."""
    from mrtr.client import tasks_client
    from mrtr.stores import SQLiteStore

    runs: Counter[str] = Counter()
    mcp, flows = new_server("fm-sampling-task", store=SQLiteStore(":memory:"), task_poll_interval=0.05)

    def measure(x: int) -> int:
        runs["measure"] += 1
        return x * 10

    @flows.tool(task="required")
    async def survey(ctx: Context) -> str:
        result = await ctx.sample("Survey", tools=[measure], result_type=int)  # type: ignore[attr-defined]
        return f"total {result.result}"

    async def llm(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResultWithTools:
        results = tool_results(params.messages)
        if not results:
            return uses(("a", "measure", {"x": 1}), ("b", "measure", {"x": 2}))
        total = sum(int(result_text(r)) for r in results)
        return uses(("f", "final_response", {"value": total}))

    from mcp.client.streamable_http import streamable_http_client

    async with served(mcp) as url:
        client = tasks_client(streamable_http_client(url), sampling_callback=llm, sampling_capabilities=TOOLS)
        async with client:
            result = await client.call_tool("survey", {})
    assert not result.is_error, result
    assert result.content[0].text == "total 30"  # type: ignore[union-attr]
    assert runs == Counter(measure=2)


async def test_the_tool_loop_on_a_legacy_session() -> None:
    """2025-11-25: each model turn is a server-to-client `sampling/createMessage`; the tools run in the call."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    runs: Counter[str] = Counter()
    mcp, flows = new_server()

    def lookup(q: str) -> str:
        runs[q] += 1
        return q.upper()

    @flows.tool()
    async def ask(ctx: Context) -> str:
        return str((await ctx.sample("Look it up", tools=[lookup], result_type=str)).text)  # type: ignore[attr-defined]

    async def llm(context: Any, params: t.CreateMessageRequestParams) -> Any:
        results = tool_results(params.messages)
        if not results:
            return uses(("a", "lookup", {"q": "x"}), ("b", "lookup", {"q": "y"}))
        text = "".join(result_text(r) for r in results)
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=text), model="m")

    async with served(mcp) as url:
        client = Client(streamable_http_client(url), mode="legacy", sampling_callback=llm, sampling_capabilities=TOOLS)
        async with client:
            assert client.protocol_version == "2025-11-25"
            result = await client.call_tool("ask", {})
    assert result.content[0].text == "XY"  # type: ignore[union-attr]
    assert runs == Counter(x=1, y=1)
