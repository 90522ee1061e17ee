"""Client transport for MCP 2026-07-28 over HTTP: each request one self-contained POST, failures per call.

Choice: mrtr's clients own the 2026-07-28 HTTP transport, because the SDK's streamable HTTP client
runs every POST in one shared task group (a reset in one call cancels all calls on the client and
resurfaces as an ExceptionGroup on close) and maps a gateway 502 to `MCPError -32603`.

`RoundTripDispatcher` implements the SDK's `Dispatcher` seam, so the SDK's `ClientSession` still
stamps `_meta` and routing headers, negotiates and validates results; only the bytes move here:
a JSON-RPC request built with `mcp_types`, POSTed with httpx, answered by JSON or SSE (parsed by
httpx's `EventSource`). A failure is raised to the one caller it hit as a `TransportError` (with
the HTTP status when there was one); a JSON-RPC error the server sent stays an `MCPError`.
`resending` resends on retryable `TransportError`s (connection refused or reset, 502/503/504;
not a timeout) and on JSON-RPC errors the server marks `data.retryable` (its task store did not
answer: `mrtr.StoreUnavailable`), with bounded, jittered backoff: the latter for up to
`RetryPolicy.store_patience` (60 s by default), never past the caller's own deadline.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

import anyio
import anyio.abc
import httpx2
import mcp_types as t
from mcp.shared.dispatcher import CallOptions, OnNotify, OnNotifyIntercept, OnRequest, run_notify_intercept
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from mrtr._backoff import equal_jitter
from mrtr._wire import JSONObject

logger = logging.getLogger("mrtr.client.transport")

GATEWAY_STATUSES = frozenset({502, 503, 504})
"""HTTP statuses a balancer or an overloaded instance answers with: the request may be resent."""

DEFAULT_TIMEOUT = 30.0
"""Seconds one HTTP request (connect, send, whole response) may take before `TransportTimeout`."""

_T = TypeVar("_T")
_LISTEN = "subscriptions/listen"


class TransportError(Exception):
    """The request got no JSON-RPC answer: refused or reset connection, gateway error, timeout.

    Distinct from `mcp.shared.exceptions.MCPError`, which is an answer the server sent. Only
    `retryable` transport errors are resent.

    Attributes:
        status: The HTTP status when the failure was an HTTP response, else None.
        method: The JSON-RPC method of the request that failed.
    """

    def __init__(self, message: str, *, status: int | None = None, method: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.method = method

    @property
    def retryable(self) -> bool:
        """True for connection failures and 502/503/504: another try may reach a healthy instance."""
        return self.status is None or self.status in GATEWAY_STATUSES


class GatewayError(TransportError):
    """An HTTP error status without a JSON-RPC body (502/503/504 are retryable; others are not)."""


class TransportTimeout(TransportError):
    """No complete answer within the client's `timeout`. Not resent: the server may still be working
    on it (a slow step), and a resend would start the same work again beside it. A hung instance
    behind a balancer shows up as the balancer's 504 instead, which is resent."""

    @property
    def retryable(self) -> bool:
        return False


class LoadShed(TransportError):
    """The server kept shedding load (state-only `input_required` results) past the retry cap."""


class LegacySessionRejected(TransportError):
    """A legacy (2025-11-25) HTTP session was refused by an instance that does not hold it.

    Legacy clients keep a session on one instance; behind a balancer without stickiness the next
    request lands elsewhere. Not retryable: the session cannot be recovered on another instance.
    """

    def __init__(self, detail: str = "") -> None:
        super().__init__(
            "the server rejected this client's legacy (2025-11-25) session"
            + (f" ({detail})" if detail else "")
            + ": legacy clients need a sticky or stateful deployment; use mode='auto' or a 2026-07-28 version",
            status=404,
        )

    @property
    def retryable(self) -> bool:
        return False


STORE_PATIENCE = 60.0
"""`RetryPolicy.store_patience`'s default: how long a store outage `FlowClient` waits out (seconds)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed round (or a state-only result) is resent.

    Resend number n (from 0) waits a random time in [d/2, d], d = min(max_delay, initial_delay * 2**n):
    "equal jitter", so clients that failed together do not come back together. Defaults: 8 resends,
    0.1 s doubling to a 2 s cap — at most about 9 s of waiting per round after transport failures;
    while the server says its store is unavailable, resends go on (every 1-2 s) for `store_patience`.
    """

    attempts: int = 8
    initial_delay: float = 0.1
    max_delay: float = 2.0
    store_patience: float = STORE_PATIENCE
    """Seconds a request keeps being resent while the server answers that its store is unavailable
    (a JSON-RPC error with `data.retryable`), even past `attempts` (60 by default): a store
    restart or failover takes seconds to a minute, and every resend is safe (the server did
    nothing the retry would repeat). Counted per request (a round, a `tasks/get`), and never
    past the caller's own deadline: a wait that would end after the enclosing `anyio` cancel
    scope's deadline (`anyio.fail_after(...)` around the call) is not begun, and the store's
    error is raised then instead."""

    def delay(self, resend: int) -> float:
        return equal_jitter(resend, self.initial_delay, self.max_delay)


