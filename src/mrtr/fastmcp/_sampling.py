"""FastMCP 3.x's server-side sampling loop on mrtr's rounds: `ctx.sample(tools=, result_type=)`, `ctx.sample_step`.

FastMCP 3.x ran the loop inside one `tools/call`: ask the client's LLM, run the tools it
calls, ask again with their results, until a final answer. FastMCP 4 removed it, because
2026-07-28 has no server-to-client requests. On a replay engine the same loop is exact:

- every sampling request is an ask: the round ends, the client's LLM answers, and the next
  round (on any instance) replays the loop from the top with that answer journaled;
- every tool call the model makes runs as a step, so it runs once per flow across the
  fleet, and a replay gets its journaled result (a tool that raised included: the model was
  told, and is told the same on every replay);
- `result_type`'s validation retries are further rounds, capped as 3.x capped them.

So a sampling loop of n model turns costs n rounds, and the flow's round cap (and the
client's) must allow them. The behaviour and the texts the model sees follow 3.x:
tools run one at a time unless `tool_concurrency` says otherwise, results come back in
the order of the calls, an unknown tool or a raising one is reported to the model as an
error result, and structured output goes through a synthetic `final_response` tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import re
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypedDict, TypeVar, cast

from fastmcp import settings as fastmcp_settings
from fastmcp.exceptions import AuthorizationError, ToolError
from fastmcp.tools import FunctionTool, Tool
from fastmcp.utilities.json_schema import compress_schema
from mcp.server.validation import validate_tool_use_result_messages
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ModelHint,
    ModelPreferences,
    SamplingMessage,
    SamplingMessageContentBlock,
    TextContent,
    ToolChoice,
    ToolResultContent,
    ToolUseContent,
)
from mcp_types import Tool as WireTool
from pydantic import TypeAdapter, ValidationError

from mrtr._engine.context import FlowContext
from mrtr._errors import FlowError
from mrtr._wire import JSONObject
from mrtr.fastmcp import _internals as internals

logger = logging.getLogger("mrtr.fastmcp.sampling")

ResultT = TypeVar("ResultT")

ToolChoiceOption = Literal["auto", "required", "none"]
"""3.x's `tool_choice`: the mode string of the spec's `ToolChoice`."""

DEFAULT_MAX_TOKENS = 512
"""What FastMCP 3.x asked for when `max_tokens` was not given."""

MAX_ITERATIONS = 100
"""3.x's safety limit on model turns in one `sample` call (each is a round here: the round cap comes first)."""
MAX_VALIDATION_RETRIES = 3
"""Consecutive `final_response` answers that fail `result_type`, after the first, before giving up (3.x's cap)."""
MAX_TEXT_RESPONSE_RETRIES = 3
"""Text answers (no `final_response` call) under `result_type`, before giving up (3.x's cap)."""

FINAL_RESPONSE = "final_response"


@dataclass
class SamplingResult(Generic[ResultT]):
    """What `ctx.sample(...)` returns, as in FastMCP 3.x: `.text`, `.result`, `.history`."""

    text: str | None
    """The final text; with `result_type`, the validated result as JSON."""
    result: ResultT
    """The text (`""` when there was none), or the `result_type` value."""
    history: list[SamplingMessage] = field(default_factory=list)
    """Every message of the exchange: the prompt, each answer, each round of tool results."""


@dataclass
class SampleStep:
    """One model turn (`ctx.sample_step(...)`): the answer, and the history including it (and tool results)."""

    response: CreateMessageResult | CreateMessageResultWithTools
    history: list[SamplingMessage]

    @property
    def is_tool_use(self) -> bool:
        """The model asked for tools (a tools-mode answer stopping with `toolUse`)."""
        return isinstance(self.response, CreateMessageResultWithTools) and self.response.stop_reason == "toolUse"

    @property
    def is_text(self) -> bool:
        """The model answered (it did not ask for tools)."""
        return not self.is_tool_use

    @property
    def text(self) -> str | None:
        """The answer's first text block, if any."""
        return next((block.text for block in _blocks(self.response) if isinstance(block, TextContent)), None)

    @property
    def tool_calls(self) -> list[ToolUseContent]:
        """The tool calls in the answer, in order."""
        return [block for block in _blocks(self.response) if isinstance(block, ToolUseContent)]


