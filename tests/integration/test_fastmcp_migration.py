"""FastMCP 3.x servers moved by their decorators alone: every context spelling, dependency parameters,
sampling tools that ask, `response_type=None` as 3.x had it.

Each server here is FastMCP 3.x code (`ctx: Context | None = Depends(OptionalContext)`,
`progress: Progress = Progress()`, ...) registered with `@flows.tool` in place of `@mcp.tool`,
served by a real uvicorn, called inline (`fastmcp.Client`) and as a durable task (mrtr's
`tasks_client`, which declares the tasks extension): same answers both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Annotated, Any, Optional, cast

import mcp_types as t
import pytest
from fastmcp import Client as FastMCPClient
from fastmcp import Context, FastMCP
from fastmcp.client.elicitation import ElicitResult
from fastmcp.dependencies import CurrentContext, CurrentFastMCP, CurrentHeaders, Depends, Progress
from fastmcp.exceptions import ToolError
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

import mrtr
import mrtr.fastmcp
from mrtr.client import FlowClient
from mrtr.fastmcp import SamplingTool
from mrtr.stores import SQLiteStore
from tests.support.flowkit import SHARED_KEY, served

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def _optional_context() -> AsyncIterator[Context | None]:
    """A 3.x server's own optional-context dependency (None where no request context exists)."""
    from fastmcp.server.context import _current_context

    yield _current_context.get()


OptionalContext = _optional_context


