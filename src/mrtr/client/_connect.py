"""How `FlowClient` connects: era negotiation that never flaps, and a guard for legacy HTTP sessions.

`discover` decides between 2026-07-28 and the legacy handshake only on a definite answer from
the server; transport failures are resent and, if they last, raised — a 502 from a balancer is
not evidence that the server is old. `SessionWatch` turns the silent failure mode of legacy
sessions behind a non-sticky balancer (an answer POST refused by an instance that does not
hold the session, and a call that then waits forever) into an immediate, named error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as t
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mrtr.client._transport import LegacySessionRejected, RetryPolicy, resending

_T = TypeVar("_T")

# Answers to `server/discover` that settle "this server speaks no 2026-07-28": anything else is no verdict.
_LEGACY_VERDICTS = frozenset({t.METHOD_NOT_FOUND, t.INVALID_REQUEST, t.UNSUPPORTED_PROTOCOL_VERSION})


async def discover(session: ClientSession, retry: RetryPolicy) -> t.DiscoverResult | None:
    """`server/discover`, transient failures resent; None only on the server's definite "not modern".

    Mirrors the SDK's `mode='auto'` policy (one re-probe at a mutual version named by -32022),
    except that only the answers in `_LEGACY_VERDICTS` mean legacy: a transport failure that
    outlasts `retry` raises `TransportError`, and any other JSON-RPC error is raised as is.
    """
    version = LATEST_MODERN_VERSION
    for attempt in range(2):
        try:
            raw = await resending(retry, partial(session.send_discover, version))
        except MCPError as error:
            if error.code not in _LEGACY_VERDICTS:
                raise
            if error.code == t.UNSUPPORTED_PROTOCOL_VERSION:
                supported = _supported_versions(error.error.data)
                mutual = [v for v in MODERN_PROTOCOL_VERSIONS if v in supported]
                if mutual and attempt == 0:
                    version = mutual[-1]
                    continue
                if supported and not any(v in HANDSHAKE_PROTOCOL_VERSIONS for v in supported):
                    raise  # modern-only with no version in common: a real incompatibility
            return None
        try:
            result = t.DiscoverResult.model_validate(raw, by_name=False)
        except ValidationError:
            return None  # answers discover, but not with a 2026-07-28 result
        return result if any(v in result.supported_versions for v in MODERN_PROTOCOL_VERSIONS) else None
    return None


def _supported_versions(data: Any) -> list[str]:
    try:
        return list(t.UnsupportedProtocolVersionErrorData.model_validate(data).supported or ())
    except ValidationError:
        return []


class SessionWatch:
    """Notices a legacy HTTP session refused by an instance that does not hold it, and fails calls at once.

    Behind a balancer without stickiness a legacy call can otherwise hang: the server asks the
    user through a server->client request, the answer lands on another instance (404), and
    the original request waits for an answer that never comes.
    """

    def __init__(self) -> None:
        self.rejected = anyio.Event()
        self.detail = ""

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code == 404 and "mcp-session-id" in response.request.headers:
            self.detail = f"HTTP 404 on {response.request.method}"
            self.rejected.set()

    async def guard(self, call: Callable[[], Awaitable[_T]]) -> _T:
        if self.rejected.is_set():
            raise LegacySessionRejected(self.detail)
        outcome: list[_T] = []
        failure: list[Exception] = []
        async with anyio.create_task_group() as group:

            async def cancel_on_rejection() -> None:
                await self.rejected.wait()
                group.cancel_scope.cancel()

            group.start_soon(cancel_on_rejection)
            try:  # nothing may escape into the task group: it would wrap it in an ExceptionGroup
                outcome.append(await call())
            except Exception as error:
                failure.append(error)
            group.cancel_scope.cancel()
        if failure:
            if self.rejected.is_set() and isinstance(failure[0], MCPError):
                raise LegacySessionRejected(self.detail) from failure[0]
            raise failure[0]
        if not outcome:  # cancelled by the watcher
            raise LegacySessionRejected(self.detail)
        return outcome[0]


__all__ = ["SessionWatch", "discover"]
