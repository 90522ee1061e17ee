"""The client's LLM for the migrated servers, scripted: `answer(request)` takes a `sampling/createMessage`
request's params as wire JSON and returns a result as wire JSON. As a program (`python llm.py`), it is
`mrtr call --sampling json:...`'s command: the request on stdin, the result on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

QUESTIONS = ["Which years?", "Which region?"]
ANSWERS = {"Which years?": "2020s", "Which region?": "EU"}
"""What the user answers each clarifying question with."""


def answer(request: dict[str, Any]) -> dict[str, Any]:
    tools = {tool["name"] for tool in request.get("tools") or []}
    messages = request["messages"]
    if "ask_clarifying_questions" in tools:
        query = _text(messages[0]).rsplit("\n", 1)[-1]
        results = [b for b in _blocks(messages[-1]) if b.get("type") == "tool_result"]
        if not results:
            call = {"questions": QUESTIONS, "original_query": query}
            return _tool_use("c1", "ask_clarifying_questions", call)
        said = "".join(block.get("text", "") for block in results[0].get("content", []))
        return _tool_use("f1", "final_response", {"refined_query": f"{query} ({said})", "was_clarified": True})
    matches = [{"conference_name": "PyCon FR", "score": 90}, {"conference_name": "DevFest Nantes", "score": 60}]
    return {
        "role": "assistant",
        "model": "scripted",
        "content": {"type": "text", "text": json.dumps({"matches": matches})},
    }


def _tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
    return {"role": "assistant", "model": "scripted", "content": [block], "stopReason": "toolUse"}


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return content if isinstance(content, list) else [content]


def _text(message: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in _blocks(message) if block.get("type") == "text")


def user(message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The user's answer to a form: the clarifying answers; None (decline) for DevFest, {} (accept) otherwise."""
    fields = schema.get("properties") or {}
    if fields:
        return {name: ANSWERS[field["description"]] for name, field in fields.items()}
    return None if "DevFest" in message else {}


if __name__ == "__main__":
    print(json.dumps(answer(json.load(sys.stdin))))