NO_RETRY = RetryPolicy(attempts=0, store_patience=0.0)
"""A `RetryPolicy` that never resends: every transport failure reaches the caller at once."""


async def resending(policy: RetryPolicy, send: Callable[[], Awaitable[_T]]) -> _T:
    """Await `send()`, calling it again after a retryable `TransportError`, at most `policy.attempts` more times,
    or after a server's retryable JSON-RPC error (`retryable_error`) for up to `policy.store_patience` seconds.

    No pause runs past the caller's own deadline (the enclosing cancel scope's): the error that
    asked for it is raised at once instead, rather than a cancellation after a wait that could
    not end in time.
    """
    started = anyio.current_time()
    give_up = started + policy.store_patience
    for resend in itertools.count():
        try:
            return await send()
        except TransportError as error:
            if not error.retryable or resend >= policy.attempts:
                raise
            pause = policy.delay(resend)
            if anyio.current_time() + pause >= anyio.current_effective_deadline():
                raise
            logger.debug("resending %s after %s (resend %d)", error.method, error, resend + 1)
            await anyio.sleep(pause)
        except MCPError as error:
            if not retryable_error(error):
                raise
            pause = policy.delay(resend)
            now = anyio.current_time()
            if (
                resend >= policy.attempts and now + pause > give_up
            ) or now + pause >= anyio.current_effective_deadline():
                logger.debug("gave up after %.1f s of %s", now - started, error.error.message)
                raise
            logger.debug("resending after %s (resend %d)", error.error.message, resend + 1)
            await anyio.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


