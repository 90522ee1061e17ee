"""Client side: drive a multi round-trip call to completion, round by round, in the open.

The official `mcp.Client` already retries `input_required` results for you. `FlowClient`
does the same with the client rules of MCP 2026-07-28 spelled out and observable — the
`requestState` echoed byte for byte and only when one was given, every retry a new
request, a missing `resultType` taken as complete, nothing leaking into other calls — and
reports each round to an `on_round` hook (for progress displays, logs and tests). Its
answer handlers also serve legacy servers, which ask through server→client requests.

It is built for fleets: over HTTP each request is one self-contained POST on mrtr's own
transport (`mrtr.client._transport`: the SDK's streamable HTTP client cancels every call on a
client when one connection breaks), failures stay with their call and come as
`TransportError` (HTTP status attached) rather than `MCPError`, and a round that got no
answer or was shed is resent unchanged, with bounded, jittered backoff.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypedDict, overload

import anyio
import httpx2
import mcp_types as t
from mcp import Client
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mrtr import _sdk as sdk
from mrtr._wire import IDEMPOTENCY_KEY, SHEDDING_EXTENSION, JSONObject
from mrtr.client._connect import SessionWatch, discover
from mrtr.client._tasks import CreatedTask, TasksClient, TaskSnapshot, as_wire, cancel_task, follow_task
from mrtr.client._transport import (
    DEFAULT_TIMEOUT,
    GatewayError,
    LegacySessionRejected,
    LoadShed,
    RetryPolicy,
    RoundTripDispatcher,
    TransportError,
    TransportTimeout,
    resending,
)

ElicitHandler = Callable[[t.ElicitRequestParams], Awaitable[t.ElicitResult]]
SampleHandler = Callable[
    [t.CreateMessageRequestParams], Awaitable[t.CreateMessageResult | t.CreateMessageResultWithTools]
]
RootsHandler = Callable[[], Awaitable[Sequence[t.Root] | t.ListRootsResult]]
Answer = t.ElicitResult | t.CreateMessageResult | t.CreateMessageResultWithTools | t.ListRootsResult
"""A handler's answer to one ask, sent back as its wire JSON (`inputResponses`)."""


class CarrierParams(TypedDict, total=False):
    """The params of a request that may ask for input, as this client first sends it: the
    tool or prompt and its arguments, or the resource; answers and state join on resends."""

    name: str
    arguments: JSONObject | dict[str, str] | None
    uri: str
    _meta: JSONObject


# The callbacks of `mcp.Client`, accepted as they are.
McpElicitCallback = Callable[[Any, t.ElicitRequestParams], Awaitable[t.ElicitResult]]
McpSampleCallback = Callable[
    [Any, t.CreateMessageRequestParams], Awaitable[t.CreateMessageResult | t.CreateMessageResultWithTools]
]
McpRootsCallback = Callable[[Any], Awaitable[t.ListRootsResult]]


_LegacyResult = t.CallToolResult | t.GetPromptResult | t.ReadResourceResult


def _call_key() -> str:
    """A fresh idempotency key for one logical call (128 random bits), the same on all its resends."""
    return secrets.token_urlsafe(16)


_RESULT_MODELS: dict[str, type[t.Result]] = {
    "tools/call": t.CallToolResult,
    "prompts/get": t.GetPromptResult,
    "resources/read": t.ReadResourceResult,
}


class RoundLimitExceeded(RuntimeError):
    """The server kept asking past `max_rounds`."""


class InputAbandoned(RuntimeError):
    """A handler could not or would not answer; per the spec the client simply stops retrying."""


@dataclass(frozen=True)
class Round:
    """One `input_required` answer the client received, and what it sent back."""

    number: int
    method: str
    target: str
    asked: dict[str, t.InputRequest]
    answered: dict[str, Answer]
    had_state: bool


