"""`FlowContext`: what a flow function awaits to ask the client or run a side effect.

The same methods work in both protocol eras. Under 2026-07-28 they are served from the
journal (or park the flow until the client answers); under 2025-11-25 and earlier they
become ordinary server-to-client requests through the SDK session, and steps simply run.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from datetime import timedelta
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, ParamSpec, Protocol, TypeVar, cast, overload

from mcp_types import (
    AudioContent,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ImageContent,
    IncludeContext,
    ListRootsResult,
    ModelPreferences,
    Root,
    SamplingMessage,
    TextContent,
    Tool,
    ToolChoice,
)
from pydantic import BaseModel, TypeAdapter

from mrtr._engine.asks import Ask, Capability, FormAnswer, elicit_ask, elicit_url_ask, form_ask, roots_ask, sample_ask
from mrtr._engine.progress import ProgressSink
from mrtr._engine.steps import StepInfo, current_step, typed_result
from mrtr._engine.waits import WaitState, check_event_name, seconds
from mrtr._errors import Cancelled, Declined, EventTimeout, FlowDefinitionError
from mrtr._wire import JSONObject

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

logger = logging.getLogger("mrtr.context")

F = TypeVar("F", bound=Callable[..., Any])


def tracked(method: F) -> F:
    """Remember the coroutine each call of an async `ctx` method makes, so one never awaited is caught.

    `url = ctx.callback_url("ci")` (no `await`) hands the flow a coroutine object where it
    expects a URL: nothing was minted, and Python says so only as a warning when the object
    is collected, if ever. The flow's context keeps a reference to every such coroutine
    (`FlowContext.unawaited`): when the flow ends, or a step is handed one, a coroutine still
    unstarted is an error naming the call. Keeping the reference also stops Python's own
    warning from firing in some other place and time. Every replay makes these calls again,
    so the bookkeeping is one append, and finished coroutines are let go in batches.
    """

    @functools.wraps(method)
    def call(self: FlowContext, /, *args: Any, **kwargs: Any) -> Any:
        coro = method(self, *args, **kwargs)
        made = self._made
        made.append(coro)
        if len(made) > self._prune_at:
            self.prune()
        return coro

    return cast(F, call)


def tracked_form(method: F) -> F:
    """`tracked` spelled out for `elicit`'s own parameters.

    Every replayed answer passes through `ctx.elicit`; a wrapper taking `*args, **kwargs`
    packs and unpacks them on each call, which costs about as much as the rest of the
    bookkeeping of a replayed answer.
    """

    @functools.wraps(method)
    def call(
        self: FlowContext, message: str, schema: Any, *, key: str | None = None, allow_preanswer: bool = False
    ) -> Any:
        coro = method(self, message, schema, key=key, allow_preanswer=allow_preanswer)
        made = self._made
        made.append(coro)
        if len(made) > self._prune_at:
            self.prune()
        return coro

    return cast(F, call)


def tracked_by_flow(method: F) -> F:
    """`tracked` for an adapter's context (`mrtr.fastmcp.FlowsContext`): remembered by its `.flow`."""

    @functools.wraps(method)
    def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        coro = method(self, *args, **kwargs)
        self.flow.remember(coro)
        return coro

    return cast(F, call)


