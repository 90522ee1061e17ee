"""What an ask asked, kept beside its answer in a durable task's journal: the audit trail.

The journal pins each answer to a digest of its question, which is enough to replay but not
to read: an operator looking at an approval needs to see *what* was approved. So a task's
journal also keeps, per ask, the question's text (an elicitation's message, a sampling
request's last user message), its form's title, and when it was asked and answered. Bounded:
a question longer than `QUESTION_MAX` characters is cut, with a marker saying so.

Only journals without a size budget (durable tasks, stored server-side) keep them: an
ephemeral flow's journal rides in the client's `requestState`, and nobody reads it there.
"""

from __future__ import annotations

from typing import Any

from mrtr._engine.asks import Ask
from mrtr._engine.journal import QuestionNote
from mrtr._wire import JSONObject

QUESTION_MAX = 2048
"""Characters of a question's text a journal keeps; the rest is cut (`CUT` marks it)."""
CUT = " […cut]"


def question_of(ask: Ask) -> QuestionNote:
    """The journal's note of `ask`: its kind, text (bounded) and form title."""
    params: JSONObject = ask.wire_request().get("params") or {}
    title: Any = None
    if ask.kind in ("elicit", "elicit_url"):
        text = str(params.get("message", ""))
        schema = params.get("requestedSchema")
        title = schema.get("title") if isinstance(schema, dict) else None
    elif ask.kind == "sample":
        text = _last_user_message(params.get("messages") or [])
    else:
        text = "the client's roots (roots/list)"
    note: QuestionNote = {"k": ask.kind, "q": bounded(text)}
    if isinstance(title, str) and title:
        note["t"] = bounded(title, 200)
    return note


def bounded(text: str, limit: int = QUESTION_MAX) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT)] + CUT


def _last_user_message(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            blocks = content if isinstance(content, list) else [content]
            parts = [
                str(block.get("text", "")) if block.get("type") == "text" else f"[{block.get('type')}]"
                for block in blocks
                if isinstance(block, dict)
            ]
            return " ".join(parts)
    return ""


__all__ = ["CUT", "QUESTION_MAX", "bounded", "question_of"]
