"""Scripted answers (`--answers FILE`) and the pluggable sampling answerers (`--sampling`).

An answers file is a JSON or YAML mapping. Each entry is found by the ask's wire key
first, then by its exact question (an elicitation's message, a sampling request's last
user text), then by a shell-style pattern (`"Deploy plan-* to staging?"`). Legacy
(2025-11-25) servers ask through server->client requests, which carry no wire key: for
them only the question and patterns match.

    target: {environment: staging}          # accept with this content
    "Add a service*": {service: "", done: true}
    approve_api: decline                    # or cancel, :decline, :cancel; or {action: decline}
    risk: "Low: a config-only change."      # a sampling completion
    plan: {content: [{type: tool_use, id: t1, name: search, input: {q: x}}], stopReason: toolUse}
    console_login: accept                   # a URL-mode elicitation: consent
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import shlex
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal, TypeGuard

import mcp_types as t

from mrtr._wire import JSONObject
from mrtr.cli._errors import UsageError
from mrtr.cli._observe import last_user_text

Action = Literal["accept", "decline", "cancel"]
ACTIONS: tuple[Action, ...] = ("accept", "decline", "cancel")
SAMPLING_MODEL = "mrtr-cli"
_CMD_TIMEOUT = 120.0


def load_answers(path: Path) -> JSONObject:
    """Read an answers file; any problem is a one-line `UsageError`."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"answers file {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml  # type: ignore[import-untyped]  # no stubs among the project's dependencies

            data = yaml.safe_load(text)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"answers file {path} is not valid JSON/YAML: {_first_line(exc)}") from None
    except Exception as exc:  # yaml.YAMLError and friends
        raise UsageError(f"answers file {path} is not valid JSON/YAML: {_first_line(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"answers file {path} must hold a mapping of key or question to answer")
    return {str(k): _plain(v) for k, v in data.items()}


def _plain(value: Any) -> Any:
    """YAML reads `2026-07-28` as a date: send dates and times as the ISO strings they were written as."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


@dataclass
class AnswerBook:
    """Answers by key, question or pattern; `lookup` returns None when there is none."""

    entries: JSONObject

    def lookup(self, key: str | None, question: str, *, patterns: bool = True) -> tuple[bool, Any]:
        """The entry for `key`, else for `question`, else (with `patterns`) the first `*` pattern matching it."""
        if key is not None and key in self.entries:
            return True, self.entries[key]
        if question in self.entries:
            return True, self.entries[question]
        if not patterns:
            return False, None
        for pattern, value in self.entries.items():
            if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(question, pattern):
                return True, value
        return False, None


def _is_action(value: object) -> TypeGuard[Action]:
    return isinstance(value, str) and value in ACTIONS


def elicit_result(value: Any, where: str) -> t.ElicitResult:
    """An answers-file value as an `ElicitResult`; `:decline` and `:cancel` (the prompt's spellings) too."""
    if value is True:
        return t.ElicitResult(action="accept")
    if isinstance(value, str) and value.startswith(":") and _is_action(value[1:]):
        value = value[1:]
    if _is_action(value):
        return t.ElicitResult(action=value)
    if isinstance(value, dict):
        if "action" in value and value["action"] in ACTIONS:
            content = value.get("content")
            if content is not None and not isinstance(content, dict):
                raise UsageError(f"answer for {where}: 'content' must be a mapping")
            return t.ElicitResult(action=value["action"], content=content)
        return t.ElicitResult(action="accept", content=value)
    raise UsageError(f"answer for {where} must be a mapping of field values, or accept/decline/cancel")


def sampling_result(text: str) -> t.CreateMessageResult:
    return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=text), model=SAMPLING_MODEL)


SamplingAnswer = t.CreateMessageResult | t.CreateMessageResultWithTools


def structured_sampling_result(value: Any, where: str) -> SamplingAnswer:
    """A model's whole answer given as JSON (`json:COMMAND`'s stdout, or an answers-file mapping):
    `{"content": ..., "stopReason": ...}`, `role` and `model` optional. A list of content blocks
    (`tool_use` among them) makes it a tools-mode answer."""
    if not isinstance(value, dict) or "content" not in value:
        raise UsageError(f"answer for {where} must be the completion text, or a mapping with 'content'")
    data = {"role": "assistant", "model": SAMPLING_MODEL} | value
    tools_mode = isinstance(data["content"], list)
    try:
        if tools_mode:
            return t.CreateMessageResultWithTools.model_validate(data)
        return t.CreateMessageResult.model_validate(data)
    except ValueError as exc:
        raise UsageError(f"answer for {where} is not a sampling result: {_first_line(exc)}") from None


def sampling_request_json(params: t.CreateMessageRequestParams) -> str:
    """What `json:COMMAND` reads on stdin: the request's params as the wire spells them (tools included)."""
    return json.dumps(params.model_dump(mode="json", by_alias=True, exclude_none=True))


def command_answer(out: str, where: str) -> SamplingAnswer:
    """`json:COMMAND`'s stdout: a JSON object (a whole result, maybe `tool_use`) or plain completion text."""
    stripped = out.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except ValueError:
            return sampling_result(stripped)
        return structured_sampling_result(value, where)
    return sampling_result(stripped)


def prompt_text(params: t.CreateMessageRequestParams) -> str:
    """The last user message's text: what `echo`, `cmd:` and answers files key on."""
    return last_user_text(params.model_dump(mode="json", by_alias=True, exclude_none=True).get("messages"))


def check_sampling_mode(mode: str) -> str:
    if mode in ("echo", "ask", "none") or (mode.startswith(("cmd:", "json:")) and mode.partition(":")[2].strip()):
        return mode
    raise UsageError(f"--sampling must be echo, ask, none, cmd:COMMAND or json:COMMAND, not {mode!r}")


async def run_command(command: str, prompt: str) -> str:
    """`--sampling cmd:...`: the prompt on the command's stdin, its stdout is the completion
    (`json:...`: the request as JSON in, a result or text out)."""
    argv = shlex.split(command)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        raise UsageError(f"sampling command {argv[0]!r}: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(process.communicate(prompt.encode()), _CMD_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise UsageError(f"sampling command {argv[0]!r} took longer than {_CMD_TIMEOUT:g}s") from None
    if process.returncode != 0:
        detail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise UsageError(f"sampling command {argv[0]!r} exited with {process.returncode}: {detail[0]}")
    return out.decode(errors="replace").strip()


def root_of(value: str) -> t.Root:
    """`--root` as a `Root`: a URI as given, a path as an absolute file:// URI."""
    if "://" in value:
        return t.Root.model_validate({"uri": value, "name": value.rstrip("/").rsplit("/", 1)[-1] or value})
    path = Path(value).expanduser().resolve()
    return t.Root.model_validate({"uri": path.as_uri(), "name": path.name or str(path)})


__all__ = [
    "ACTIONS",
    "SAMPLING_MODEL",
    "Action",
    "AnswerBook",
    "SamplingAnswer",
    "check_sampling_mode",
    "command_answer",
    "elicit_result",
    "load_answers",
    "prompt_text",
    "root_of",
    "run_command",
    "sampling_request_json",
    "sampling_result",
    "structured_sampling_result",
]