def _module_tracked(function: F) -> F:
    """`tracked` for `mrtr.step` / `mrtr.gather`: remembered by the running flow's context, if any."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        coro = function(*args, **kwargs)
        flow = current_flow_context.get()
        if flow is not None:
            flow.remember(coro)
        return coro

    return cast(F, call)


def _handed_a_coroutine(name: str, value: Coroutine[Any, Any, Any]) -> NoReturn:
    call = describe_call(value)
    value.close()
    raise FlowDefinitionError(
        f"step {name!r} was handed {call}, a coroutine: that call was never awaited, so it did "
        f"nothing; write `await {call}` and pass its value"
    )


def describe_call(coro: Any) -> str:
    """`ctx.callback_url('ci')`: how a flow wrote the call that made `coro` (its first argument shown)."""
    code = coro.cr_code
    frame = coro.cr_frame
    names = code.co_varnames[: code.co_argcount]  # positional: how calls are written
    values = frame.f_locals if frame is not None else {}
    owner = "ctx" if names[:1] == ("self",) else "mrtr"
    shown = [name for name in names if name != "self"][:1]
    first = repr(values[shown[0]]) if shown and shown[0] in values else ""
    first = first if len(first) <= 40 else first[:37] + "..."
    return f"{owner}.{code.co_name}({first})"


_SAMPLING_ANSWER = TypeAdapter[Any](cast(Any, CreateMessageResult | CreateMessageResultWithTools))

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
    progress: ProgressSink | None
    """A durable task's status message (None: progress goes to the request, if any)."""

    def supports(self, capability: Capability) -> bool: ...

    def replaying(self) -> bool:
        """Whether the calling branch is before the journal's frontier (re-running what ran before)."""
        ...

    async def ask(self, ask: Ask) -> tuple[str, Any]:
        """The wire key of `ask` and its journaled/received answer (validated by `Ask.accept`)."""
        ...

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """The step's result as JSON (journaled, or freshly computed and journaled)."""
        ...

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new path of a code change named `patch_id`."""
        ...

    async def continue_as_task(self) -> None:
        """Hand over to a durable task here, if this call is becoming one."""
        ...

    async def wait(self, kind: Literal["timer", "event"], name: str | None, limit: float | None) -> WaitState:
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
        self._made: list[Coroutine[Any, Any, Any]] = []
        self._prune_at = 64
        # A journal driver splits an ask in two (`JournalDriver.recall`, `.wait_answer`):
        # a replayed answer, the common case, then needs no coroutine of the driver's.
        recall = getattr(driver, "recall", None)
        self._recall: Callable[[Ask], tuple[str, Any]] | None = recall
        self._wait_answer: Callable[[str, Ask], Awaitable[Any]] | None = getattr(driver, "wait_answer", None)
        if self._wait_answer is None:
            self._recall = None

    # -- coroutines never awaited (see `tracked`) --------------------------------------------

    def remember(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Keep `coro`, made by a `ctx` call, until it has started (see `tracked`)."""
        self._made.append(coro)
        if len(self._made) > self._prune_at:
            self.prune()

    def prune(self) -> None:
        """Let go of finished coroutines (no frame left); keep the rest for `unawaited`."""
        made = self._made
        made[:] = [c for c in made if getattr(c, "cr_frame", None) is not None]
        self._prune_at = max(64, 2 * len(made))

    def unawaited(self) -> list[str]:
        """The calls whose coroutines never started (each closed now, so Python does not warn again)."""
        calls = []
        for coro in self._made:
            # A finished coroutine (most: one per replayed ask) has no frame: skip the full test.
            if getattr(coro, "cr_frame", None) is not None and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                calls.append(describe_call(coro))
                coro.close()
        self._made.clear()
        return calls

    def check_awaited(self, flow: str, error: BaseException | None) -> None:
        """At the flow's end: a `ctx` call never awaited is the bug to report (also when it led to `error`).

        Raises:
            FlowDefinitionError: Naming the call and what to write instead.
        """
        calls = self.unawaited()
        if not calls:
            return
        raise FlowDefinitionError(
            f"flow {flow!r}: {', '.join(calls)} was never awaited, so it did nothing (the flow got a coroutine "
            f"object, not its value); write `await {calls[0]}`"
        ) from error

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

    @tracked_form
    async def elicit(
        self, message: str, schema: type[M], *, key: str | None = None, allow_preanswer: bool = False
    ) -> M:
        """Ask the user to fill a form; returns the validated model.

        Raises:
            Declined: The user declined.
            Cancelled: The user dismissed the form.
        """
        ask = elicit_ask(message, schema, key, allow_preanswer)
        recall = self._recall
        if recall is not None:  # inlined `driver.ask` (see `__init__`)
            wire_key, answer = recall(ask)
            if answer is None:
                assert self._wait_answer is not None
                answer = await self._wait_answer(wire_key, ask)
        else:
            wire_key, answer = await self._driver.ask(ask)
        if answer.get("action") != "accept":  # the usual answer needs no call to find that out
            _raise_if_refused(answer, message, wire_key)
        model: M = ask.parse(answer["content"])
        return model

    @tracked
    async def ask_form(
        self,
        message: str,
        schema: JSONObject,
        validate: Callable[[JSONObject], object],
        *,
        key: str | None = None,
    ) -> FormAnswer:
        """Ask a form whose JSON schema is already rendered; returns the answer as journaled.

        `{"action": "accept", "content": {...}}` (content that passed `validate`), or
        `{"action": "decline"}` / `{"action": "cancel"}`: a refusal is returned, not raised.
        For adapters such as `mrtr.fastmcp`; flows use `elicit`.
        """
        ask = form_ask(message, schema, validate, key)
        recall = self._recall
        if recall is not None:  # inlined `driver.ask`, as in `elicit`
            wire_key, answer = recall(ask)
            if answer is None:
                assert self._wait_answer is not None
                answer = await self._wait_answer(wire_key, ask)
        else:
            _, answer = await self._driver.ask(ask)
        return cast(FormAnswer, dict(answer))

    @tracked
    async def elicit_url(self, message: str, url: str, *, key: str | None = None) -> None:
        """Send the user to `url` (URL-mode elicitation). Returns once they consent.

        Acceptance is consent only: the interaction itself happens out of band, so check
        its outcome afterwards (typically in a step keyed by `ctx.flow_id`).
        """
        wire_key, answer = await self._driver.ask(elicit_url_ask(message, url, key))
        _raise_if_refused(answer, message, wire_key)

    @overload
    async def sample(
        self,
        prompt: str | Sequence[SamplingMessage | Mapping[str, Any]],
        *,
        max_tokens: int,
        system_prompt: str | None = None,
        temperature: float | None = None,
        stop_sequences: list[str] | None = None,
        model_preferences: ModelPreferences | None = None,
        include_context: IncludeContext | None = None,
        metadata: JSONObject | None = None,
        tools: None = None,
        tool_choice: None = None,
        key: str | None = None,
        allow_preanswer: bool = False,
    ) -> CreateMessageResult: ...
    @overload
    async def sample(
        self,
        prompt: str | Sequence[SamplingMessage | Mapping[str, Any]],
        *,
        max_tokens: int,
        system_prompt: str | None = None,
        temperature: float | None = None,
        stop_sequences: list[str] | None = None,
        model_preferences: ModelPreferences | None = None,
        include_context: IncludeContext | None = None,
        metadata: JSONObject | None = None,
        tools: Sequence[Tool],
        tool_choice: ToolChoice | None = None,
        key: str | None = None,
        allow_preanswer: bool = False,
    ) -> CreateMessageResultWithTools: ...

    @tracked
    async def sample(
        self,
        prompt: str | Sequence[SamplingMessage | Mapping[str, Any]],
        *,
        max_tokens: int,
        system_prompt: str | None = None,
        temperature: float | None = None,
        stop_sequences: list[str] | None = None,
        model_preferences: ModelPreferences | None = None,
        include_context: IncludeContext | None = None,
        metadata: JSONObject | None = None,
        tools: Sequence[Tool] | None = None,
        tool_choice: ToolChoice | None = None,
        key: str | None = None,
        allow_preanswer: bool = False,
    ) -> CreateMessageResult | CreateMessageResultWithTools:
        """Ask the client's LLM for a completion (`sampling/createMessage`).

        With `tools` (which needs the client's `sampling.tools` capability) the answer is a
        `CreateMessageResultWithTools`: its content may be a list of blocks, `tool_use` ones
        among them. Without, a `CreateMessageResult` of one block, as the SDK's
        `create_message` returns. A one-block list is taken as that block.

        Raises:
            MalformedAnswer: The client's answer is not a valid sampling result (-32602).
            TypeError: Without `tools`, the client answered with several blocks or a tool call.
        """
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
            tools=list(tools) if tools is not None else None,
            tool_choice=tool_choice,
        )
        result = await self.create_message(params, key=key, allow_preanswer=allow_preanswer)
        if tools is not None:
            return CreateMessageResultWithTools.model_validate(result.model_dump(by_alias=True))
        if isinstance(result, CreateMessageResult):
            return result
        content = result.content_as_list
        if len(content) == 1 and isinstance(content[0], TextContent | ImageContent | AudioContent):
            return CreateMessageResult(
                role=result.role, content=content[0], model=result.model, stop_reason=result.stop_reason
            )
        kinds = ", ".join(block.type for block in content) or "no blocks"
        raise TypeError(
            f"the client answered a sampling request without tools with {kinds}, which a CreateMessageResult cannot "
            "hold; call ctx.create_message(...) (or ctx.sample(..., tools=[...])) to take any valid answer"
        )

    @tracked
    async def create_message(
        self, params: CreateMessageRequestParams, *, key: str | None = None, allow_preanswer: bool = False
    ) -> CreateMessageResult | CreateMessageResultWithTools:
        """One `sampling/createMessage` with exactly these params; any answer its protocol version allows.

        The SDK's model of the answer: `CreateMessageResult` for one text, image or audio
        block, else `CreateMessageResultWithTools` (lists, `tool_use`). Tools in `params`
        need the client's `sampling.tools` capability. For adapters (`mrtr.fastmcp`'s tool
        loop) and flows that take whatever the model sends; most flows call `sample`.
        """
        _, answer = await self._driver.ask(sample_ask(params, key, allow_preanswer))
        parsed: CreateMessageResult | CreateMessageResultWithTools = _SAMPLING_ANSWER.validate_python(answer)
        return parsed

    @tracked
    async def sample_text(
        self,
        prompt: str | Sequence[SamplingMessage | Mapping[str, Any]],
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

    @tracked
    async def list_roots(self, *, key: str | None = None, allow_preanswer: bool = False) -> list[Root]:
        """The client's roots (`roots/list`)."""
        _, answer = await self._driver.ask(roots_ask(key, allow_preanswer))
        return ListRootsResult.model_validate(answer).roots

    @overload
    async def step(self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    @overload
    async def step(self, name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    @tracked
    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` at most once per flow and journal its result.

        Replays return the journaled value. The value is what a JSON round trip of the
        result gives back, validated against `fn`'s return annotation when it has one,
        on the first run as on every replay, so both behave the same. A step that raises
        is not journaled: the error propagates, and a later round runs the step again. A
        value that does not match the annotation raises `mrtr.StepResultError` (a `ToolError`).
        Inside `fn`, `mrtr.current_step().idempotency_key` names this step stably.
        """
        # Every replayed step passes here: a type test per argument, not a call (a coroutine's
        # type cannot be subclassed, so this is `inspect.iscoroutine`).
        for value in args:
            if type(value) is CoroutineType:
                _handed_a_coroutine(name, value)
        if kwargs:
            for value in kwargs.values():
                if type(value) is CoroutineType:
                    _handed_a_coroutine(name, value)
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

    @tracked
    async def continue_as_task(self) -> None:
        """Mark where a task-enabled flow stops asking inline and continues as a durable task.

        Asks before this point are ordinary MRTR rounds of the `tools/call`; from here the
        call returns a task and the rest runs on a worker (SEP-2663's composition rule). A
        task-enabled flow also switches at its first step or at its end. Outside a call
        that is becoming a task (no task support, or the client did not opt in) it does
        nothing.
        """
        await self._driver.continue_as_task()

    @tracked
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

    @tracked
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

    @tracked
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

    @tracked
    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Say how far the flow has got: the same call inline and in a durable task.

        Inline, it is the request's progress notification (sent when the client asked for
        progress with a token), as the SDK's and FastMCP's `report_progress`. In a durable
        task, `message` (else "`progress` of `total`") becomes the task's `statusMessage`,
        shown by `tasks/get`, `notifications/tasks`, `mrtr tasks show` and the console;
        reports in a quick succession are coalesced, the latest written at most twice a
        second. Nothing is journaled: a replay (the next round, a task resumed elsewhere)
        does not report again what was reported before the point it resumes from.
        """
        driver = self._driver
        if driver.replaying():
            return
        sink = driver.progress
        if sink is not None:
            sink.report(progress, total, message)
        elif self._request is not None:
            await self._request.report_progress(progress, total, message)

    @tracked
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

    @tracked
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


@_module_tracked
async def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`ctx.step(...)` of the running flow: for flows that take FastMCP's `Context`, not a `FlowContext`."""
    return await current_flow().step(name, fn, *args, **kwargs)


@_module_tracked
async def gather(*aws: Awaitable[Any]) -> list[Any]:
    """`ctx.gather(...)` of the running flow: every unanswered ask goes out in one round."""
    return await current_flow().gather(*aws)


def _raise_if_refused(answer: Mapping[str, Any], message: str, key: str) -> None:
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
