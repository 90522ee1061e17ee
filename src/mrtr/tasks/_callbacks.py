"""Callback URLs: a sealed, single-use URL an outside system POSTs an event to.

`ctx.callback_url(name)` mints `<public_url>/mrtr/events/<task id>/<name>/<token>`. The token
is sealed by the server's own `RequestStateSecurity` codec (AES-GCM under the fleet's state
keys; mrtr has no crypto of its own) over the task id, the event name, an expiry and a
nonce, so any instance that shares the keys accepts it and nobody can forge or alter one.
The POST's JSON body becomes event `name`, delivered with the nonce as its event id: a
second POST of the same URL finds the id taken and is refused (409), tampered or foreign
tokens 403, expired 410, and nothing is delivered in any of those cases. A task whose record
kept changing under the delivery answers 503 with `Retry-After`: the URL stays good.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from mcp.server.request_state import InvalidRequestState, RequestStateSecurity
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mrtr._errors import EventNotDelivered, StoreUnavailable
from mrtr.tasks._inbox import MAX_EVENT_BYTES

PATH = "/mrtr/events"
_KIND = "mrtr/callback/v1"


class CallbackRefused(Exception):
    """A callback POST that delivers nothing: `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class CallbackUrls:
    """Mints and checks callback URLs on `public_url` (the fleet's base URL, as the outside sees it).

    Args:
        public_url: e.g. `https://mcp.example.com`; the route lives at `<public_url>/mrtr/events/...`.
        security: The server's `RequestStateSecurity` (read when used: the SDK installs it late).
    """

    def __init__(self, public_url: str, security: Callable[[], RequestStateSecurity | None]) -> None:
        if not public_url.startswith(("http://", "https://")):
            raise ValueError(f"public_url must be an absolute http(s) URL, not {public_url!r}")
        self.public_url = public_url.rstrip("/")
        self._security = security

    def _codec(self) -> Any:
        security = self._security()
        if security is None:
            raise RuntimeError("the server has no RequestStateSecurity to seal callback URLs with")
        return security.codec

    def mint(self, task_id: str, name: str, expires_at: float) -> str:
        claims = {"k": _KIND, "t": task_id, "n": name, "x": round(expires_at, 3), "i": secrets.token_urlsafe(12)}
        token = self._codec().seal(json.dumps(claims, separators=(",", ":")).encode())
        return f"{self.public_url}{PATH}/{quote(task_id, safe='')}/{quote(name, safe='')}/{token}"

    def verify(self, task_id: str, name: str, token: str, now: float) -> str:
        """The event id this URL delivers under; raises `CallbackRefused` otherwise."""
        try:
            claims = json.loads(self._codec().unseal(token))
        except (InvalidRequestState, ValueError, UnicodeDecodeError):
            raise CallbackRefused(403, "not a callback URL of this server (tampered or foreign)") from None
        if not isinstance(claims, dict) or claims.get("k") != _KIND:
            raise CallbackRefused(403, "not a callback URL of this server")
        if claims.get("t") != task_id or claims.get("n") != name:
            raise CallbackRefused(403, "this callback URL belongs to another task or event")
        if not isinstance(claims.get("x"), int | float) or now >= claims["x"]:
            raise CallbackRefused(410, "this callback URL has expired")
        return f"callback:{claims['i']}"


Deliver = Callable[[str, str, Any, str], Awaitable[bool]]
"""(task id, event name, payload, event id) -> delivered now (False: that id was delivered before)."""


def endpoint(urls: Callable[[], CallbackUrls | None], deliver: Deliver) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette handler of `POST /mrtr/events/{task_id}/{name}/{token}`."""

    async def receive(request: Request) -> Response:
        minted = urls()
        if minted is None:
            return _refuse(404, "this server issues no callback URLs (Flows(public_url=...) is not set)")
        params = request.path_params
        task_id, name, token = str(params["task_id"]), str(params["name"]), str(params["token"])
        try:
            event_id = minted.verify(task_id, name, token, time.time())
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_EVENT_BYTES:
                raise CallbackRefused(413, f"the body is larger than {MAX_EVENT_BYTES:,} bytes")
            body = await request.body()
            if len(body) > MAX_EVENT_BYTES:
                raise CallbackRefused(413, f"the body is larger than {MAX_EVENT_BYTES:,} bytes")
            try:
                payload = json.loads(body) if body.strip() else None
            except ValueError:
                raise CallbackRefused(400, "the body must be JSON") from None
            if not await deliver(task_id, name, payload, event_id):
                raise CallbackRefused(409, "this callback URL was used already")
        except CallbackRefused as exc:
            return _refuse(exc.status, str(exc))
        except EventNotDelivered as exc:
            if exc.reason == "busy":  # lost every compare-and-set: not final, and the URL is unused
                return _refuse(503, str(exc), headers={"Retry-After": "1"})
            status = {"unknown_task": 404, "task_finished": 410}.get(exc.reason, 409)
            return _refuse(status, str(exc))
        except StoreUnavailable as exc:  # not delivered, the URL unused: the sender retries (logged by the store)
            return _refuse(503, exc.error.message, headers={"Retry-After": "2"})
        except ValueError as exc:
            return _refuse(400, str(exc))
        return JSONResponse({"delivered": True, "task": task_id, "event": name}, status_code=202)

    return receive


def _refuse(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"delivered": False, "error": message}, status_code=status, headers=headers)


__all__ = ["PATH", "CallbackRefused", "CallbackUrls", "Deliver", "endpoint"]
