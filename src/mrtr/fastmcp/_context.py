"""FastMCP's `Context` for flows written against FastMCP 3.x: `elicit`, `sample`, `list_roots` again.

FastMCP 4.x on 2026-07-28 refuses `ctx.elicit` (no server-initiated requests) and removed
`ctx.sample` and `ctx.list_roots`. A flow registered with `mrtr.fastmcp.Flows` that takes
`ctx: fastmcp.Context` receives a `FlowsContext`: the request's own FastMCP `Context` (its
logging, progress, state and request context are FastMCP's) whose three asking methods are
served by mrtr's rounds — the same journal, replay and sealing as `mrtr.FlowContext`.

`elicit` keeps 3.x's contract by using FastMCP's own code for it: the `response_type` is
rendered by `parse_elicit_response_type`, the answer validated by `handle_elicit_accept`, and
the result is FastMCP's `AcceptedElicitation` / `DeclinedElicitation` / `CancelledElicitation`.
An answer that does not fit is asked again, as for any mrtr form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastmcp import Context
from fastmcp.server.elicitation import (
    AcceptedElicitation,
    CancelledElicitation,
    DeclinedElicitation,
    handle_elicit_accept,
    parse_elicit_response_type,
)
from mcp_types import ModelHint, ModelPreferences, Root, SamplingMessage, TextContent

from mrtr._engine.context import FlowContext

DEFAULT_MAX_TOKENS = 512
"""What FastMCP 3.x asked for when `max_tokens` was not given."""


@dataclass
class SamplingResult:
    """What `ctx.sample(...)` returns, shaped like FastMCP 3.x's: `.text`, `.result`, `.history`."""

    text: str | None
    """The completion's text (None when the client answered with non-text content)."""
    result: Any
    """The same as `text` (3.x put a `result_type`'s parsed value here; that option is not supported)."""
    history: list[SamplingMessage] = field(default_factory=list)
    """The messages sent, then the assistant's answer."""


class FlowsContext(Context):
    """FastMCP's `Context`, with `elicit`, `sample` and `list_roots` served by mrtr's rounds."""

    def __init__(self, flow: FlowContext, base: Context) -> None:
        # Not `Context.__init__`: this is the request's own context (same state dict, same
        # session and server), seen through a subclass that asks through the flow.
        self.__dict__.update(base.__dict__)
        self._mrtr_flow = flow

    @property
    def flow(self) -> FlowContext:
        """mrtr's `FlowContext` of this flow (`step`, `gather`, `patched`, `continue_as_task`...)."""
        return self._mrtr_flow

    async def elicit(
        self,
        message: str,
        response_type: Any = None,
        *,
        response_title: str | None = None,
        response_description: str | None = None,
    ) -> AcceptedElicitation[Any] | DeclinedElicitation | CancelledElicitation:
        """Ask the user, as FastMCP 3.x's `ctx.elicit` did; refusals are returned, not raised."""
        config = parse_elicit_response_type(response_type, response_title, response_description)
        answer = await self._mrtr_flow.ask_form(message, config.schema, partial(handle_elicit_accept, config))
        if answer.get("action") == "accept":
            return handle_elicit_accept(config, answer.get("content") or {})
        if answer.get("action") == "decline":
            return DeclinedElicitation()
        return CancelledElicitation()

    async def sample(
        self,
        messages: str | Sequence[str | SamplingMessage],
        *,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        model_preferences: ModelPreferences | str | list[str] | None = None,
        tools: Any = None,
        result_type: Any = None,
    ) -> SamplingResult:
        """Ask the client's LLM, as FastMCP 3.x's `ctx.sample` did (`tools=` and `result_type=` are not supported)."""
        if tools is not None or result_type is not None:
            raise TypeError(
                "mrtr.fastmcp: ctx.sample(tools=..., result_type=...) is not supported (FastMCP 3.x ran a tool loop "
                "on the server); ask for text and parse it, or call ctx.flow.sample(...) for one completion"
            )
        history = _messages(messages)
        result = await self._mrtr_flow.sample(
            history,
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            system_prompt=system_prompt,
            temperature=temperature,
            model_preferences=_preferences(model_preferences),
        )
        text = result.content.text if isinstance(result.content, TextContent) else None
        answer = SamplingMessage(role="assistant", content=result.content)
        return SamplingResult(text=text, result=text, history=[*history, answer])

    async def list_roots(self) -> list[Root]:
        """The client's roots, as FastMCP 3.x's `ctx.list_roots()` returned them."""
        return await self._mrtr_flow.list_roots()


def _messages(messages: str | Sequence[str | SamplingMessage]) -> list[SamplingMessage]:
    if isinstance(messages, str):
        messages = [messages]
    return [
        m if isinstance(m, SamplingMessage) else SamplingMessage(role="user", content=TextContent(type="text", text=m))
        for m in messages
    ]


def _preferences(preferences: ModelPreferences | str | list[str] | None) -> ModelPreferences | None:
    if preferences is None or isinstance(preferences, ModelPreferences):
        return preferences
    names = [preferences] if isinstance(preferences, str) else list(preferences)
    return ModelPreferences(hints=[ModelHint(name=name) for name in names])


__all__ = ["DEFAULT_MAX_TOKENS", "FlowsContext", "SamplingResult"]
