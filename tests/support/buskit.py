"""A raw `subscriptions/listen` client for the bus tests: what the server puts on the wire, frame by frame.

The SDK's `Client.listen()` asks for the core filter only; the tasks extension's
`notifications.taskIds` and mrtr's snapshot opt-in need a request built by hand, and the
tests want to see every frame exactly as sent (`ttlMs: null` included), so this module POSTs
the request with httpx and parses the SSE stream itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp.shared.inbound import encode_header_value

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def envelope(*, tasks: bool = True) -> dict[str, Any]:
    """The per-request `_meta` of a 2026-07-28 client (capabilities travel with every request)."""
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "mrtr-bus-test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": (
            {"elicitation": {"form": {}}, "extensions": {TASKS_EXTENSION: {}}} if tasks else {}
        ),
    }


def headers(method: str, name: str | None = None, token: str | None = None) -> dict[str, str]:
    out = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": method,
    }
    if name is not None:
        out["mcp-name"] = encode_header_value(name)
    if token is not None:
        out["authorization"] = f"Bearer {token}"
    return out


async def call(
    http: httpx2.AsyncClient,
    url: str,
    method: str,
    params: dict[str, Any],
    *,
    name: str | None = None,
    token: str | None = None,
    tasks: bool = True,
) -> dict[str, Any]:
    """One request; its JSON-RPC reply (result or error) as a dict. `Mcp-Name` is derived when not given."""
    if name is None:
        name = params.get("name") if method == "tools/call" else params.get("taskId")
    meta = {**params.get("_meta", {}), **envelope(tasks=tasks)}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    response = await http.post(url, json=body, headers=headers(method, name, token))
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        async for event in httpx2.EventSource(response):
            message = json.loads(event.data) if event.data else {}
            if "id" in message:
                return message  # type: ignore[no-any-return]
        raise AssertionError("stream ended without an answer")
    return response.json()  # type: ignore[no-any-return]


class Listening:
    """An open listen stream: `frames` are the JSON-RPC messages received so far, in order."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.changed = anyio.Event()
        self.ended = anyio.Event()

    def of(self, method: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("method") == method]

    async def wait_for(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        """The first frame satisfying `predicate`, waiting up to `timeout` seconds."""
        found: list[dict[str, Any]] = []

        def check(stream: Listening) -> bool:
            found[:] = [frame for frame in stream.frames if predicate(frame)][:1]
            return bool(found)

        await self.until(check, timeout, what)
        return found[0]

    async def until(self, check: Any, timeout: float, what: str) -> None:
        """Wait until `check(self)` holds (frames arrive as they come), at most `timeout` seconds."""
        with anyio.fail_after(timeout):
            while not check(self):
                if self.ended.is_set():
                    raise AssertionError(f"stream ended before {what}: {self.frames}")
                self.changed = anyio.Event()
                await self.changed.wait()


@asynccontextmanager
async def listen(
    url: str, notifications: dict[str, Any], *, token: str | None = None, tasks: bool = True
) -> AsyncIterator[Listening]:
    """POST `subscriptions/listen`; yields once the first frame (the ack, or an error) arrived."""
    body = {
        "jsonrpc": "2.0",
        "id": "listen-1",
        "method": "subscriptions/listen",
        "params": {"notifications": notifications, "_meta": envelope(tasks=tasks)},
    }
    listening = Listening()
    first = anyio.Event()

    async def read(http: httpx2.AsyncClient) -> None:
        try:
            async with http.stream("POST", url, json=body, headers=headers("subscriptions/listen", token=token)) as r:
                if r.headers.get("content-type", "").startswith("application/json"):
                    listening.frames.append(json.loads(await r.aread()))
                else:
                    async for event in httpx2.EventSource(r):
                        if event.data:
                            listening.frames.append(json.loads(event.data))
                            first.set()
                            listening.changed.set()
        except httpx2.HTTPError:
            pass
        finally:
            listening.ended.set()
            first.set()
            listening.changed.set()

    timeout = httpx2.Timeout(10.0, read=60.0)
    async with httpx2.AsyncClient(trust_env=False, timeout=timeout) as http, anyio.create_task_group() as group:
        group.start_soon(read, http)
        with anyio.fail_after(10):
            await first.wait()
        yield listening
        group.cancel_scope.cancel()