@dataclass
class FlowClient:
    """An MCP client that drives multi round-trip calls to the end, and survives instance death.

    Over HTTP (a URL string) it speaks 2026-07-28 through mrtr's own per-request transport
    (`mrtr.client._transport`): a failure hits only the call it happened to, and a round that got
    no answer (connection refused or reset, HTTP 502/503/504) or was shed (state only, no
    questions) is resent as is — same `requestState`, same answers — with `retry`'s backoff.
    JSON-RPC errors the server sent, and `timeout`s (the server may still be working), are not.
    stdio and in-process servers go through the SDK's `mcp.Client`.

    Example:
        async with FlowClient(url, elicit=ask_user, sample=call_llm) as flows:
            result = await flows.call_tool("deploy", {"service": "api"})
    """

    server: Any
    elicit: ElicitHandler | None = None
    """Answers form and URL elicitations: `async def elicit(params) -> ElicitResult`."""
    sample: SampleHandler | None = None
    """Answers sampling: `async def sample(params) -> CreateMessageResult`."""
    roots: RootsHandler | None = None
    """Lists the client's roots: `async def roots() -> list[Root] | ListRootsResult`."""
    elicitation_callback: McpElicitCallback | None = None
    """Or answer exactly as `mcp.Client` does — the same callables, `(context, params)` — so one
    set of handlers serves `mcp.Client`, `FlowClient` and `TasksClient`. `context` is the
    server's request on legacy sessions, and None when the answer travels in a round."""
    sampling_callback: McpSampleCallback | None = None
    list_roots_callback: McpRootsCallback | None = None
    mode: str = "auto"
    """How to pick the protocol. "auto" (default): over HTTP, probe `server/discover` (transient
    failures resent with `retry`'s backoff) and use 2026-07-28; fall back to the legacy handshake
    only when the server answers that it does not speak it (method not found, invalid request,
    version refused) — never after a transport failure. "legacy": the 2025-11-25 handshake (its
    HTTP session must stay on one instance: sticky or stateful deployments only). "2026-07-28":
    pinned, no probe."""
    max_rounds: int = 25
    """Rounds with questions one inline call may take (25). mrtr's server stops an inline call at 10
    (`Flows(max_rounds=10)`, the official `mcp.Client`'s `input_required_max_rounds`); 25 leaves room
    for a server that raised its cap. With `tasks=True` a call to a tool that can be a task goes on
    past the server's cap as a durable task, whose questions (`tasks/update`) are not counted here."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds each request may take, connect to last byte (30); past it, `TransportTimeout` (not
    resent). Raise it for flows with long steps. On a legacy session it bounds a whole call, time
    spent in the answer handlers included."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Resends per round after transport failures, and consecutive state-only resends."""
    headers: Mapping[str, str] | None = None
    """HTTP headers added to every request (e.g. `Authorization`)."""
    http_client: httpx2.AsyncClient | None = None
    """Over HTTP, your own `httpx2.AsyncClient` (a proxy, mTLS, a custom CA, event hooks, a test
    transport) under mrtr's transport: every retry guarantee above still holds. You own it:
    `FlowClient` neither enters nor closes it. `timeout` still bounds each request."""
    auth: httpx2.Auth | None = None
    """Over HTTP, an `httpx2.Auth` for every request (OAuth with token refresh, signing...)."""
    on_round: Callable[[Round], Awaitable[None] | None] | None = None
    tasks: bool = False
    """Declare the tasks extension: a server may then answer with a durable task, followed here."""
    on_task: Callable[[TaskSnapshot], Awaitable[None] | None] | None = None
    """Called with each new status of a task this client follows (for progress displays)."""
    on_result: Callable[[str, Mapping[str, Any]], None] | None = None
    """Over 2026-07-28 HTTP, called with each JSON-RPC result as it arrives (method, raw result),
    before the session reads it: for wire displays such as `mrtr call`'s."""
    listen: bool = True
    """Follow tasks by listening for `notifications/tasks` where the server offers it (else poll)."""
    sampling_tools: bool = False
    """Declare the client's `sampling.tools` capability: the server may then send `tools` (and
    `toolChoice`) with its sampling requests (FastMCP's `ctx.sample(tools=..., result_type=...)`,
    mrtr's `ctx.sample(tools=...)`), and `sample` may answer with `tool_use` blocks: a
    `CreateMessageResultWithTools` whose `stopReason` is `"toolUse"`. Without it, a server that
    samples with tools fails the call with -32021, naming the capability."""
    client_options: dict[str, Any] = field(default_factory=dict)
    """Extra options for `mcp.Client` (stdio, in-process, legacy HTTP) or `ClientSession` (2026-07-28 HTTP)."""
    _client: Client | None = field(init=False, default=None)
    _session: ClientSession | None = field(init=False, default=None)
    _stack: AsyncExitStack | None = field(init=False, default=None)
    _legacy_http: SessionWatch | None = field(init=False, default=None)
    _task_extension: TasksClient | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        for short, callback in (("elicit", "elicitation_callback"), ("sample", "sampling_callback"),
                                ("roots", "list_roots_callback")):  # fmt: skip
            if getattr(self, short) is not None and getattr(self, callback) is not None:
                raise ValueError(f"give {short}= or {callback}=, not both")
        if self.elicitation_callback is not None:
            self.elicit = partial(self.elicitation_callback, None)
        if self.sampling_callback is not None:
            self.sample = partial(self.sampling_callback, None)
        if self.list_roots_callback is not None:
            self.roots = partial(self.list_roots_callback, None)
        if self.mode not in ("auto", "legacy") and self.mode not in MODERN_PROTOCOL_VERSIONS:
            raise ValueError(
                f"mode must be 'auto', 'legacy' or one of {list(MODERN_PROTOCOL_VERSIONS)}; got {self.mode!r}"
            )
        if self.max_rounds < 1 or self.timeout <= 0:
            raise ValueError("max_rounds must be >= 1 and timeout > 0")
        if self.mode != "legacy" and _is_sdk_http_transport(self.server):
            raise TypeError(
                "FlowClient was given the SDK's streamable HTTP transport, which would bypass mrtr's own: no "
                "resends after a 502 or a reset, and a failed server/discover taken for a legacy server. Give the "
                "URL and your HTTP client instead: FlowClient(url, http_client=httpx2.AsyncClient(...), auth=...)"
            )
        if self.sampling_tools and self.sample is None:
            raise ValueError("sampling_tools=True declares tool use in sampling: give sample= (or sampling_callback=)")
        if (self.http_client is not None or self.auth is not None) and not isinstance(self.server, str):
            raise TypeError("http_client= and auth= apply to a server URL (HTTP), not to stdio or in-process servers")

    async def __aenter__(self) -> FlowClient:
        stack = AsyncExitStack()
        try:
            if isinstance(self.server, str) and self.mode != "legacy":
                modern = await self._open_modern(stack)
                if not modern:  # a definite "no" from the server: start over on the legacy handshake
                    await stack.aclose()
                    await self._open_sdk(stack, "legacy")
            else:
                await self._open_sdk(stack, self.mode)
        except BaseException:
            # Closed without the error: the caller gets it as is, not wrapped in an ExceptionGroup.
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: Any) -> None:
        """Close everything; an error raised in the `async with` body propagates unwrapped."""
        if self._session is not None and self._task_extension is not None and self._task_extension.feed is not None:
            await self._task_extension.feed.close(self._session)
        stack, self._stack, self._session, self._client, self._legacy_http = self._stack, None, None, None, None
        if stack is not None:
            await stack.aclose()

    @property
    def session(self) -> ClientSession:
        """The SDK session underneath (for requests FlowClient has no method for)."""
        if self._session is None:
            raise RuntimeError("use `async with FlowClient(...)` first")
        return self._session

    @property
    def client(self) -> Client:
        """The SDK `Client`, on stdio, in-process and legacy HTTP connections (2026-07-28 HTTP has none)."""
        if self._client is None:
            raise RuntimeError("no mcp.Client on this connection (2026-07-28 over HTTP); use `.session`")
        return self._client

    @property
    def protocol_version(self) -> str | None:
        return self.session.protocol_version

    def _extensions(self) -> list[TasksClient]:
        if not self.tasks:
            return []
        if self._task_extension is None:
            self._task_extension = TasksClient(self._answer, on_status=self.on_task, listen=self.listen)
        return [self._task_extension]

    def _options(self) -> dict[str, Any]:
        """`client_options`, with `sampling_capabilities` declaring tools when `sampling_tools` asks for it."""
        options = dict(self.client_options)
        if self.sampling_tools:
            given = options.get("sampling_capabilities") or t.SamplingCapability()
            options["sampling_capabilities"] = given.model_copy(update={"tools": t.SamplingToolsCapability()})
        return options

    def _callbacks(self) -> dict[str, Any]:
        return {
            "elicitation_callback": self._on_elicit if self.elicit else None,
            "sampling_callback": self._on_sample if self.sample else None,
            "list_roots_callback": self._on_roots if self.roots else None,
        }

    async def _open_sdk(self, stack: AsyncExitStack, mode: str) -> None:
        options = self._options()
        options["extensions"] = [*options.get("extensions", ()), *self._extensions()]
        options.setdefault("read_timeout_seconds", self.timeout)
        server = self.server
        if isinstance(server, str):  # legacy HTTP: watch for instances that do not know our session
            self._legacy_http = watch = SessionWatch()
            if self.http_client is not None:  # the caller's client: hooked while we use it, not closed
                http = self.http_client
                http.headers.update(dict(self.headers or {}))
                http.event_hooks["response"].append(watch.on_response)
                stack.callback(http.event_hooks["response"].remove, watch.on_response)
            else:
                http = httpx2.AsyncClient(
                    headers=dict(self.headers or {}),
                    timeout=httpx2.Timeout(self.timeout, read=max(self.timeout, 300.0)),
                    event_hooks={"response": [watch.on_response]},
                )
                await stack.enter_async_context(http)
            if self.auth is not None:
                http.auth = self.auth
            server = streamable_http_client(server, http_client=http)
        self._client = await stack.enter_async_context(Client(server, mode=mode, **self._callbacks(), **options))
        self._session = self._client.session

    async def _open_modern(self, stack: AsyncExitStack) -> bool:
        """Open a 2026-07-28 session over mrtr's transport; False if the server definitely is legacy."""
        dispatcher = await stack.enter_async_context(
            RoundTripDispatcher(
                self.server,
                timeout=self.timeout,
                headers=self.headers,
                http_client=self.http_client,
                auth=self.auth,
                on_result=self.on_result,
            )
        )
        options = self._options()
        extensions = [*options.pop("extensions", ()), *self._extensions()]
        prior_discover = options.pop("prior_discover", None)
        for client_only in ("read_timeout_seconds", "cache", "raise_exceptions", "input_required_max_rounds"):
            options.pop(client_only, None)  # mcp.Client options with no meaning on this connection
        session = ClientSession(
            dispatcher=dispatcher,
            read_timeout_seconds=self.timeout,
            extensions={SHEDDING_EXTENSION: {}} | {e.identifier: e.settings() for e in extensions},
            result_claims={e.identifier: tuple(e.claims()) for e in extensions if e.claims()} or None,
            notification_bindings=[b for e in extensions for b in e.notifications()] or None,
            **self._callbacks(),
            **options,
        )
        await stack.enter_async_context(session)
        if self.mode == "auto":
            discovered = await discover(session, self.retry)
            if discovered is None:
                return False
        else:
            discovered = prior_discover or t.DiscoverResult(
                supported_versions=[self.mode],
                capabilities=t.ServerCapabilities(),
                result_type="complete",
                ttl_ms=0,
                cache_scope="public",
            )
        session.adopt(discovered)
        self._session = session
        return True

    async def call_tool(self, name: str, arguments: JSONObject | None = None) -> t.CallToolResult:
        """`tools/call`, driven through every round; a task the server starts is followed to its end.

        Raises:
            RoundLimitExceeded: More than `max_rounds` rounds of questions.
            InputAbandoned: A question no handler answers (or a handler gave up).
            TransportError: The server could not be reached, after `retry`'s resends.
            MCPError: An error the server sent.
        """
        params: CarrierParams = {"name": name, "arguments": arguments}
        feed = self._task_extension.feed if self._task_extension is not None else None
        reservation = None
        # One key per logical call, the same on every resend: a server that already created the
        # task for it returns that task instead of a second one, and a first round resent inline
        # (a lost answer, an instance that died mid-round) joins its first copy, whose finished
        # steps never run again. With a feed, the key comes from a batch a listen stream already
        # watches (`mrtr.client._ahead`).
        if self.tasks and feed is not None:
            reservation = feed.reserve(self.session, name)
        key = reservation.key if reservation is not None else _call_key()
        params["_meta"] = {IDEMPOTENCY_KEY: key}
        try:
            result = await self._drive("tools/call", name, params)
            if isinstance(result, CreatedTask):  # MRTR rounds are over; the rest is a durable task
                if feed is not None:
                    feed.makes_tasks(self.session, name)
                return await follow_task(
                    self.session,
                    result.task_id,
                    self._answer,
                    on_status=self.on_task,
                    retry=self.retry,
                    feed=feed,
                    reservation=reservation,
                    created=result,
                )
            return result
        finally:
            if reservation is not None:
                reservation.release()

    async def cancel_task(self, task_id: str) -> None:
        """Ask the server to cancel a task (cooperative; poll to see it end)."""
        await resending(self.retry, lambda: cancel_task(self.session, task_id))

    async def get_prompt(self, name: str, arguments: dict[str, str] | None = None) -> t.GetPromptResult:
        """`prompts/get`, driven through every round (questions answered by the handlers)."""
        params: CarrierParams = {"name": name, "arguments": arguments, "_meta": {IDEMPOTENCY_KEY: _call_key()}}
        return await self._drive("prompts/get", name, params)

    async def read_resource(self, uri: str) -> t.ReadResourceResult:
        """`resources/read`, driven through every round (questions answered by the handlers)."""
        return await self._drive("resources/read", uri, {"uri": uri, "_meta": {IDEMPOTENCY_KEY: _call_key()}})

    async def _send(
        self, method: str, params: CarrierParams, responses: Mapping[str, Answer] | None, state: str | None
    ) -> t.Result:
        """One request of the exchange, sent as a fresh request (new JSON-RPC id) every time.

        On 2026-07-28 the result is read by the spec's client rules rather than the SDK's
        typed parser, which rejects a result without `resultType` (the spec: MUST treat it
        as complete). Uses the session's own envelope stamp and dispatcher, so `_meta`,
        routing headers and transport behave exactly as for the SDK's own calls.
        """
        session = self.session
        if session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await self._send_legacy(method, params)
        wire: JSONObject = {k: v for k, v in params.items() if v is not None}
        wire["_meta"] = dict(wire.get("_meta") or {})  # the stamp adds to it: never share it between sends
        if responses:
            wire["inputResponses"] = {k: as_wire(v) for k, v in responses.items()}
        if state is not None:
            wire["requestState"] = state  # echoed exactly, and only when the server sent one
        raw = await sdk.send_stamped(session, method, {"method": method, "params": wire})
        return _parse_result(method, raw)

    async def _send_legacy(self, method: str, params: CarrierParams) -> _LegacyResult:
        # Legacy servers ask through server->client requests (answered by our callbacks).
        session = self.session
        meta = params.get("_meta")
        call: Callable[[], Awaitable[_LegacyResult]]
        if method == "tools/call":
            call = partial(session.call_tool, params["name"], params.get("arguments"), meta=meta)
        elif method == "prompts/get":
            call = partial(session.get_prompt, params["name"], params.get("arguments"))
        else:
            call = partial(session.read_resource, params["uri"])
        if self._legacy_http is None:
            return await call()
        return await self._legacy_http.guard(call)

    # The complete result's model is `_RESULT_MODELS[method]` (or the legacy SDK call's): one overload each.
    @overload
    async def _drive(
        self, method: Literal["tools/call"], target: str, params: CarrierParams
    ) -> t.CallToolResult | CreatedTask: ...
    @overload
    async def _drive(self, method: Literal["prompts/get"], target: str, params: CarrierParams) -> t.GetPromptResult: ...
    @overload
    async def _drive(
        self, method: Literal["resources/read"], target: str, params: CarrierParams
    ) -> t.ReadResourceResult: ...
    async def _drive(self, method: str, target: str, params: CarrierParams) -> t.Result:
        """Send, answer, resend until complete; transport failures and shed rounds resend the same round."""
        state: str | None = None
        answered: dict[str, Answer] = {}
        asked_rounds = shed = reported = 0
        while True:
            result = await resending(self.retry, partial(self._send, method, params, answered or None, state))
            if not isinstance(result, t.InputRequiredResult):
                return result
            asked = dict(result.input_requests or {})
            if asked:
                asked_rounds += 1
                if asked_rounds > self.max_rounds:
                    raise RoundLimitExceeded(
                        f"{method} {target!r} still needed input after {self.max_rounds} rounds "
                        "(raise FlowClient(max_rounds=...) if the flow legitimately asks more)"
                    )
                shed = 0
                answered = await self._answer_all(asked)
            else:  # load shedding: progress only; resend at once, then back off
                if shed >= self.retry.attempts:
                    raise LoadShed(f"{method} {target!r}: the server shed this call {shed + 1} times", method=method)
                await anyio.sleep(0 if shed == 0 else self.retry.delay(shed - 1))
                shed += 1
                answered = {}
            reported += 1
            if self.on_round is not None:
                hook = self.on_round(Round(reported, method, target, asked, answered, result.request_state is not None))
                if hook is not None:
                    await hook
            state = result.request_state  # back exactly as received, and only if there was one

    async def _answer_all(self, asked: dict[str, t.InputRequest]) -> dict[str, Answer]:
        keys = list(asked)
        answers = await asyncio.gather(*(self._answer(asked[k]) for k in keys))
        return dict(zip(keys, answers, strict=True))

    async def _answer(self, request: t.InputRequest) -> Answer:
        if isinstance(request, t.ElicitRequest):
            if self.elicit is None:
                raise InputAbandoned("the server asked for elicitation, which this client does not handle")
            return await self.elicit(request.params)
        if isinstance(request, t.CreateMessageRequest):
            if self.sample is None:
                raise InputAbandoned("the server asked for sampling, which this client does not handle")
            return await self.sample(request.params)
        if self.roots is None:
            raise InputAbandoned("the server asked for roots, which this client does not handle")
        return await self._on_roots(None)

    # Legacy servers ask through server->client requests: the same handlers answer.

    async def _on_elicit(self, context: ClientRequestContext, params: t.ElicitRequestParams) -> t.ElicitResult:
        if self.elicitation_callback is not None:
            return await self.elicitation_callback(context, params)
        assert self.elicit is not None
        return await self.elicit(params)

    async def _on_sample(
        self, context: ClientRequestContext, params: t.CreateMessageRequestParams
    ) -> t.CreateMessageResult | t.CreateMessageResultWithTools:
        if self.sampling_callback is not None:
            return await self.sampling_callback(context, params)
        assert self.sample is not None
        return await self.sample(params)

    async def _on_roots(self, context: ClientRequestContext | None) -> t.ListRootsResult:
        assert self.roots is not None
        listed = await self.roots()
        return listed if isinstance(listed, t.ListRootsResult) else t.ListRootsResult(roots=list(listed))


