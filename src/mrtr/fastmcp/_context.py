"""FastMCP's `Context` for flows written against FastMCP 3.x: `elicit`, `sample`, `list_roots` again.

FastMCP 4.x on 2026-07-28 refuses `ctx.elicit` (no server-initiated requests) and removed
`ctx.sample`, `ctx.sample_step` and `ctx.list_roots`. A flow registered with `mrtr.fastmcp.Flows` that takes
`ctx: fastmcp.Context` receives a `FlowsContext`: the request's own FastMCP `Context` (its
logging, progress, state and request context are FastMCP's) whose three asking methods are
served by mrtr's rounds — the same journal, replay and sealing as `mrtr.FlowContext`.
`sample` and `sample_step` run 3.x's server-side tool loop (`mrtr.fastmcp._sampling`).

`elicit` keeps 3.x's contract by using FastMCP's own code for it: the `response_type` is
rendered by `parse_elicit_response_type`, the answer validated by `handle_elicit_accept`, and
the result is FastMCP's `AcceptedElicitation` / `DeclinedElicitation` / `CancelledElicitation`.
An answer that does not fit is asked again, as for any mrtr form.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any, TypeVar, overload

import fastmcp
from fastmcp import Context
from fastmcp.exceptions import FastMCPDeprecationWarning
from fastmcp.server.elicitation import (
    AcceptedElicitation,
    CancelledElicitation,
    DeclinedElicitation,
    ElicitConfig,
    handle_elicit_accept,
    parse_elicit_response_type,
)
from mcp_types import ModelPreferences, Root, SamplingMessage

from mrtr._engine.context import FlowContext, tracked_by_flow
from mrtr.fastmcp import _sampling as sampling
from mrtr.fastmcp._sampling import SampleStep, SamplingResult, SamplingTool, SamplingTools, ToolChoiceOption

ResultT = TypeVar("ResultT")


class FlowsContext(Context):
    """FastMCP's `Context`, with `elicit`, `sample`, `sample_step` and `list_roots` served by mrtr's rounds."""

    def __init__(self, flow: FlowContext, base: Context) -> None:
        # Not `Context.__init__`: this is the request's own context (same state dict, same
        # session and server), seen through a subclass that asks through the flow.
        self.__dict__.update(base.__dict__)
        self._mrtr_flow = flow

    @property
    def flow(self) -> FlowContext:
        """mrtr's `FlowContext` of this flow (`step`, `gather`, `patched`, `continue_as_task`...)."""
        return self._mrtr_flow

    @tracked_by_flow
    async def elicit(
        self,
        message: str,
        response_type: Any = None,
        *,
        response_title: str | None = None,
        response_description: str | None = None,
    ) -> AcceptedElicitation[Any] | DeclinedElicitation | CancelledElicitation:
        """Ask the user, as FastMCP 3.x's `ctx.elicit` did; refusals are returned, not raised.

        `response_type=None` (3.x's deprecated bare confirmation, refused by FastMCP 4) asks an
        empty form: accepted, the data is `{}`. It warns as 3.x did.
        """
        if response_type is None:
            if fastmcp.settings.deprecation_warnings:
                warnings.warn(
                    "ctx.elicit() without a response_type asks an empty form, which FastMCP deprecated in 3.x and "
                    "removed in 4.0 (some clients show an empty form that cannot be submitted); pass the type you "
                    "expect back, e.g. response_type=bool for a confirmation",
                    FastMCPDeprecationWarning,
                    stacklevel=2,
                )
            if response_title is not None or response_description is not None:
                raise TypeError("response_title and response_description label a field; response_type=None has none")
            config = ElicitConfig(schema={"type": "object", "properties": {}}, response_type=None, is_raw=False)
        else:
            config = parse_elicit_response_type(response_type, response_title, response_description)
        answer = await self._mrtr_flow.ask_form(message, config.schema, partial(handle_elicit_accept, config))
        if answer.get("action") == "accept":
            return handle_elicit_accept(config, answer.get("content") or {})
        if answer.get("action") == "decline":
            return DeclinedElicitation()
        return CancelledElicitation()

    @overload
    async def sample(
        self,
        messages: str | Sequence[str | SamplingMessage],
        *,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        model_preferences: ModelPreferences | str | list[str] | None = None,
        tools: SamplingTools | None = None,
        result_type: type[ResultT],
        mask_error_details: bool | None = None,
        tool_concurrency: int | None = None,
    ) -> SamplingResult[ResultT]: ...
    @overload
    async def sample(
        self,
        messages: str | Sequence[str | SamplingMessage],
        *,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        model_preferences: ModelPreferences | str | list[str] | None = None,
        tools: SamplingTools | None = None,
        result_type: None = None,
        mask_error_details: bool | None = None,
        tool_concurrency: int | None = None,
    ) -> SamplingResult[str]: ...

    @tracked_by_flow
    async def sample(
        self,
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
        """Ask the client's LLM, as FastMCP 3.x's `ctx.sample` did: with `tools`, the model's tool calls run
        here (each once per flow, as a step) until it answers; with `result_type`, its answer is validated.

        Each model turn is a round (see `mrtr.fastmcp._sampling`): a loop of n turns needs a round
        cap of at least n, on the flow and on the client. Tools need the client's `sampling.tools`
        capability (without it the call fails with -32021, naming it).
        """
        return await sampling.sample(
            self._mrtr_flow,
            messages,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            model_preferences=model_preferences,
            tools=tools,
            result_type=result_type,
            mask_error_details=mask_error_details,
            tool_concurrency=tool_concurrency,
        )

    @tracked_by_flow
    async def sample_step(
        self,
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
        """One model turn, as FastMCP 3.x's `ctx.sample_step`: one round, then the tools it called (as steps,
        unless `execute_tools=False`); loop on `step.history` yourself."""
        return await sampling.sample_step(
            self._mrtr_flow,
            messages,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            model_preferences=model_preferences,
            tools=tools,
            tool_choice=tool_choice,
            execute_tools=execute_tools,
            mask_error_details=mask_error_details,
            tool_concurrency=tool_concurrency,
        )

    @tracked_by_flow
    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """FastMCP's `report_progress`, through the flow: inline, the request's progress notification; in a
        durable task, the task's status message (see `mrtr.FlowContext.report_progress`). Not resent on replay."""
        await self._mrtr_flow.report_progress(progress, total, message)

    @tracked_by_flow
    async def list_roots(self) -> list[Root]:
        """The client's roots, as FastMCP 3.x's `ctx.list_roots()` returned them."""
        return await self._mrtr_flow.list_roots()


__all__ = ["FlowsContext", "SampleStep", "SamplingResult", "SamplingTool"]