@dataclass(frozen=True)
class SamplingTool:
    """A tool the model may call during `ctx.sample` (3.x's `SamplingTool`); plain functions and
    FastMCP tools are turned into one. Each call runs as an mrtr step."""

    name: str
    description: str | None
    parameters: JSONObject
    fn: Callable[..., Any]
    sequential: bool = False
    """Run every tool of a batch that contains this one, one at a time (shared state, files...)."""
    pure: bool = field(default=False, repr=False)
    """No side effect and a deterministic value (the synthetic `final_response`): nothing is journaled for its
    calls, it simply runs again on every round. Without it (the default) a call runs in the flow, may ask
    (`ctx.elicit`, `ctx.sample`, `ctx.list_roots`) across rounds, and is journaled once it returns, so it
    does not run again. It changes only what is journaled: a tool that asks works either way."""

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        sequential: bool = False,
    ) -> SamplingTool:
        """The schema comes from the signature and the description from the docstring, as for a FastMCP tool."""
        parsed = FunctionTool.from_function(fn, name=name, description=description)
        if parsed.name == "<lambda>":
            raise ValueError("a lambda has no name the model can call it by: pass name=...")
        return cls(parsed.name, parsed.description, parsed.parameters, fn, sequential)

    @classmethod
    def from_tool(cls, tool: Tool, *, name: str | None = None, description: str | None = None) -> SamplingTool:
        """A FastMCP tool, run through its own `run` (argument validation, serializers), its value unwrapped.

        Its `auth` is checked first, as for a direct call: the model cannot reach a tool the user
        calling this flow could not (a refusal goes back to the model as the tool's error).
        """

        async def run(**arguments: Any) -> Any:
            if tool.auth is not None and not await internals.component_auth_allows(tool):
                raise AuthorizationError(f"not authorized to call tool {tool.name!r}")
            return _unwrap(tool, await tool.run(arguments))

        return cls(name or tool.name, description or tool.description, tool.parameters, run)

    def wire(self) -> WireTool:
        return WireTool(name=self.name, description=self.description, input_schema=self.parameters)


SamplingTools = Sequence[SamplingTool | Tool | Callable[..., Any]]
"""What `tools=` takes: `SamplingTool`s, FastMCP tools, plain (sync or async) functions."""


# -- one model turn ------------------------------------------------------------------------------


async def sample_step(
    flow: FlowContext,
    messages: str | Sequence[str | SamplingMessage],
    *,
    system_prompt: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    model_preferences: ModelPreferences | str | list[str] | None = None,
    tools: SamplingTools | None = None,
    tool_choice: ToolChoiceOption | str | None = None,
    execute_tools: bool = True,
    mask_error_details: bool | None = None,
    tool_concurrency: int | None = None,
) -> SampleStep:
    """One sampling request (an ask), then, if the model called tools, each call as a step (see the module)."""
    return await _step(
        flow,
        prepare_messages(messages),
        _request_options(system_prompt, temperature, max_tokens, model_preferences),
        prepare_tools(tools),
        _tool_choice(tool_choice),
        execute_tools,
        mask_error_details,
        tool_concurrency,
    )


@dataclass(frozen=True)
class _Options:
    system_prompt: str | None
    temperature: float | None
    max_tokens: int
    model_preferences: ModelPreferences | None


def _request_options(
    system_prompt: str | None,
    temperature: float | None,
    max_tokens: int | None,
    model_preferences: ModelPreferences | str | list[str] | None,
) -> _Options:
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    return _Options(system_prompt, temperature, max_tokens, preferences(model_preferences))


async def _step(
    flow: FlowContext,
    history: list[SamplingMessage],
    options: _Options,
    tools: list[SamplingTool],
    tool_choice: ToolChoice | None,
    execute_tools: bool,
    mask_error_details: bool | None,
    tool_concurrency: int | None,
) -> SampleStep:
    check_concurrency(tool_concurrency)
    # The SDK's own check of tool_use/tool_result pairing, as 3.x's `create_message` ran it: a
    # history that breaks it fails here (ValueError), before the client is asked.
    validate_tool_use_result_messages(history)
    params = CreateMessageRequestParams(
        messages=history,
        system_prompt=options.system_prompt,
        temperature=options.temperature,
        max_tokens=options.max_tokens,
        model_preferences=options.model_preferences,
        tools=[tool.wire() for tool in tools] or None,
        tool_choice=tool_choice,
    )
    response = await flow.create_message(params)
    if params.tools is not None and isinstance(response, CreateMessageResult):
        # A tools-mode request gets the array-capable model back, as from the SDK's create_message.
        response = CreateMessageResultWithTools.model_validate(response.model_dump(by_alias=True))
    history = [*history, SamplingMessage(role="assistant", content=response.content)]
    step = SampleStep(response, history)
    if not step.is_tool_use or not execute_tools or not step.tool_calls:
        return step
    mask = fastmcp_settings.mask_error_details if mask_error_details is None else mask_error_details
    results = await _run_calls(flow, step.tool_calls, {tool.name: tool for tool in tools}, mask, tool_concurrency)
    step.history.append(SamplingMessage(role="user", content=cast(list[SamplingMessageContentBlock], results)))
    return step


