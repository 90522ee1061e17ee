"""What the CLI sees on the wire besides the results: question keys, state sizes, instances.

`FlowClient` hands its handlers an ask's params, not the key it was filed under, and its
`on_round` hook says whether there was state but not how big it was. A person trying a
flow wants both, so the CLI wraps the SDK transport (HTTP or stdio) in `ObservedTransport`:
it reads every incoming JSON-RPC result on its way to the client, unchanged, and keeps the
keyed `inputRequests` (of an `input_required` round or a task) and the sealed state size.
Over HTTP an httpx response hook also reads the header naming the answering instance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from mrtr import _sdk as sdk
from mrtr._wire import JSONObject


@dataclass
class Ask:
    """One keyed question as the server sent it (wire JSON)."""

    key: str
    request: JSONObject
    used: bool = False

    @property
    def method(self) -> str:
        return str(self.request.get("method", ""))

    @property
    def params(self) -> JSONObject:
        params = self.request.get("params")
        return params if isinstance(params, dict) else {}


@dataclass
class WireView:
    """The latest round as seen on the wire; fed by `ObservedTransport`."""

    on_round: Callable[[WireView], None] | None = None
    rounds: int = 0
    asks: list[Ask] = field(default_factory=list)
    state_bytes: int | None = None
    state: str | None = None
    instance: str | None = None
    instance_header: str = "x-mrtr-instance"

    def observe(self, item: Any) -> None:
        """A message read off an SDK transport (stdio, legacy HTTP)."""
        message = getattr(item, "message", None) if isinstance(item, SessionMessage) else None
        result = getattr(message, "result", None)
        if isinstance(result, dict):
            self.observe_result(result)

    def observe_result(self, result: Mapping[str, Any], method: str | None = None) -> None:
        """A JSON-RPC result as it arrived (from mrtr's own HTTP transport, or `observe`)."""
        requests = result.get("inputRequests")
        if result.get("resultType") == "input_required":
            state = result.get("requestState")
            self.state = state if isinstance(state, str) else None
            self.state_bytes = len(state) if isinstance(state, str) else None
            self.rounds += 1
            self._file(requests)
            if self.on_round is not None:
                self.on_round(self)
        elif "taskId" in result and isinstance(requests, dict):
            self._file(requests, keep=True)

    def observe_task(self, task: Mapping[str, Any]) -> None:
        """A task state that came as a `notifications/tasks` (no result to read): file its asks."""
        if isinstance(task.get("inputRequests"), dict):
            self._file(task["inputRequests"], keep=True)

    def _file(self, requests: Any, *, keep: bool = False) -> None:
        if not isinstance(requests, dict):
            requests = {}
        known = {a.key for a in self.asks} if keep else set()
        if not keep:
            self.asks = []
        for key, request in requests.items():
            if key not in known and isinstance(request, dict):
                self.asks.append(Ask(str(key), request))

    def key_for(self, method: str, fingerprint: str) -> str | None:
        """The wire key of the first unused ask of `method` whose fingerprint matches."""
        for ask in self.asks:
            if not ask.used and ask.method == method and fingerprint_of(ask.method, ask.params) == fingerprint:
                ask.used = True
                return ask.key
        return None


def fingerprint_of(method: str, params: Mapping[str, Any]) -> str:
    """What identifies a question in both its wire JSON and the SDK's parsed params (dumped)."""
    if method == "sampling/createMessage":
        return last_user_text(params.get("messages"))
    return str(params.get("message", ""))


def last_user_text(messages: Any) -> str:
    """The text of the last user message of a sampling request (wire JSON)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        blocks = content if isinstance(content, list) else [content]
        texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        if texts:
            return "\n".join(texts)
    return ""


class _ReadStream(Protocol):
    """What `_TappedRead` uses of an SDK transport's read stream."""

    async def receive(self) -> Any: ...
    async def aclose(self) -> None: ...
    async def __anext__(self) -> Any: ...
    async def __aenter__(self) -> Any: ...
    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...


class _TappedRead:
    """A transport read stream that shows each incoming message to a `WireView` first."""

    def __init__(self, inner: _ReadStream, view: WireView) -> None:
        self._inner = inner
        self._view = view

    async def receive(self) -> Any:
        item = await self._inner.receive()
        self._view.observe(item)
        return item

    def __aiter__(self) -> _TappedRead:
        return self

    async def __anext__(self) -> Any:
        item = await self._inner.__anext__()
        self._view.observe(item)
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _TappedRead:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:  # e.g. `last_context`, read by the dispatcher
        return getattr(self._inner, name)


class ObservedTransport:
    """An SDK `Transport` wrapping another, feeding every incoming message to `view`."""

    def __init__(self, inner: AbstractAsyncContextManager[tuple[Any, Any]], view: WireView) -> None:
        self._inner = inner
        self._view = view

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._inner.__aenter__()
        return _TappedRead(read, self._view), write

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


def observed_http_client(view: WireView) -> httpx2.AsyncClient:
    """The SDK's default HTTP client settings, plus a hook reading the answering instance's header."""

    async def on_response(response: httpx2.Response) -> None:
        instance = response.headers.get(view.instance_header)
        if instance:
            view.instance = instance

    client = sdk.http_client()
    client.event_hooks["response"].append(on_response)
    return client


def http_transport(url: str, view: WireView) -> ObservedTransport:
    """Legacy (2025-11-25) streamable HTTP, observed: the SDK's transport over `observed_http_client`."""
    return ObservedTransport(_OwningHttp(url, observed_http_client(view)), view)


class _OwningHttp:
    """`streamable_http_client` with a caller-built httpx client that it also closes."""

    def __init__(self, url: str, client: httpx2.AsyncClient) -> None:
        self._client = client
        self._transport = streamable_http_client(url, http_client=client)

    async def __aenter__(self) -> Any:
        await self._client.__aenter__()
        return await self._transport.__aenter__()

    async def __aexit__(self, *exc: Any) -> bool | None:
        try:
            return await self._transport.__aexit__(*exc)
        finally:
            await self._client.__aexit__(None, None, None)


__all__ = [
    "Ask",
    "ObservedTransport",
    "WireView",
    "fingerprint_of",
    "http_transport",
    "last_user_text",
    "observed_http_client",
]