def _parse_result(method: str, raw: JSONObject) -> t.Result:
    """Read a result by the client rules: absent `resultType` is complete, unknown ones invalid."""
    kind = raw.setdefault("resultType", "complete")
    if kind == "input_required":
        return t.InputRequiredResult.model_validate(raw, by_name=False)
    if kind == "task" and method == "tools/call":
        return CreatedTask.model_validate(raw, by_name=False)
    if kind != "complete":
        raise ValueError(f"server answered {method} with unknown resultType {kind!r}")
    return _RESULT_MODELS[method].model_validate(raw, by_name=False)


def _is_sdk_http_transport(server: Any) -> bool:
    """Whether `server` is the SDK's streamable HTTP client transport (or its transport class)."""
    from mcp.client.streamable_http import StreamableHTTPTransport

    if isinstance(server, StreamableHTTPTransport):
        return True
    func = getattr(server, "func", None)  # `streamable_http_client(...)` is an async context manager
    return func is not None and func is getattr(streamable_http_client, "__wrapped__", None)


__all__ = [
    "Answer",
    "CarrierParams",
    "FlowClient",
    "GatewayError",
    "InputAbandoned",
    "LegacySessionRejected",
    "LoadShed",
    "RetryPolicy",
    "Round",
    "RoundLimitExceeded",
    "TransportError",
    "TransportTimeout",
]