# -- the loop ------------------------------------------------------------------------------------


async def sample(
    flow: FlowContext,
    messages: str | Sequence[str | SamplingMessage],
    *,
    system_prompt: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    model_preferences: ModelPreferences | str | list[str] | None = None,
    tools: SamplingTools | None = None,
    result_type: type[Any] | None = None,
    mask_error_details: bool | None = None,
    tool_concurrency: int | None = None,
) -> SamplingResult[Any]:
    """Model turns until a final answer (3.x's `ctx.sample`): tools run as steps, `result_type` via `final_response`."""
    options = _request_options(system_prompt, temperature, max_tokens, model_preferences)
    sampling_tools = prepare_tools(tools)
    structured = result_type is not None and result_type is not str
    final: _FinalResponse | None = None
    choice: ToolChoice | None = None
    if structured:
        assert result_type is not None
        try:
            final = _final_response(cast(Hashable, result_type))
        except TypeError:  # an unhashable type form: built for this call only
            final = _FinalResponse(result_type)
        sampling_tools = [*sampling_tools, final.tool]
        choice = ToolChoice(mode="required")  # the model must end by calling final_response
    history = prepare_messages(messages)
    failed_validations = 0
    text_answers = 0
    for _ in range(MAX_ITERATIONS):
        step = await _step(flow, history, options, sampling_tools, choice, True, mask_error_details, tool_concurrency)
        history = step.history
        calls = [call for call in step.tool_calls if call.name == FINAL_RESPONSE] if final and step.is_tool_use else []
        if not calls:
            failed_validations = 0  # only consecutive failures count
        for call in calls:
            assert final is not None
            try:
                value = final.validate(call.input)
            except ValidationError as exc:
                failed_validations += 1
                if failed_validations > MAX_VALIDATION_RETRIES:
                    raise RuntimeError(
                        f"Structured output validation failed {failed_validations} consecutive times for type "
                        f"{final.type_name}: {exc}"
                    ) from exc
                _report_invalid(history, call, f"Validation error: {exc}. Please try again with valid data.")
                continue
            return SamplingResult(final.text(value), value, history)
        if step.is_tool_use:
            continue
        if final is None:
            return SamplingResult(step.text, step.text or "", history)
        text_answers += 1
        if text_answers > MAX_TEXT_RESPONSE_RETRIES:
            raise RuntimeError(
                f"Expected structured output of type {final.type_name}, but the LLM returned a text response "
                f"instead of calling the final_response tool ({text_answers} attempts)."
            )
        nudge = (
            "You must call the `final_response` tool to provide your answer. Do not respond with text — use the tool."
        )
        history.append(SamplingMessage(role="user", content=TextContent(type="text", text=nudge)))
    raise RuntimeError(f"Sampling exceeded maximum iterations ({MAX_ITERATIONS})")


class _FinalResponse:
    """The synthetic tool a structured answer arrives through, and how that answer is validated."""

    def __init__(self, result_type: type[Any]) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(result_type)
        self.type_name = getattr(result_type, "__name__", repr(result_type))
        schema = compress_schema(self.adapter.json_schema(), prune_titles=True)
        # Tool arguments are an object: anything else travels wrapped as {"value": ...}.
        self.wrapped = schema.get("type") != "object"
        if self.wrapped:
            schema = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
        self.tool = SamplingTool(
            FINAL_RESPONSE,
            "Call this tool with your final answer, once the task is done.",
            schema,
            _echo,
            pure=True,
        )

    def validate(self, arguments: JSONObject) -> Any:
        data: Any = arguments["value"] if self.wrapped and "value" in arguments else arguments
        return self.adapter.validate_python(data)

    def text(self, value: Any) -> str:
        return json.dumps(self.adapter.dump_python(value, mode="json"))


