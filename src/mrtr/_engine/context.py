"""`FlowContext`: what a flow function awaits to ask the client or run a side effect.

The same methods work in both protocol eras. Under 2026-07-28 they are served from the
journal (or park the flow until the client answers); under 2025-11-25 and earlier they
become ordinary server-to-client requests through the SDK session, and steps simply run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    IncludeContext,
    ListRootsResult,
    ModelPreferences,
    Root,
    SamplingMessage,
    TextContent,
)
from pydantic import BaseModel

from mrtr._engine.asks import Ask, Capability, elicit_ask, elicit_url_ask, form_ask, roots_ask, sample_ask
from mrtr._engine.steps import StepInfo, current_step, typed_result
from mrtr._engine.waits import check_event_name, seconds
from mrtr._errors import Cancelled, Declined, EventTimeout

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

logger = logging.getLogger("mrtr.context")

M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")
T = TypeVar("T")
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
T4 = TypeVar("T4")
T5 = TypeVar("T5")


class Driver(Protocol):
    """How asks and steps are served: from a journal (stateless rounds) or live (legacy)."""

    flow_id: str

    def supports(self, capability: Capability) -> bool: ...

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        """The wire key of `ask` and its journaled/received answer (validated by `Ask.accept`)."""
        ...

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The step's result as JSON (journaled, or freshly computed and journaled)."""
        ...

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new path of a code change named `patch_id`."""
        ...

    async def continue_as_task(self) -> None:
        """Hand over to a durable task here, if this call is becoming one."""
        ...

    async def wait(self, kind: Literal["timer", "event"], name: str | None, limit: float | None) -> dict[str, Any]:
        """A durable timer or event wait's journaled outcome (see `mrtr._engine.waits`)."""
        ...

    async def callback_url(self, name: str, ttl: float) -> str:
        """A journaled URL that delivers event `name` to this task."""
        ...


