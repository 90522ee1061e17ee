"""A research assistant in the shape of machinemates-ai/gemini-research-mcp.

FastMCP 3.x code: an optional context (`ctx: Context | None = Depends(OptionalContext)`, the
server's own dependency, None where 3.x had no context), a `Progress` dependency, and SEP-1577's
clarification: `ctx.sample(tools=[...], result_type=...)` whose sampling tool asks the user
(`ctx.elicit` through a module-level holder, as the original does). The slow "research" is a
plain await, as the original's API call is. What moving it to mrtr changed, and nothing else:
- imports: `mrtr.fastmcp`, `SamplingTool` from `mrtr.fastmcp` (was `fastmcp.server.sampling`),
  `open_store`, `RequestStateSecurity`;
- `FastMCP(..., request_state_security=...)` and `flows = mrtr.fastmcp.Flows(mcp, store=...)`;
- `@flows.tool(task="optional")` for `@mcp.tool(task=TaskConfig(mode="optional"))`.

Reads MRTR_STATE_KEY (hex), MRTR_STORE, MRTR_STORE_NAMESPACE, MRTR_INSTANCE and MRTR_AUDIT
(a file each research run appends a JSON line to, with the instance that ran it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastmcp import Context, FastMCP
from fastmcp.dependencies import Depends, Progress
from mcp.server.request_state import RequestStateSecurity  # migration: the fleet's key
from pydantic import BaseModel, Field, create_model

import mrtr.fastmcp  # migration
from mrtr.fastmcp import SamplingTool  # migration: was `from fastmcp.server.sampling import SamplingTool`
from mrtr.stores import open_store  # migration


@contextlib.asynccontextmanager
async def _optional_context() -> AsyncGenerator[Context | None, None]:
    """The request's context, or None where there is none (3.x's background tasks)."""
    try:
        from fastmcp.server.context import _current_context

        yield _current_context.get()
    except Exception:
        yield None


OptionalContext = _optional_context

mcp: FastMCP[Any] = FastMCP(
    "research", request_state_security=RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])])
)
flows = mrtr.fastmcp.Flows(  # migration
    mcp,
    store=open_store(os.environ["MRTR_STORE"], namespace=os.environ["MRTR_STORE_NAMESPACE"] + "_research"),
    task_lease=1.0,
    task_scan_interval=0.2,
    task_poll_interval=0.1,
)


class AnalyzedQuery(BaseModel):
    refined_query: str = Field(description="The research query to run")
    was_clarified: bool = Field(description="Whether the user was asked")


_clarification_context: Context | None = None


async def _ask_clarifying_questions(questions: list[str], original_query: str) -> str:
    """The sampling tool: the model asks the user, through the context the tool call was made in."""
    ctx = _clarification_context
    if ctx is None:
        return ""
    fields: dict[str, Any] = {
        f"answer_{i + 1}": (str, Field(default="", description=q)) for i, q in enumerate(questions)
    }
    form = create_model("ClarificationQuestions", **fields)
    result = await ctx.elicit(f"To sharpen the research on {original_query!r}, please answer:", response_type=form)
    if result.action != "accept":
        return ""
    answers = result.data.model_dump()
    return " / ".join(f"{q}: {answers[f'answer_{i + 1}']}" for i, q in enumerate(questions))


_clarify_tool = SamplingTool(
    name="ask_clarifying_questions",
    description="Ask the user questions that narrow a vague research query.",
    parameters={
        "type": "object",
        "properties": {
            "questions": {"type": "array", "items": {"type": "string"}},
            "original_query": {"type": "string"},
        },
        "required": ["questions", "original_query"],
    },
    fn=_ask_clarifying_questions,
)


def _audit(query: str, phase: str) -> int:
    """Append this run's line to the shared audit file; how many runs of `query` started before it."""
    path = os.environ["MRTR_AUDIT"]
    with open(path, "a+") as log:
        log.seek(0)
        earlier = sum(1 for line in log if json.loads(line)["query"] == query and '"start"' in line)
        log.write(json.dumps({"query": query, "phase": phase, "instance": os.environ.get("MRTR_INSTANCE")}) + "\n")
    return earlier


async def _deep_research(query: str, seconds: float) -> str:
    """The long external call (Gemini's Deep Research, in the original): `seconds` long the first time a
    query is researched, at once when it is run again (the fleet test kills the first run)."""
    if _audit(query, "start") == 0:
        await asyncio.sleep(seconds)
    _audit(query, "end")
    return f"findings on {query}"


@flows.tool(task="optional")  # was: @mcp.tool(task=TaskConfig(mode="optional"))
async def research_deep(
    query: Annotated[str, "Research question or topic"],
    seconds: Annotated[float, "How long the research takes"] = 0.0,
    progress: Progress = Progress(),  # noqa: B008
    ctx: Context | None = Depends(OptionalContext),  # noqa: B008 - None in 3.x's background tasks
) -> str:
    """Clarify the query with the user (through the client's LLM), then research it."""
    global _clarification_context
    await progress.set_total(2)
    await progress.set_message("clarifying")
    refined = query
    if ctx is not None:
        _clarification_context = ctx
        try:
            result = await ctx.sample(
                messages=f"Analyze this research query and refine it if needed:\n\n{query}",
                system_prompt="Call ask_clarifying_questions when the query is vague.",
                tools=[_clarify_tool],
                result_type=AnalyzedQuery,
                max_tokens=1024,
            )
            refined = result.result.refined_query
        finally:
            _clarification_context = None
    await progress.increment()
    await progress.set_message("researching")
    findings = await _deep_research(refined, seconds)
    await progress.increment()
    return f"## Report\n{findings}"