@functools.lru_cache(maxsize=256)
def _final_response(result_type: Any) -> _FinalResponse:
    """Made once per type: its validator and schema cost more than a replayed round."""
    return _FinalResponse(result_type)


def _echo(**arguments: Any) -> JSONObject:
    return arguments


def _report_invalid(history: list[SamplingMessage], call: ToolUseContent, text: str) -> None:
    """Tell the model its `final_response` did not validate, in place of that call's tool result.

    The result stays in the one tool-results message that follows the model's turn: a second
    tool-results message would break the spec's tool_use/tool_result pairing.
    """
    error = ToolResultContent(tool_use_id=call.id, content=[TextContent(type="text", text=text)], is_error=True)
    last = history[-1]
    if last.role == "user" and isinstance(last.content, list):
        blocks = [error if _result_for(block, call.id) else block for block in last.content]
        history[-1] = SamplingMessage(role="user", content=blocks)
    else:
        history.append(SamplingMessage(role="user", content=[error]))


def _result_for(block: SamplingMessageContentBlock, call_id: str) -> bool:
    return isinstance(block, ToolResultContent) and block.tool_use_id == call_id


# -- tool calls ----------------------------------------------------------------------------------


def check_concurrency(tool_concurrency: int | None) -> None:
    if tool_concurrency is not None and tool_concurrency < 0:
        raise ValueError(
            f"tool_concurrency must be None (one at a time), 0 (no limit) or a positive limit, got {tool_concurrency}"
        )


async def _run_calls(
    flow: FlowContext,
    calls: list[ToolUseContent],
    tools: dict[str, SamplingTool],
    mask: bool,
    tool_concurrency: int | None,
) -> list[ToolResultContent]:
    """Every call's result, in the order of the calls; concurrently up to `tool_concurrency` (3.x's rule:
    None runs them one at a time, 0 without limit; a `sequential` tool in the batch makes it one at a time)."""
    sequential = tool_concurrency is None or any(tools[c.name].sequential for c in calls if c.name in tools)
    if sequential:
        return [await _run_call(flow, call, tools, mask) for call in calls]
    limit = asyncio.Semaphore(tool_concurrency or len(calls))

    async def bounded(call: ToolUseContent) -> ToolResultContent:
        async with limit:
            return await _run_call(flow, call, tools, mask)

    # `gather` gives each call its own branch: step names stay stable whatever order they finish in.
    return await flow.gather(*[bounded(call) for call in calls])


async def _run_call(
    flow: FlowContext, call: ToolUseContent, tools: dict[str, SamplingTool], mask: bool
) -> ToolResultContent:
    tool = tools.get(call.name)
    if tool is None:  # nothing runs, so nothing to journal: the same answer on every replay
        return _result(call, f"Error: Unknown tool '{call.name}'", error=True)
    if tool.pure:
        outcome = await run_tool(tool, call.input, mask)
    else:  # in the flow, so the tool may ask (ctx.elicit, ctx.sample, ctx.list_roots); journaled once it returns
        outcome = await flow.inline_step(step_name(tool.name), run_tool, tool, call.input, mask)
    return _result(call, outcome["text"], error=outcome["error"])


def step_name(tool: str) -> str:
    """The step a call of `tool` runs as (`#2`, `#3`... when it is called again in one flow)."""
    return "sampling-tool:" + re.sub(r"[#/@]", "_", tool)


class ToolOutcome(TypedDict):
    """What a sampling tool's call tells the model, as its step journals it."""

    text: str
    """The tool's value as text, or its error's message."""
    error: bool


async def run_tool(tool: SamplingTool, arguments: Mapping[str, Any], mask: bool) -> ToolOutcome:
    """Run one tool call and say what the model is told: its value as text, or the error.

    A step's function: what it returns is journaled, errors included (3.x reported a raising
    tool to the model and carried on; re-running it on a later round would repeat its side
    effects). A `ToolError`'s message always reaches the model; another exception's only
    without `mask_error_details`.
    """
    try:
        value = await _call(tool.fn, arguments)
    except FlowError:
        raise  # the flow's own mistake (a reused key, a journal that diverged): not the model's to hear
    except ToolError as exc:
        logger.info("sampling tool %r raised ToolError: %s", tool.name, exc)
        return {"text": str(exc), "error": True}
    except Exception as exc:
        logger.warning(
            "sampling tool %r raised %s: %s",
            tool.name,
            type(exc).__name__,
            exc,
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )
        text = f"Error executing tool '{tool.name}'" if mask else f"Error executing tool '{tool.name}': {exc}"
        return {"text": text, "error": True}
    return {"text": str(value), "error": False}