def new_server(name: str) -> tuple[FastMCP[Any], mrtr.fastmcp.Flows]:
    mcp: FastMCP[Any] = FastMCP(name, request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    return mcp, mrtr.fastmcp.Flows(mcp, store=SQLiteStore(":memory:"), task_poll_interval=0.05)


async def both_ways(mcp: FastMCP[Any], calls: list[tuple[str, dict[str, Any]]], answer: Any) -> list[tuple[str, str]]:
    """Each call's text inline (fastmcp.Client) and as a task (tasks_client); `answer` answers each form."""
    from mrtr.client import tasks_client

    async def fastmcp_user(message: str, response_type: Any, params: Any, context: Any) -> ElicitResult[Any]:
        return ElicitResult(action="accept", content=answer(message))

    async def task_user(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return t.ElicitResult(action="accept", content=answer(params.message))

    texts: list[tuple[str, str]] = []
    async with (
        served(mcp) as url,
        FastMCPClient(url, elicitation_handler=fastmcp_user, timeout=20.0) as client,
        tasks_client(streamable_http_client(url), elicitation_callback=task_user) as tasks,
    ):
        for tool, arguments in calls:
            inline = await client.call_tool(tool, arguments)
            tasked = await tasks.call_tool(tool, arguments)
            assert not tasked.is_error, tasked
            texts.append((cast(t.TextContent, inline.content[0]).text, cast(t.TextContent, tasked.content[0]).text))
    return texts


# -- every spelling of a context --------------------------------------------------------------------


async def test_every_context_spelling_gets_the_flows_context_inline_and_as_a_task() -> None:
    mcp, flows = new_server("fm-contexts")

    @flows.tool(task="optional")
    async def plain(ctx: Context) -> str:
        return await ask(ctx)

    @flows.tool(task="optional")
    async def union(ctx: Context | None = None) -> str:
        return await ask(ctx)

    @flows.tool(task="optional")
    async def optional(ctx: Optional[Context] = None) -> str:  # noqa: UP045  # the spelling under test
        return await ask(ctx)

    @flows.tool(task="optional")
    async def depends(topic: str, ctx: Context | None = Depends(OptionalContext)) -> str:  # noqa: B008
        return f"{topic}: " + await ask(ctx)

    @flows.tool(task="optional")
    async def current(ctx: Context = CurrentContext()) -> str:  # noqa: B008
        return await ask(ctx)

    @flows.tool(task="optional")
    async def annotated(ctx: Annotated[Context | None, "the context"] = None) -> str:
        return await ask(ctx)

    async def ask(ctx: Context | None) -> str:
        assert isinstance(ctx, mrtr.fastmcp.FlowsContext), type(ctx)
        answer = await ctx.elicit("Name?", response_type=str)
        assert isinstance(answer, AcceptedElicitation)
        return f"hello {answer.data}"

    listed = {tool.name: tool for tool in await mcp.list_tools()}
    assert "topic" in listed["depends"].parameters["properties"]
    served_tool = listed["plain"].to_mcp_tool()  # as FastMCP's own task tools: 2025-11-25 sessions see it
    assert served_tool.execution is not None and served_tool.execution.task_support == "optional"
    assert all(set(tool.parameters.get("properties", {})) <= {"topic"} for tool in listed.values())
    calls = [(name, {}) for name in ("plain", "union", "optional", "current", "annotated")]
    texts = await both_ways(mcp, [*calls, ("depends", {"topic": "t"})], lambda _: {"value": "Ada"})
    assert texts == [("hello Ada", "hello Ada")] * 5 + [("t: hello Ada", "t: hello Ada")]


@pytest.mark.parametrize("task", ["never", "optional"])
def test_a_context_shape_mrtr_cannot_serve_is_refused_naming_the_annotation(task: str) -> None:
    _, flows = new_server("fm-refused")

    async def either(ctx: Context | str) -> str:
        return "x"

    async def many(ctxs: list[Context]) -> str:
        return "x"

    async def two(ctx: Context, other: Context | None = None) -> str:
        return "x"

    for fn, named in ((either, "Context | str"), (many, "list[Context]"), (two, "'ctx' and 'other'")):
        with pytest.raises(mrtr.FlowDefinitionError, match=named.replace("|", r"\|").replace("[", r"\[")):
            flows.tool(task=task)(fn)  # type: ignore[arg-type]


# -- dependency parameters --------------------------------------------------------------------------


async def test_dependencies_are_resolved_on_every_run_and_never_stored() -> None:
    """`Progress` reports through the flow's context; `Depends`/`CurrentFastMCP` resolve each run, in a task too."""
    mcp, flows = new_server("fm-deps")
    opened: Counter[str] = Counter()

    @contextlib.asynccontextmanager
    async def database() -> AsyncIterator[str]:
        opened["db"] += 1
        yield "db-handle"

    @flows.tool(task="optional")
    async def report(
        topic: str,
        progress: Progress = Progress(),  # noqa: B008
        db: str = Depends(database),
        server: FastMCP[Any] = CurrentFastMCP(),  # noqa: B008
        headers: dict[str, str] = CurrentHeaders(),  # noqa: B008
        ctx: Context | None = Depends(OptionalContext),  # noqa: B008
    ) -> str:
        await progress.set_total(3)
        await progress.increment()
        assert ctx is not None
        answer = await ctx.elicit(f"Scope of {topic}?", response_type=str)
        assert isinstance(answer, AcceptedElicitation)
        await progress.set_message("researching")
        await progress.increment(2)
        via = f"{db} on {server.name}, {'with' if 'user-agent' in headers else 'without'} HTTP headers"
        return f"{topic}/{answer.data} via {via} ({progress.current}/{progress.total})"

    listed = {tool.name: tool for tool in await mcp.list_tools()}
    assert set(listed["report"].parameters["properties"]) == {"topic"}

    reports: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    async def user(message: str, response_type: Any, params: Any, context: Any) -> ElicitResult[Any]:
        return ElicitResult(action="accept", content={"value": "EU"})

    handlers: dict[str, Any] = {"elicitation_handler": user, "progress_handler": on_progress}
    async with served(mcp) as url, FastMCPClient(url, timeout=20.0, **handlers) as client:
        inline = await client.call_tool("report", {"topic": "cars"})
    assert inline.content[0].text == "cars/EU via db-handle on fm-deps, with HTTP headers (3/3)"  # type: ignore[union-attr]
    assert (3, 3, "researching") in reports  # the last round's notifications reach the client
    opened.clear()
    [(_, tasked)] = await both_ways(mcp, [("report", {"topic": "cars"})], lambda _: {"value": "EU"})
    # a task's run has the headers of the request that started it here, none on a worker that adopted it
    assert tasked.startswith("cars/EU via db-handle on fm-deps, with") and tasked.endswith(" HTTP headers (3/3)")
    assert opened["db"] >= 2  # once per run: the inline call's rounds and the task's


# -- a sampling tool that asks ----------------------------------------------------------------------

TOOLS = t.SamplingCapability(tools=t.SamplingToolsCapability())


class Refined(BaseModel):
    query: str
    clarified: bool


async def test_a_sampling_tool_asks_the_user_across_rounds_and_runs_once() -> None:
    """SEP-1577's pattern, as 3.x servers write it: the context reaches the tool through a module-level holder."""
    mcp, flows = new_server("fm-asking-tool")
    holder: dict[str, Context | None] = {"ctx": None}
    looked_up: Counter[str] = Counter()

    background: list[asyncio.Task[None]] = []

    async def ask_questions(questions: list[str]) -> str:
        ctx = holder["ctx"]
        assert ctx is not None
        looked_up["asked"] += 1
        # A task the tool leaves running (an HTTP client's reader, say) is its own, not the flow's:
        # the round neither waits for it nor cancels it.
        background.append(asyncio.create_task(asyncio.sleep(60)))
        answers = [await ctx.elicit(question, response_type=str) for question in questions]
        return "; ".join(f"{a.data}" for a in answers if isinstance(a, AcceptedElicitation))

    clarify = SamplingTool(
        name="ask_questions",
        description="Ask the user",
        parameters={"type": "object", "properties": {"questions": {"type": "array", "items": {"type": "string"}}}},
        fn=ask_questions,
    )

    @flows.tool(task="optional")
    async def research(query: str, ctx: Context | None = Depends(OptionalContext)) -> str:  # noqa: B008
        assert ctx is not None
        holder["ctx"] = ctx
        result = await ctx.sample(f"Refine: {query}", tools=[clarify], result_type=Refined)  # type: ignore[attr-defined]
        return f"{result.result.query} (clarified: {result.result.clarified})"

    def llm(messages: list[t.SamplingMessage]) -> t.CreateMessageResultWithTools:
        last = messages[-1].content_as_list
        results = [block for block in last if isinstance(block, t.ToolResultContent)]
        if not results:
            return uses(("q", "ask_questions", {"questions": ["Which years?", "Which region?"]}))
        answer = cast(t.TextContent, results[0].content[0]).text
        return uses(("f", "final_response", {"query": f"cars [{answer}]", "clarified": True}))

    def user(message: str) -> dict[str, Any]:
        return {"value": {"Which years?": "2020s", "Which region?": "EU"}[message]}

    async def fastmcp_llm(messages: Any, params: t.CreateMessageRequestParams, context: Any) -> Any:
        return llm(params.messages)

    async def fastmcp_user(message: str, response_type: Any, params: Any, context: Any) -> ElicitResult[Any]:
        return ElicitResult(action="accept", content=user(message))

    async def task_llm(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResultWithTools:
        return llm(params.messages)

    async def task_user(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return t.ElicitResult(action="accept", content=user(params.message))

    from mrtr.client import tasks_client

    handlers: dict[str, Any] = {"sampling_handler": fastmcp_llm, "elicitation_handler": fastmcp_user}
    async with served(mcp) as url:
        async with FastMCPClient(url, sampling_capabilities=TOOLS, timeout=20.0, **handlers) as client:
            inline = await client.call_tool("research", {"query": "cars"})
        assert looked_up["asked"] == 3  # run again on each round until it returned: 2 asks, then done
        looked_up.clear()
        task = tasks_client(
            streamable_http_client(url),
            sampling_callback=task_llm,
            elicitation_callback=task_user,
            sampling_capabilities=TOOLS,
        )
        async with task:
            tasked = await task.call_tool("research", {"query": "cars"})
    assert background and not any(task.done() for task in background)
    for task in background:
        task.cancel()
    expected = "cars [2020s; EU] (clarified: True)"
    assert inline.content[0].text == expected  # type: ignore[union-attr]
    assert not tasked.is_error, tasked
    assert tasked.content[0].text == expected  # type: ignore[union-attr]


def uses(*calls: tuple[str, str, dict[str, Any]]) -> t.CreateMessageResultWithTools:
    blocks: list[Any] = [t.ToolUseContent(type="tool_use", id=i, name=n, input=a) for i, n, a in calls]
    return t.CreateMessageResultWithTools(role="assistant", content=blocks, model="llm", stop_reason="toolUse")


# -- response_type=None, as FastMCP 3.4's own tests check it ----------------------------------------


@pytest.mark.filterwarnings("ignore::fastmcp.exceptions.FastMCPDeprecationWarning")  # 3.x warned too
class TestResponseTypeNone:
    """FastMCP v3.4.7's `TestScalarResponseTypes` cases for `response_type=None`, with `@flows.tool`."""

    @staticmethod
    def server() -> FastMCP[Any]:
        mcp, flows = new_server("TestServer")

        @flows.tool()
        async def my_tool(context: Context) -> None:
            result = await context.elicit(message="", response_type=None)
            return result.data  # type: ignore[attr-defined,no-any-return]

        return mcp

    async def test_elicitation_no_response(self) -> None:
        async def elicitation_handler(message: str, response_type: Any, params: Any, ctx: Any) -> ElicitResult[Any]:
            assert params.requested_schema == {"type": "object", "properties": {}}
            assert response_type is None
            return ElicitResult(action="accept")

        mcp = self.server()
        async with served(mcp) as url, FastMCPClient(url, elicitation_handler=elicitation_handler) as client:
            result = await client.call_tool("my_tool", {})
            assert result.data is None

    async def test_elicitation_empty_response(self) -> None:
        async def elicitation_handler(message: str, response_type: Any, params: Any, ctx: Any) -> ElicitResult[Any]:
            return ElicitResult(action="accept", content={})

        mcp = self.server()
        async with served(mcp) as url, FastMCPClient(url, elicitation_handler=elicitation_handler) as client:
            result = await client.call_tool("my_tool", {})
            assert result.data is None

    async def test_elicitation_response_when_no_response_requested(self) -> None:
        asked: list[str] = []

        async def elicitation_handler(message: str, response_type: Any, params: Any, ctx: Any) -> ElicitResult[Any]:
            asked.append(message)
            return ElicitResult(action="accept", content={"value": "hello"})

        mcp = self.server()
        async with served(mcp) as url, FastMCPClient(url, elicitation_handler=elicitation_handler) as client:
            with pytest.raises(ToolError, match="Elicitation expected an empty response"):
                await client.call_tool("my_tool", {})
        assert asked == [""]  # failed at once, as 3.x did: not asked again until the round cap


# -- form constraints -------------------------------------------------------------------------------


class Booking(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{3}$", description="Airport code")
    seats: int = Field(ge=1, le=9)


async def test_a_constraint_is_said_in_words_and_three_wrong_answers_stop_the_call_naming_it() -> None:
    mcp, flows = new_server("fm-constraints")

    @flows.tool()
    async def book(ctx: Context) -> str:
        answer = await ctx.elicit("Where to?", response_type=Booking)
        assert isinstance(answer, AcceptedElicitation)
        return f"{answer.data.code} x{answer.data.seats}"

    schemas: list[dict[str, Any]] = []

    async def host_dropping_keywords(params: t.ElicitRequestParams) -> t.ElicitResult:
        assert isinstance(params, t.ElicitRequestFormParams)
        schemas.append(params.requested_schema)
        return t.ElicitResult(action="accept", content={"code": "lax", "seats": 2})  # never upper case

    async with served(mcp) as url, FlowClient(url, elicit=host_dropping_keywords) as client:
        with pytest.raises(MCPError, match=r"refused 3 times in a row: Code must match pattern '\^\[A-Z\]\{3\}\$'"):
            await client.call_tool("book", {})
    assert len(schemas) == 3  # asked, re-asked twice, then stopped: never the round cap
    fields = schemas[0]["properties"]
    assert fields["code"]["description"] == "Airport code (must match the pattern ^[A-Z]{3}$)"
    assert fields["seats"]["description"] == "At least 1; at most 9"


def test_a_constraint_no_form_can_carry_is_refused_at_registration() -> None:
    _, flows = new_server("fm-uncarried")

    class Account(BaseModel):
        user: str = Field(json_schema_extra={"not": {"const": "root"}})

    async def create(ctx: Context) -> str:
        answer = await ctx.elicit("Account?", response_type=Account)
        return str(answer)

    with pytest.raises(mrtr.FlowDefinitionError, match="field 'user' has the constraint 'not'"):
        flows.tool()(create)


async def test_a_task_flow_without_a_context_reports_progress_through_the_flows_own() -> None:
    """No context parameter and no step: the whole call is one step, its `Progress` still reports."""
    mcp, flows = new_server("fm-progress-only")

    @flows.tool(task="optional")
    async def crunch(n: int, progress: Progress = Progress()) -> str:  # noqa: B008
        await progress.set_total(n)
        for _ in range(n):
            await progress.increment()
        return f"crunched {progress.current}/{progress.total}"

    assert await both_ways(mcp, [("crunch", {"n": 3})], lambda _: {}) == [("crunched 3/3", "crunched 3/3")]
