"""A stand-in for the Anthropic Messages API that Claude Code talks to (`ANTHROPIC_BASE_URL`), offline.

No model runs: the test scripts it. A user prompt of the form

    CALL <tool> <json arguments>

is answered with one `tool_use` block calling that tool (Claude Code's name for an MCP tool is
`mcp__<server>__<tool>`); the conversation's next request, which carries the tool's result,
is answered with a text block quoting it (`RESULT: ...`), and the turn ends. Anything else
(the side requests Claude Code makes, a task's notification) gets a short text. Answers are
streamed as server-sent events when the request asks for a stream, as the real API does.

Every request is kept (`ModelAPI.requests`) so a test can read what Claude Code sent: the
tools it offered the model, and the tool results.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CALL = re.compile(r"CALL\s+(?P<tool>[\w.-]+)\s+(?P<args>\{[^\n]*\})")


@dataclass
class ModelAPI:
    """The scripted model: what it was asked, and the URL Claude Code should use (`base_url`)."""

    base_url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def tool_results(self) -> list[str]:
        """The text of every tool result Claude Code sent back to the model, in order."""
        return [text for body in self.requests for text in _tool_results(body)]

    def offered_tools(self) -> set[str]:
        return {str(tool.get("name")) for body in self.requests for tool in body.get("tools") or []}

    async def messages(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        content = self._answer(body)
        message_id = f"msg_{next(self._ids)}"
        stop = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "stand-in"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        if not body.get("stream"):
            return JSONResponse(message)
        return StreamingResponse(_events(message), media_type="text/event-stream")

    async def count_tokens(self, request: Request) -> Response:
        return JSONResponse({"input_tokens": 1})

    def _answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        # The newest user turn (Claude Code may append a `system` message after it).
        last = next((m for m in reversed(body.get("messages") or []) if m.get("role") == "user"), {})
        results = list(_tool_results({"messages": [last]}))
        if results:
            return [{"type": "text", "text": "RESULT: " + " | ".join(results)}]
        wanted = CALL.search(_text_of(last))  # only what the user just said: a notification is not a prompt
        tools = {str(tool.get("name")) for tool in body.get("tools") or []}
        if wanted is not None:
            name = next((t for t in tools if t == wanted["tool"] or t.endswith("__" + wanted["tool"])), None)
            if name is not None:
                arguments = json.loads(wanted["args"])
                return [{"type": "tool_use", "id": f"toolu_{next(self._ids)}", "name": name, "input": arguments}]
        return [{"type": "text", "text": "ok"}]


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def _tool_results(body: dict[str, Any]) -> Iterator[str]:
    for message in body.get("messages") or []:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, str):
                    yield inner
                elif isinstance(inner, list):
                    yield "".join(str(part.get("text", "")) for part in inner if isinstance(part, dict))


async def _events(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """The message as the API streams it: start, each block (start, one delta, stop), delta, stop."""

    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps(data | {'type': kind})}\n\n".encode()

    head = {k: v for k, v in message.items() if k != "content"} | {"content": [], "stop_reason": None}
    yield event("message_start", {"message": head})
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {k: v for k, v in block.items() if k != "input"} | {"input": {}}
            yield event("content_block_start", {"index": index, "content_block": start})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield event("content_block_delta", {"index": index, "delta": delta})
        yield event("content_block_stop", {"index": index})
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield event("message_delta", {"delta": stop, "usage": {"output_tokens": 1}})
    yield event("message_stop", {})


@asynccontextmanager
async def running_model_api() -> AsyncIterator[ModelAPI]:
    """Serve a `ModelAPI` on a free 127.0.0.1 port, in this event loop."""
    api = ModelAPI()
    routes = [
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                await serving
                raise RuntimeError("the model API stand-in did not start")
            await asyncio.sleep(0.01)
        api.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield api
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        sock.close()


__all__ = ["ModelAPI", "running_model_api"]