class RoundTripDispatcher:
    """An SDK `Dispatcher` for 2026-07-28 HTTP: one POST per request, nothing shared between calls.

    Args:
        url: The server's MCP endpoint.
        timeout: Bound on each request, from connect to the last byte (`TransportTimeout` after it).
        headers: Added to every request (e.g. `Authorization`).
        http_client: Your own `httpx2.AsyncClient` (a proxy, mTLS, a custom CA, event hooks, a
            test transport): used as it is, and left open (its owner closes it).
        auth: An `httpx2.Auth` applied to every request (e.g. OAuth with token refresh).
        on_result: Called with each JSON-RPC result as it arrives, before the session reads it.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        http_client: httpx2.AsyncClient | None = None,
        auth: httpx2.Auth | None = None,
        on_result: Callable[[str, Mapping[str, Any]], None] | None = None,
    ):
        self.url = url
        self.timeout = timeout
        self._owns_http = http_client is None
        self._http = http_client or httpx2.AsyncClient(timeout=httpx2.Timeout(timeout))
        self._headers = dict(headers or {})
        self._auth = auth
        self._on_result = on_result
        self._ids = itertools.count(1)
        self._on_notify: OnNotify | None = None
        self._on_notify_intercept: OnNotifyIntercept | None = None
        self._closed = anyio.Event()

    async def __aenter__(self) -> RoundTripDispatcher:
        if self._owns_http:
            await self._http.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        if self._owns_http:
            await self._http.__aexit__(exc_type, exc, tb)

    async def run(
        self,
        on_request: OnRequest,
        on_notify: OnNotify,
        on_notify_intercept: OnNotifyIntercept | None = None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Nothing to pump: answers arrive on each request's own POST. Parks until closed."""
        self._on_notify = on_notify
        self._on_notify_intercept = on_notify_intercept
        task_status.started()
        await self._closed.wait()

    def close(self) -> None:
        self._closed.set()

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        """The 2026-07-28 HTTP wire has no client-to-server notifications (cancel = close the POST)."""
        logger.debug("dropped client notification %r (no such thing on 2026-07-28 HTTP)", method)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> JSONObject:
        """POST one request and return its result.

        Raises:
            MCPError: The server answered with a JSON-RPC error.
            TransportError: No answer (see its subclasses); `status` tells which HTTP status, if any.
        """
        opts = opts or {}
        request_id = opts.get("request_id", next(self._ids))
        message = t.JSONRPCRequest(jsonrpc="2.0", id=request_id, method=method, params=dict(params or {}))
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        headers.update(self._headers)
        headers.update(opts.get("headers") or {})
        timeout = min(opts.get("timeout", self.timeout), self.timeout)  # no wait past the client's timeout
        body = message.model_dump(by_alias=True, mode="json", exclude_none=True)
        # A listen response is a stream that lasts as long as the subscription: no deadline for the
        # whole answer (the caller bounds the wait for its acknowledgement); the server's 15 s
        # keepalives keep the read timeout from firing on a quiet stream.
        deadline, per_read = (
            (None, httpx2.Timeout(timeout, read=max(timeout, 60.0)))
            if method == _LISTEN
            else (
                timeout,
                None,
            )
        )
        extra: dict[str, Any] = {"timeout": per_read if per_read is not None else httpx2.Timeout(timeout)}
        if self._auth is not None:
            extra["auth"] = self._auth
        try:
            with anyio.fail_after(deadline):
                async with self._http.stream("POST", self.url, json=body, headers=headers, **extra) as response:
                    return await self._read_answer(method, response, opts)
        except TimeoutError:
            raise TransportTimeout(f"{method}: no answer within {timeout}s", method=method) from None
        except (httpx2.ConnectTimeout, httpx2.PoolTimeout) as error:  # never reached the server: resendable
            raise TransportError(f"{method}: {type(error).__name__}: {error}", method=method) from error
        except httpx2.TimeoutException as error:
            raise TransportTimeout(f"{method}: {type(error).__name__}: {error}", method=method) from error
        except httpx2.TransportError as error:
            raise TransportError(f"{method}: {type(error).__name__}: {error}", method=method) from error
        except (httpx2.StreamError, httpx2.SSEError) as error:
            raise TransportError(f"{method}: broken response stream: {error}", method=method) from error

    async def _read_answer(self, method: str, response: httpx2.Response, opts: CallOptions) -> JSONObject:
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if response.status_code >= 400 or content_type == "application/json":
            reply = _parse_reply(await response.aread()) if content_type == "application/json" else None
            if reply is not None:
                return self._unwrap(method, reply)
            if response.status_code == 404:  # the SDK's reading: a bare 404 means "no such method here"
                raise MCPError(code=t.METHOD_NOT_FOUND, message="Not Found")
            raise GatewayError(f"{method}: HTTP {response.status_code}", status=response.status_code, method=method)
        if content_type != "text/event-stream":
            raise GatewayError(
                f"{method}: unexpected answer (HTTP {response.status_code}, {content_type or 'no content type'})",
                status=response.status_code,
                method=method,
            )
        async for event in httpx2.EventSource(response):
            if not event.data:
                continue
            try:
                message = t.jsonrpc_message_adapter.validate_json(event.data, by_name=False)
            except ValidationError:
                logger.warning("%s: ignored an SSE event that is not JSON-RPC", method)
                continue
            if isinstance(message, t.JSONRPCResponse | t.JSONRPCError):
                return self._unwrap(method, message)
            if isinstance(message, t.JSONRPCNotification):
                await self._deliver(message, opts)
            else:
                logger.warning("%s: ignored a server request %r (none exist on 2026-07-28)", method, message.method)
        raise TransportError(f"{method}: response stream ended without an answer", method=method)

    def _unwrap(self, method: str, reply: t.JSONRPCResponse | t.JSONRPCError) -> JSONObject:
        result = _unwrap(reply)
        if self._on_result is not None:
            self._on_result(method, result)
        return result

    async def _deliver(self, notification: t.JSONRPCNotification, opts: CallOptions) -> None:
        params = notification.params
        if notification.method == "notifications/progress" and (on_progress := opts.get("on_progress")) and params:
            await on_progress(params.get("progress", 0), params.get("total"), params.get("message"))
        if run_notify_intercept(self._on_notify_intercept, notification.method, params):
            return
        if self._on_notify is not None:
            # ClientSession._on_notify reads no context; there is no back-channel on this wire.
            await self._on_notify(cast(Any, None), notification.method, params)


def retryable_error(error: MCPError) -> bool:
    """The server says resending the same request is safe and may succeed (`data.retryable`)."""
    data = error.error.data
    return isinstance(data, dict) and data.get("retryable") is True


def _parse_reply(raw: bytes) -> t.JSONRPCResponse | t.JSONRPCError | None:
    try:
        reply = t.jsonrpc_message_adapter.validate_json(raw, by_name=False)
    except ValidationError:
        return None
    return reply if isinstance(reply, t.JSONRPCResponse | t.JSONRPCError) else None


def _unwrap(reply: t.JSONRPCResponse | t.JSONRPCError) -> JSONObject:
    if isinstance(reply, t.JSONRPCError):
        raise MCPError.from_error_data(reply.error)
    return dict(reply.result)


__all__ = [
    "DEFAULT_TIMEOUT",
    "GATEWAY_STATUSES",
    "NO_RETRY",
    "STORE_PATIENCE",
    "GatewayError",
    "LegacySessionRejected",
    "LoadShed",
    "RetryPolicy",
    "RoundTripDispatcher",
    "retryable_error",
    "TransportError",
    "TransportTimeout",
    "resending",
]