async def _call(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(**arguments)
    # A plain function runs in a worker thread (as a step's does), so concurrent calls overlap.
    value = await asyncio.to_thread(fn, **arguments)
    return await value if inspect.isawaitable(value) else value


def _result(call: ToolUseContent, text: str, *, error: bool) -> ToolResultContent:
    return ToolResultContent(
        tool_use_id=call.id, content=[TextContent(type="text", text=text)], is_error=True if error else None
    )


def _unwrap(tool: Tool, result: Any) -> Any:
    """A FastMCP tool's `ToolResult` as the plain value 3.x handed the model: structured content (unwrapped
    from `{"result": ...}` when the tool wraps it), else the first text block."""
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        wrapped = bool(tool.output_schema and tool.output_schema.get("x-fastmcp-wrap-result"))
        return structured.get("result") if wrapped else structured
    content = getattr(result, "content", None) or []
    if content and isinstance(content[0], TextContent):
        return content[0].text
    return result


# -- inputs --------------------------------------------------------------------------------------


def prepare_messages(messages: str | Sequence[str | SamplingMessage]) -> list[SamplingMessage]:
    """3.x's message forms: a string, or strings (user turns) and `SamplingMessage`s."""
    if isinstance(messages, str):
        messages = [messages]
    return [
        m if isinstance(m, SamplingMessage) else SamplingMessage(role="user", content=TextContent(type="text", text=m))
        for m in messages
    ]


def prepare_tools(tools: SamplingTools | None) -> list[SamplingTool]:
    prepared: list[SamplingTool] = []
    for tool in tools or ():
        if isinstance(tool, SamplingTool):
            prepared.append(tool)
        elif isinstance(tool, Tool) or callable(tool):
            prepared.append(_converted(tool))
        else:
            raise TypeError(f"tools= takes SamplingTools, FastMCP tools or functions, not {type(tool).__name__}")
    names = [tool.name for tool in prepared]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"two sampling tools are named {duplicated[0]!r}: the model could not tell them apart")
    return prepared


_conversions: weakref.WeakKeyDictionary[Any, SamplingTool] = weakref.WeakKeyDictionary()


def _converted(tool: Tool | Callable[..., Any]) -> SamplingTool:
    """A function's or FastMCP tool's `SamplingTool`, made once: every replay of the loop prepares
    its tools again, and deriving a schema from a signature costs far more than the rest of a round."""
    try:
        return _conversions[tool]
    except (KeyError, TypeError):
        pass
    converted = SamplingTool.from_tool(tool) if isinstance(tool, Tool) else SamplingTool.from_function(tool)
    with contextlib.suppress(TypeError):  # not weakly referenceable: converted again next time
        _conversions[tool] = converted
    return converted


def _tool_choice(tool_choice: str | None) -> ToolChoice | None:
    if tool_choice is None:
        return None
    if tool_choice not in ("auto", "required", "none"):
        raise ValueError(f"Invalid tool_choice: {tool_choice!r}. Must be 'auto', 'required', or 'none'.")
    return ToolChoice(mode=cast(ToolChoiceOption, tool_choice))


def preferences(preferences: ModelPreferences | str | list[str] | None) -> ModelPreferences | None:
    """3.x's shorthands: a model name, or names, as hints."""
    if preferences is None or isinstance(preferences, ModelPreferences):
        return preferences
    names = [preferences] if isinstance(preferences, str) else list(preferences)
    if not all(isinstance(name, str) for name in names):
        raise ValueError("model_preferences takes a ModelPreferences, a model name, or a list of model names")
    return ModelPreferences(hints=[ModelHint(name=name) for name in names])


def _blocks(response: CreateMessageResult | CreateMessageResultWithTools) -> list[Any]:
    content = response.content
    return list(content) if isinstance(content, list) else [content]


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "SampleStep",
    "SamplingResult",
    "SamplingTool",
    "ToolChoiceOption",
    "ToolOutcome",
    "sample",
    "sample_step",
]