class FlowContext:
    """Handed to every flow function. Asks and steps are the only non-deterministic doors.

    The determinism contract: a flow re-runs from the top every round, so code between
    awaits on this object must compute the same thing every time. Anything that reads
    a clock, a random source, or the outside world goes through `ctx.step`.
    """

    def __init__(self, driver: Driver, request: Context[Any, Any] | None) -> None:
        self._driver = driver
        self._request = request

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """`FlowContext` is never an argument: reached only when a flow is registered the SDK's way."""
        raise TypeError(
            "a mrtr.FlowContext parameter only works in a flow: register the function with @flows.tool() "
            "(or @flows.prompt() / @flows.resource(), where flows = mrtr.Flows(server)), not @server.tool()"
        )

    @property
    def flow_id(self) -> str:
        """Unique per flow, stable across its rounds: use it to correlate out-of-band work."""
        return self._driver.flow_id

    @property
    def request(self) -> Context[Any, Any]:
        """The SDK's per-request `Context` (headers, session, lifespan) for this round."""
        if self._request is None:
            raise RuntimeError("this flow runs outside an MCP request")
        return self._request

    def client_supports(self, capability: Capability) -> bool:
        """Whether *this request* declared `capability` (e.g. "elicitation", "sampling", "roots").

        Use it to degrade gracefully; asking for an undeclared capability fails the call
        with -32021 MissingRequiredClientCapability.
        """
        return self._driver.supports(capability)

    async def elicit(
        self, message: str, schema: type[M], *, key: str | None = None, allow_preanswer: bool = False
    ) -> M:
        """Ask the user to fill a form; returns the validated model.

        Raises:
            Declined: The user declined.
            Cancelled: The user dismissed the form.
        """
        wire_key, answer = await self._driver.ask(elicit_ask(message, schema, key, allow_preanswer))
        _raise_if_refused(answer, message, wire_key)
        return schema.model_validate(answer["content"])

    async def ask_form(
        self,
        message: str,
        schema: dict[str, Any],
        validate: Callable[[dict[str, Any]], object],
        *,
        key: str | None = None,
    ) -> dict[str, Any]:
        """Ask a form whose JSON schema is already rendered; returns the answer as journaled.

        `{"action": "accept", "content": {...}}` (content that passed `validate`), or
        `{"action": "decline"}` / `{"action": "cancel"}`: a refusal is returned, not raised.
        For adapters such as `mrtr.fastmcp`; flows use `elicit`.
        """
        _, answer = await self._driver.ask(form_ask(message, schema, validate, key))
        return dict(answer)

    async def elicit_url(self, message: str, url: str, *, key: str | None = None) -> None:
        """Send the user to `url` (URL-mode elicitation). Returns once they consent.

        Acceptance is consent only: the interaction itself happens out of band, so check
        its outcome afterwards (typically in a step keyed by `ctx.flow_id`).
        """
        wire_key, answer = await self._driver.ask(elicit_url_ask(message, url, key))
        _raise_if_refused(answer, message, wire_key)

    async def sample(
        self,
        prompt: str | Sequence[SamplingMessage | dict[str, Any]],
        *,
        max_tokens: int,
        system_prompt: str | None = None,
        temperature: float | None = None,
        stop_sequences: list[str] | None = None,
        model_preferences: ModelPreferences | None = None,
        include_context: IncludeContext | None = None,
        metadata: dict[str, Any] | None = None,
        key: str | None = None,
        allow_preanswer: bool = False,
    ) -> CreateMessageResult:
        """Ask the client's LLM for a completion (`sampling/createMessage`)."""
        if isinstance(prompt, str):
            messages = [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))]
        else:
            messages = [m if isinstance(m, SamplingMessage) else SamplingMessage.model_validate(m) for m in prompt]
        params = CreateMessageRequestParams(
            messages=messages,
            max_tokens=max_tokens,
            system_prompt=system_prompt,
            temperature=temperature,
            stop_sequences=stop_sequences,
            model_preferences=model_preferences,
            include_context=include_context,
            metadata=metadata,
        )
        _, answer = await self._driver.ask(sample_ask(params, key, allow_preanswer))
        return CreateMessageResult.model_validate(answer)

    async def sample_text(
        self,
        prompt: str | Sequence[SamplingMessage | dict[str, Any]],
        *,
        max_tokens: int,
        system_prompt: str | None = None,
        temperature: float | None = None,
        stop_sequences: list[str] | None = None,
        model_preferences: ModelPreferences | None = None,
        key: str | None = None,
    ) -> str:
        """`sample(...)`'s completion as text (what most flows want).

        Raises:
            TypeError: The client answered with non-text content (an image, audio, tool use);
                call `sample` to handle those.
        """
        result = await self.sample(
            prompt,
            max_tokens=max_tokens,
            system_prompt=system_prompt,
            temperature=temperature,
            stop_sequences=stop_sequences,
            model_preferences=model_preferences,
            key=key,
        )
        if not isinstance(result.content, TextContent):
            raise TypeError(f"the client's completion is {result.content.type!r} content, not text; use ctx.sample()")
        return result.content.text

    async def list_roots(self, *, key: str | None = None, allow_preanswer: bool = False) -> list[Root]:
        """The client's roots (`roots/list`)."""
        _, answer = await self._driver.ask(roots_ask(key, allow_preanswer))
        return ListRootsResult.model_validate(answer).roots

    @overload
    async def step(self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    @overload
    async def step(self, name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` at most once per flow and journal its result.

        Replays return the journaled value. The value is what a JSON round trip of the
        result gives back, validated against `fn`'s return annotation when it has one,
        on the first run as on every replay, so both behave the same. A step that raises
        is not journaled: the error propagates, and a later round runs the step again. A
        value that does not match the annotation raises `mrtr.StepResultError` (a `ToolError`).
        Inside `fn`, `mrtr.current_step().idempotency_key` names this step stably.
        """
        value = await self._driver.step(name, fn, args, kwargs)
        return typed_result(name, fn, value)

    def patched(self, patch_id: str) -> bool:
        """Branch around a code change while flows started by the old code are in flight.

        True for a flow that reaches this point under the new code (and from then on, on
        every replay: the decision is journaled); False for a flow whose journal shows the
        old code already went past this point, so it finishes on the old path:

            if ctx.patched("ask-region"):
                region = await ctx.elicit("Which region?", Region)   # new code
            else:
                region = Region(name="eu")                          # what old flows did

        Once no flow started before the change can still be in flight, drop the old branch
        and keep the `patched` call until then. Temporal's `workflow.patched`, for rounds.
        """
        return self._driver.patched(patch_id)

    async def continue_as_task(self) -> None:
        """Mark where a task-enabled flow stops asking inline and continues as a durable task.

        Asks before this point are ordinary MRTR rounds of the `tools/call`; from here the
        call returns a task and the rest runs on a worker (SEP-2663's composition rule). A
        task-enabled flow also switches at its first step or at its end. Outside a call
        that is becoming a task (no task support, or the client did not opt in) it does
        nothing.
        """
        await self._driver.continue_as_task()

    async def sleep(self, delay: float | timedelta) -> None:
        """Wait `delay` (seconds or a `timedelta`) durably, in a task only.

        The task stays `working` and its worker lets go of it; whichever instance is alive
        at the due time carries on, after any restart of the whole fleet. The due time is
        journaled when the flow first gets here, so replays wait for the same moment: a
        sleep is "at least `delay`", to within the fleet's wake-up latency.

        Raises:
            FlowDefinitionError: The flow is not running as a durable task (register it with
                `task="required"`, or `task="optional"` and a client that opts in).
        """
        await self._driver.wait("timer", None, seconds(delay, "ctx.sleep's delay"))

    async def wait_for_event(self, name: str, timeout: float | timedelta | None = None) -> Any:
        """Park the task until event `name` is delivered to it; returns the event's JSON payload.

        Events come from `Flows.send_event(task_id, name, payload)` on any instance, from
        `mrtr tasks event`, or from a POST to `ctx.callback_url(name)`. One that arrived
        before the flow got here is waiting in the task's record and is returned at once;
        each event is consumed by exactly one wait. Waiting for several at once composes
        with `ctx.gather` and `asyncio.wait`.

        Raises:
            EventTimeout: `timeout` (seconds or a `timedelta`, counted from the first time
                the flow got here) passed first.
            FlowDefinitionError: The flow is not running as a durable task.
        """
        check_event_name(name)
        limit = None if timeout is None else seconds(timeout, "wait_for_event's timeout")
        outcome = await self._driver.wait("event", name, limit)
        if outcome.get("timeout"):
            raise EventTimeout(name, limit or 0.0)
        return outcome.get("data")

    async def callback_url(self, name: str, *, expires: float | timedelta = timedelta(days=7)) -> str:
        """An unguessable URL that delivers a POSTed JSON body to this task as event `name`.

        Hand it to an outside system (a CI webhook, a payment provider) and
        `await ctx.wait_for_event(name)`. It lives on `Flows(public_url=...)`, is sealed with
        the server's `RequestStateSecurity` keys, bound to this task, `name` and an expiry
        (`expires` from now), and accepted once: tampered, expired, reused or sent to another
        task's path, it is refused with a 4xx and delivers nothing. Minted once and journaled,
        so every replay returns the same URL.
        """
        check_event_name(name)
        return await self._driver.callback_url(name, seconds(expires, "callback_url's expires"))

    async def checkpoint(self) -> None:
        """Offer a shed point: an overloaded instance may end the round here and hand the
        journal to the client, whose retry carries on (maybe elsewhere). No-op otherwise."""
        shed_point = getattr(self._driver, "shed_point", None)
        if shed_point is not None:
            shed_point()

    @overload
    async def gather(self, a1: Awaitable[T1], /) -> tuple[T1]: ...
    @overload
    async def gather(self, a1: Awaitable[T1], a2: Awaitable[T2], /) -> tuple[T1, T2]: ...
    @overload
    async def gather(self, a1: Awaitable[T1], a2: Awaitable[T2], a3: Awaitable[T3], /) -> tuple[T1, T2, T3]: ...
    @overload
    async def gather(
        self, a1: Awaitable[T1], a2: Awaitable[T2], a3: Awaitable[T3], a4: Awaitable[T4], /
    ) -> tuple[T1, T2, T3, T4]: ...
    @overload
    async def gather(
        self, a1: Awaitable[T1], a2: Awaitable[T2], a3: Awaitable[T3], a4: Awaitable[T4], a5: Awaitable[T5], /
    ) -> tuple[T1, T2, T3, T4, T5]: ...
    @overload
    async def gather(self, *aws: Awaitable[T]) -> list[T]: ...

    async def gather(self, *aws: Awaitable[Any]) -> Any:
        """Await several asks/steps at once; every unanswered ask goes out in one round.

        Results come in order, as a list; typed like `asyncio.gather` (a tuple of each
        awaitable's type for up to five), so `a, b = await ctx.gather(x, y)` is typed.
        """
        return list(await asyncio.gather(*aws))


current_flow_context: ContextVar[FlowContext | None] = ContextVar("mrtr_flow_context", default=None)
"""The `FlowContext` of the flow running in this task (and in the tasks its `gather` starts)."""


def current_flow() -> FlowContext:
    """The `FlowContext` of the running flow, for code that was not handed one."""
    ctx = current_flow_context.get()
    if ctx is None:
        raise RuntimeError(
            "mrtr.step() and mrtr.gather() run inside a flow registered with @flows.tool/prompt/resource"
        )
    return ctx


@overload
async def step(name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
@overload
async def step(name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


async def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`ctx.step(...)` of the running flow: for flows that take FastMCP's `Context`, not a `FlowContext`."""
    return await current_flow().step(name, fn, *args, **kwargs)


async def gather(*aws: Awaitable[Any]) -> list[Any]:
    """`ctx.gather(...)` of the running flow: every unanswered ask goes out in one round."""
    return await current_flow().gather(*aws)


def _raise_if_refused(answer: dict[str, Any], message: str, key: str) -> None:
    action = answer.get("action")
    if action == "decline":
        raise Declined(message, key=key)
    if action == "cancel":
        raise Cancelled(message, key=key)


__all__ = [  # StepInfo, current_step: see mrtr._engine.steps
    "Driver",
    "FlowContext",
    "StepInfo",
    "current_flow",
    "current_flow_context",
    "current_step",
    "gather",
    "step",
]
