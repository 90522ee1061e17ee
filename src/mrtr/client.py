"""Client side: drive a multi round-trip call to completion, round by round, in the open.

The official `mcp.Client` already retries `input_required` results for you. `FlowClient`
does the same with the client rules of MCP 2026-07-28 spelled out and observable — the
`requestState` echoed byte for byte and only when one was given, every retry a new
request, a missing `resultType` taken as complete, nothing leaking into other calls — and
reports each round to an `on_round` hook (for progress displays, logs and tests). Its
answer handlers also serve legacy servers, which ask through server→client requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as t
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mrtr.task_client import CreatedTask, TasksClient, TaskSnapshot, as_wire, cancel_task, follow_task

ElicitHandler = Callable[[t.ElicitRequestParams], Awaitable[t.ElicitResult]]
SampleHandler = Callable[[t.CreateMessageRequestParams], Awaitable[t.CreateMessageResult]]
RootsHandler = Callable[[], Awaitable[Sequence[t.Root] | t.ListRootsResult]]

_RESULT_MODELS: dict[str, type[t.Result]] = {
    "tools/call": t.CallToolResult,
    "prompts/get": t.GetPromptResult,
    "resources/read": t.ReadResourceResult,
}

# A server that sheds load answers with state only; back off a little before retrying.
_STATE_ONLY_DELAYS = (0.0, 0.05, 0.1, 0.25)


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
    answered: dict[str, Any]
    had_state: bool


@dataclass
class FlowClient:
    """An `mcp.Client` plus explicit, observable MRTR round driving.

    Example:
        async with FlowClient(url, elicit=ask_user, sample=call_llm) as flows:
            result = await flows.call_tool("deploy", {"service": "api"})
    """

    server: Any
    elicit: ElicitHandler | None = None
    sample: SampleHandler | None = None
    roots: RootsHandler | None = None
    mode: str = "auto"
    max_rounds: int = 10
    on_round: Callable[[Round], Awaitable[None] | None] | None = None
    tasks: bool = False
    """Declare the tasks extension: a server may then answer with a durable task, followed here."""
    on_task: Callable[[TaskSnapshot], Awaitable[None] | None] | None = None
    """Called with each new status of a task this client follows (for progress displays)."""
    client_options: dict[str, Any] = field(default_factory=dict)
    _client: Client | None = field(init=False, default=None)

    async def __aenter__(self) -> FlowClient:
        options = dict(self.client_options)
        if self.tasks:
            options["extensions"] = [*options.get("extensions", ()), TasksClient(self._answer, on_status=self.on_task)]
        self._client = Client(
            self.server,
            mode=self.mode,
            elicitation_callback=self._on_elicit if self.elicit else None,
            sampling_callback=self._on_sample if self.sample else None,
            list_roots_callback=self._on_roots if self.roots else None,
            **options,
        )
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._client is not None:
            await self._client.__aexit__(*exc)

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("use `async with FlowClient(...)` first")
        return self._client

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> t.CallToolResult:
        params = {"name": name, "arguments": arguments}
        result = await self._drive("tools/call", name, lambda r, s: self._send("tools/call", params, r, s))
        if isinstance(result, CreatedTask):  # MRTR rounds are over; the rest is a durable task
            return await follow_task(self.client.session, result.task_id, self._answer, on_status=self.on_task)
        return result

    async def cancel_task(self, task_id: str) -> None:
        """Ask the server to cancel a task (cooperative; poll to see it end)."""
        await cancel_task(self.client.session, task_id)

    async def get_prompt(self, name: str, arguments: dict[str, str] | None = None) -> t.GetPromptResult:
        params = {"name": name, "arguments": arguments}
        return await self._drive("prompts/get", name, lambda r, s: self._send("prompts/get", params, r, s))

    async def read_resource(self, uri: str) -> t.ReadResourceResult:
        params = {"uri": uri}
        return await self._drive("resources/read", uri, lambda r, s: self._send("resources/read", params, r, s))

    async def _send(
        self, method: str, params: dict[str, Any], responses: dict[str, Any] | None, state: str | None
    ) -> Any:
        """One request of the exchange, sent as a fresh request (new JSON-RPC id) every time.

        On 2026-07-28 the result is read by the spec's client rules rather than the SDK's
        typed parser, which rejects a result without `resultType` (the spec: MUST treat it
        as complete). Uses the session's own envelope stamp and dispatcher, so `_meta`,
        routing headers and transport behave exactly as for the SDK's own calls.
        """
        wire = {k: v for k, v in params.items() if v is not None}
        if responses:
            wire["inputResponses"] = {k: as_wire(v) for k, v in responses.items()}
        if state is not None:
            wire["requestState"] = state  # echoed exactly, and only when the server sent one
        session = self.client.session
        if self.client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await self._send_legacy(method, params)
        data: dict[str, Any] = {"method": method, "params": wire}
        options: dict[str, Any] = {}
        session._stamp(data, options)  # type: ignore[arg-type]
        raw = await session._dispatcher.send_raw_request(method, data["params"], options)
        return _parse_result(method, dict(raw))

    async def _send_legacy(self, method: str, params: dict[str, Any]) -> Any:
        # Legacy servers ask through server->client requests (answered by our callbacks).
        session = self.client.session
        if method == "tools/call":
            return await session.call_tool(params["name"], params.get("arguments"))
        if method == "prompts/get":
            return await session.get_prompt(params["name"], params.get("arguments"))
        return await session.read_resource(params["uri"])

    async def _drive(self, method: str, target: str, send: Callable[..., Awaitable[Any]]) -> Any:
        result = await send(None, None)
        state_only = 0
        for number in range(1, self.max_rounds + 1):
            if not isinstance(result, t.InputRequiredResult):
                return result
            asked = dict(result.input_requests or {})
            if asked:
                state_only = 0
                answered = await self._answer_all(asked)
            else:
                await asyncio.sleep(_STATE_ONLY_DELAYS[min(state_only, len(_STATE_ONLY_DELAYS) - 1)])
                state_only += 1
                answered = {}
            if self.on_round is not None:
                hook = self.on_round(Round(number, method, target, asked, answered, result.request_state is not None))
                if hook is not None:
                    await hook
            # The state goes back exactly as received, and only if there was one.
            result = await send(answered or None, result.request_state)
        if isinstance(result, t.InputRequiredResult):
            raise RoundLimitExceeded(f"{method} {target!r} still needed input after {self.max_rounds} rounds")
        return result

    async def _answer_all(self, asked: dict[str, t.InputRequest]) -> dict[str, Any]:
        keys = list(asked)
        answers = await asyncio.gather(*(self._answer(asked[k]) for k in keys))
        return dict(zip(keys, answers, strict=True))

    async def _answer(self, request: t.InputRequest) -> Any:
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
        assert self.elicit is not None
        return await self.elicit(params)

    async def _on_sample(
        self, context: ClientRequestContext, params: t.CreateMessageRequestParams
    ) -> t.CreateMessageResult:
        assert self.sample is not None
        return await self.sample(params)

    async def _on_roots(self, context: ClientRequestContext | None) -> t.ListRootsResult:
        assert self.roots is not None
        listed = await self.roots()
        return listed if isinstance(listed, t.ListRootsResult) else t.ListRootsResult(roots=list(listed))


def _parse_result(method: str, raw: dict[str, Any]) -> Any:
    """Read a result by the client rules: absent `resultType` is complete, unknown ones invalid."""
    kind = raw.setdefault("resultType", "complete")
    if kind == "input_required":
        return t.InputRequiredResult.model_validate(raw, by_name=False)
    if kind == "task" and method == "tools/call":
        return CreatedTask.model_validate(raw, by_name=False)
    if kind != "complete":
        raise ValueError(f"server answered {method} with unknown resultType {kind!r}")
    return _RESULT_MODELS[method].model_validate(raw, by_name=False)


__all__ = ["FlowClient", "InputAbandoned", "Round", "RoundLimitExceeded"]
