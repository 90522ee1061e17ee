"""`mrtr call`: drive one tool call, prompt or resource read through every round, in a terminal.

Built on `mrtr.client.FlowClient`: its handlers answer each ask (a form rendered from the
schema, a link to confirm, a sampling answerer, the `--root` list), its `on_round` and
`on_task` hooks drive the display, and with `tasks=True` it follows a durable task to the
end. `--answers FILE` answers by key or question without a person; an ask it does not
cover is put to the person when stdin is a terminal, and ends the run otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from mrtr._wire import JSONObject
from mrtr.cli._answers import (
    AnswerBook,
    SamplingAnswer,
    check_sampling_mode,
    command_answer,
    elicit_result,
    load_answers,
    prompt_text,
    root_of,
    run_command,
    sampling_request_json,
    sampling_result,
    structured_sampling_result,
)
from mrtr.cli._errors import EXIT_OK, EXIT_TOOL_ERROR, Abandoned, CliError, UsageError
from mrtr.cli._forms import CANCEL, FormRenderer, problems
from mrtr.cli._observe import ObservedTransport, WireView, http_transport, observed_http_client
from mrtr.client._flowclient import FlowClient, Round
from mrtr.client._tasks import TaskSnapshot

_LIST_PAGES = 20


@dataclass
class CallRequest:
    """Everything `mrtr call` was asked to do."""

    url: str | None
    stdio: str | None
    tool: str | None = None
    prompt: str | None = None
    resource: str | None = None
    arguments: JSONObject = field(default_factory=dict)
    raw_args: list[str] = field(default_factory=list)
    answers: Path | None = None
    sampling: str = "ask"
    roots: list[str] = field(default_factory=list)
    tasks: bool = True
    legacy: bool = False
    max_rounds: int = 25
    output: str = "text"
    instance_header: str = "X-Mrtr-Instance"
    show_state: bool = False


class CallSession:
    """The handlers and hooks of one `mrtr call`, sharing one console and one wire view."""

    def __init__(self, request: CallRequest, console: Console, interactive: bool) -> None:
        self.request = request
        self.console = console
        self.interactive = interactive
        self.view = WireView(on_round=self._show_round, instance_header=request.instance_header.lower())
        self.book = AnswerBook(load_answers(request.answers)) if request.answers else None
        self.form = FormRenderer(console)
        self.sampling = check_sampling_mode(request.sampling)
        self.progress: Progress | None = None
        self.progress_task: Any = None
        self.task_id: str | None = None
        self.failure: CliError | None = None
        """Why a legacy server's request went unanswered: what the run ends with."""

    # -- answering --------------------------------------------------------------------------

    def _scripted(self, key: str | None, question: str, *, patterns: bool = True) -> tuple[bool, Any]:
        return self.book.lookup(key, question, patterns=patterns) if self.book is not None else (False, None)

    def _need_person(self, what: str, legacy: bool = False) -> None:
        """No scripted answer: ask the person, or end the run when there is none to ask."""
        legacy_hint = (
            f"legacy 2025-11-25 servers ask without wire keys, so key the answers file by the question "
            f"({what}) or a * pattern"
            if legacy and self.book is not None
            else None
        )
        if not self.interactive:
            if legacy_hint:
                raise Abandoned(f"no answer for {what} and stdin is not a terminal: {legacy_hint}")
            hint = "add it to --answers FILE" if self.book is not None else "give --answers FILE"
            raise Abandoned(f"no answer for {what} and stdin is not a terminal ({hint})")
        self._pause_progress()
        if legacy_hint:
            self.console.print(f"[yellow]  the answers file has no entry for {escape(what)}:[/] [dim]{legacy_hint}[/]")

    def _refused(self, exc: CliError) -> MCPError:
        """A legacy server's request could not be answered: keep the reason for the end of the run.

        Raised from an SDK callback, a `CliError` would be logged with its traceback and reach
        the server (and then us) as a server error; the person must see this one line instead.
        """
        if self.failure is None:
            self.failure = exc
        return MCPError(INTERNAL_ERROR, f"mrtr call could not answer: {exc}")

    async def on_elicit(self, context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        """`context` is the server's request on a legacy session (server->client), None in a round."""
        if context is None:
            return await self.elicit(params, legacy=False)
        try:
            return await self.elicit(params, legacy=True)
        except CliError as exc:
            raise self._refused(exc) from None

    async def on_sample(self, context: Any, params: t.CreateMessageRequestParams) -> SamplingAnswer:
        if context is None:
            return await self.sample(params, legacy=False)
        try:
            return await self.sample(params, legacy=True)
        except CliError as exc:
            raise self._refused(exc) from None

    async def elicit(self, params: t.ElicitRequestParams, legacy: bool = False) -> t.ElicitResult:
        key = self.view.key_for("elicitation/create", params.message)
        found, value = self._scripted(key, params.message)
        where = repr(key or params.message)
        if found:
            result = elicit_result(value, where)
            if isinstance(params, t.ElicitRequestFormParams) and result.action == "accept":
                schema: Any = params.requested_schema
                wrong = problems(
                    schema if isinstance(schema, dict) else schema.model_dump(mode="json", exclude_none=True),
                    dict(result.content or {}),
                )
                if wrong:
                    raise UsageError(f"answer for {where} in the answers file: {wrong}")
            self.console.print(f"[dim]  answers file → {escape(ask_label(params.message, key))}: {result.action}[/]")
            return result
        self._need_person(where, legacy)
        if isinstance(params, t.ElicitRequestURLParams):
            return self.form.ask_url(params, key)
        return self.form.ask_form(params, key)

    async def sample(self, params: t.CreateMessageRequestParams, legacy: bool = False) -> SamplingAnswer:
        text = prompt_text(params)
        key = self.view.key_for("sampling/createMessage", text)
        # An explicit --sampling echo|cmd:... answers sampling; a `*` pattern meant for questions
        # that happens to match the prompt must not override it (an exact key or prompt still does).
        found, value = self._scripted(key, text, patterns=self.sampling in ("ask", "none"))
        if found and isinstance(value, dict) and "content" in value:  # a whole result: tool_use blocks, say
            result = structured_sampling_result(value, repr(key or text))
            self.console.print(
                f"[dim]  answers file → {escape(key or 'sampling')}: {result.stop_reason or 'answer'}[/]"
            )
            return result
        if found:
            completion = value.get("text") if isinstance(value, dict) else value
            if not isinstance(completion, str):
                raise UsageError(f"answer for {key or text!r} must be the completion text")
            label = ask_label(f"sampling: {text}", key)
            self.console.print(f"[dim]  answers file → {escape(label)}: {escape(completion[:60])}[/]")
            return sampling_result(completion)
        if self.sampling == "echo":
            self.console.print(f"[dim]  sampling (echo) → {escape(text[:60])}[/]")
            return sampling_result(text)
        if self.sampling.startswith("json:"):
            answer = command_answer(await run_command(self.sampling[5:], sampling_request_json(params)), repr(key))
            blocks = answer.content if isinstance(answer.content, list) else [answer.content]
            calls = [b.name for b in blocks if isinstance(b, t.ToolUseContent)]
            texts = [b.text for b in blocks if isinstance(b, t.TextContent)]
            shown = f"tool_use {', '.join(calls)}" if calls else " ".join(texts)
            self.console.print(f"[dim]  sampling (json) → {escape(shown[:60])}[/]")
            return answer
        if self.sampling.startswith("cmd:"):
            completion = await run_command(self.sampling[4:], text)
            self.console.print(f"[dim]  sampling (cmd) → {escape(completion[:60])}[/]")
            return sampling_result(completion)
        self._need_person(repr(key or text) if legacy else f"sampling request {key or text[:40]!r}", legacy)
        label = f" [dim]{escape(key)}[/]" if key else ""
        self.console.print()
        self.console.print(f"[bold magenta]sampling[/]{label}  the server asks your LLM (you play it):")
        if params.system_prompt:
            self.console.print(f"  [dim]system:[/] {escape(params.system_prompt)}")
        self.console.print(f"  [dim]prompt:[/] {escape(text)}  [dim](max {params.max_tokens} tokens)[/]")
        for _ in range(20):
            try:
                line = self.console.input(f"  completion ({CANCEL} gives up): ").strip()
            except EOFError:
                line = CANCEL
            if line == CANCEL:
                raise Abandoned("sampling request abandoned")
            if line:
                return sampling_result(line)
        raise Abandoned("no completion given")

    async def list_roots(self) -> list[t.Root]:
        roots = [root_of(r) for r in self.request.roots]
        self.console.print(f"[dim]  roots → {', '.join(str(r.uri) for r in roots)}[/]")
        return roots

    # -- display ----------------------------------------------------------------------------

    def _show_round(self, view: WireView) -> None:
        asks = ", ".join(ask_label(_ask_text(a.method, a.params), a.key) for a in view.asks) or "(nothing: state only)"
        parts = [f"round {view.rounds}", f"asks: {asks}"]
        if view.state_bytes is not None:
            parts.append(f"state {view.state_bytes:,} B")
        if view.instance:
            parts.append(f"instance {view.instance}")
        self.console.rule(f"[bold]{escape(' · '.join(parts))}[/]", align="left", style="blue")
        if self.request.show_state and view.state:
            self.console.print(f"[dim]  requestState:[/] {escape(view.state)}", soft_wrap=True)

    def on_round(self, round_: Round) -> None:
        self.console.print(f"[dim]  ↳ {len(round_.answered)} answer(s) sent back[/]")

    def on_task(self, snapshot: TaskSnapshot) -> None:
        self.view.observe_task(snapshot.raw)  # pushed states are no results: the view learns their keys here
        if self.task_id is None:
            self.task_id = snapshot.task_id
            self.console.rule(f"[bold]durable task {escape(snapshot.task_id)}[/]", align="left", style="magenta")
            self.console.print(f"[dim]  Ctrl-C detaches; `mrtr tasks cancel {escape(snapshot.task_id)}` cancels[/]")
        message = f" — {snapshot.status_message}" if snapshot.status_message else ""
        if snapshot.status == "working":
            self._progress(f"task {snapshot.status}{message}")
            return
        self._pause_progress()
        if snapshot.status == "input_required":
            keys = ", ".join(snapshot.input_keys)
            self.console.print(f"[magenta]  task input_required{escape(message)}[/] [dim]asks: {escape(keys)}[/]")
        else:
            colour = {"completed": "green", "failed": "red"}.get(snapshot.status, "yellow")
            self.console.print(f"[{colour}]  task {snapshot.status}{escape(message)}[/]")

    def _progress(self, description: str) -> None:
        if self.progress is None:
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.progress_task = self.progress.add_task(description, total=None)
            if not self.console.is_terminal:
                self.console.print(f"  {escape(description)}")
        else:
            self.progress.update(self.progress_task, description=description)

    def _pause_progress(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def close(self) -> None:
        self._pause_progress()


def parse_arguments(raw: list[str], json_args: str | None) -> JSONObject:
    """`--json` first, then each `--arg k=v` (values typed later, against the input schema)."""
    arguments: JSONObject = {}
    if json_args:
        try:
            parsed = json.loads(json_args)
        except ValueError as exc:
            raise UsageError(f"--json is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise UsageError("--json must be a JSON object of arguments")
        arguments.update(parsed)
    for item in raw:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--arg takes NAME=VALUE, not {item!r}")
        arguments[name] = value
    return arguments


def typed(arguments: Mapping[str, Any], raw_names: set[str], schema: Mapping[str, Any] | None) -> JSONObject:
    """`--arg` values as strings where the schema wants a string, else as JSON when they parse."""
    properties = (schema or {}).get("properties") or {}
    out = dict(arguments)
    for name in raw_names:
        value = out[name]
        prop = properties.get(name) or {}
        wants_string = prop.get("type") == "string" or (
            "type" not in prop and not any(k in prop for k in ("anyOf", "oneOf")) and name in properties
        )
        if wants_string:
            continue
        with contextlib.suppress(ValueError):
            out[name] = json.loads(value)
    return out


def build_transport(request: CallRequest, view: WireView) -> Any:
    if request.stdio:
        argv = shlex.split(request.stdio)
        if not argv:
            raise UsageError("--stdio needs a command")
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
        return ObservedTransport(stdio_client(params), view)
    url = request.url or ""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"URL must start with http:// or https://, not {url!r} (or use --stdio 'command ...')")
    return http_transport(url, view)


async def run_call(request: CallRequest, console: Console, out: Console, interactive: bool) -> int:
    """Drive the call; returns the exit code (errors are raised as `CliError`s)."""
    session = CallSession(request, console, interactive)
    http: httpx2.AsyncClient | None = None
    if request.url is not None and request.stdio is None and not request.legacy:
        # 2026-07-28 over mrtr's own transport (resends after 502s and resets), observed.
        http = observed_http_client(session.view)
        server: Any = request.url
        if not request.url.startswith(("http://", "https://")):
            raise UsageError(
                f"URL must start with http:// or https://, not {request.url!r} (or use --stdio 'command ...')"
            )
    else:
        server = build_transport(request, session.view)
    client = FlowClient(
        server,
        http_client=http,
        on_result=(lambda method, result: session.view.observe_result(result, method)) if http is not None else None,
        elicitation_callback=session.on_elicit,
        sampling_callback=None if session.sampling == "none" else session.on_sample,
        sampling_tools=session.sampling.startswith("json:"),  # the command sees the tools, may answer tool_use
        roots=session.list_roots if request.roots else None,
        mode="legacy" if request.legacy else "auto",
        max_rounds=request.max_rounds,
        on_round=session.on_round,
        tasks=request.tasks,
        on_task=session.on_task,
    )
    try:
        async with client:
            target = request.tool or request.prompt or request.resource or ""
            where = request.url or f"stdio: {request.stdio}"
            console.print(f"[bold]mrtr call[/] {escape(target)} [dim]@ {escape(where)}[/]")
            if request.resource is not None:
                result: Any = await client.read_resource(request.resource)
            elif request.prompt is not None:
                await _check_listed(client, "prompt", request.prompt)
                result = await client.get_prompt(request.prompt, {k: str(v) for k, v in request.arguments.items()})
            else:
                schema = await _check_listed(client, "tool", request.tool or "")
                arguments = typed(request.arguments, set(request.raw_args), schema)
                result = await client.call_tool(request.tool or "", arguments)
    except Exception:
        if session.failure is not None:  # the server's error only echoes why we could not answer it
            raise session.failure from None
        raise
    finally:
        session.close()
        if http is not None:
            await http.aclose()
    if session.failure is not None:  # the flow went on without the answer: the run still lacked it
        raise session.failure
    return show_result(result, out, request.output, console)


def _page(cursor: str | None) -> t.PaginatedRequestParams | None:
    return t.PaginatedRequestParams(cursor=cursor) if cursor is not None else None


async def _check_listed(client: FlowClient, kind: str, name: str) -> JSONObject | None:
    """The tool's input schema (or None for a prompt); unknown names are a one-line usage error."""
    names: list[str] = []
    cursor: str | None = None
    for _ in range(_LIST_PAGES):
        if kind == "tool":
            page: Any = await client.session.list_tools(params=_page(cursor))
            for tool in page.tools:
                if tool.name == name:
                    return tool.input_schema if isinstance(tool.input_schema, dict) else dict(tool.input_schema)
                names.append(tool.name)
        else:
            page = await client.session.list_prompts(params=_page(cursor))
            for prompt in page.prompts:
                if prompt.name == name:
                    return None
                names.append(prompt.name)
        cursor = page.next_cursor
        if not cursor:
            break
    offered = ", ".join(names) or "none"
    raise UsageError(f"unknown {kind} {name!r}; the server offers: {offered}")


def show_result(result: Any, out: Console, output: str, console: Console) -> int:
    """Print the final result on stdout (`--output json`: the result as JSON, for scripts)."""
    wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    is_error = bool(getattr(result, "is_error", False))
    if output == "json":
        out.print_json(json.dumps(wire), highlight=False)
        return EXIT_TOOL_ERROR if is_error else EXIT_OK
    console.rule("[bold red]tool error[/]" if is_error else "[bold green]result[/]", align="left")
    if isinstance(result, t.CallToolResult):
        structured = result.structured_content
        wrapped = isinstance(structured, dict) and list(structured) == ["result"]  # a plain return value
        if structured is not None and not is_error and not wrapped:
            out.print_json(json.dumps(result.structured_content))
        else:
            for block in result.content:
                _print_block(out, block.model_dump(mode="json", by_alias=True, exclude_none=True))
    elif isinstance(result, t.GetPromptResult):
        for message in result.messages:
            out.print(f"[bold]{message.role}:[/]", end=" ")
            _print_block(out, message.content.model_dump(mode="json", by_alias=True, exclude_none=True))
    elif isinstance(result, t.ReadResourceResult):
        for content in result.contents:
            data = content.model_dump(mode="json", by_alias=True, exclude_none=True)
            text = data.get("text")
            if isinstance(text, str) and data.get("mimeType") == "application/json":
                try:
                    out.print_json(text)
                    continue
                except ValueError:
                    pass
            out.print(escape(text) if isinstance(text, str) else json.dumps(data), highlight=False)
    else:
        out.print_json(json.dumps(wire))
    return EXIT_TOOL_ERROR if is_error else EXIT_OK


def _print_block(out: Console, block: Mapping[str, Any]) -> None:
    if block.get("type") == "text":
        out.print(escape(str(block.get("text", ""))), highlight=False)
    else:
        out.print_json(json.dumps(block))


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def ask_label(question: str, key: str | None) -> str:
    """How `mrtr call` names one ask everywhere it prints one: its question, then its wire key.

    Keys are the server's (`elicit_3x61SgSn95`), opaque to a person; the question says what
    was asked, the key is what an answers file may be keyed by.
    """
    text = " ".join(question.split())
    text = f"{text[:57]}..." if len(text) > 60 else text
    return f'"{text}" ({key})' if key else f'"{text}"'


def _ask_text(method: str, params: Mapping[str, Any]) -> str:
    if method == "elicitation/create":
        return str(params.get("message", ""))
    if method == "sampling/createMessage":
        return "sampling"
    return method.partition("/")[0] or "ask"


__all__ = [
    "CallRequest",
    "ask_label",
    "CallSession",
    "build_transport",
    "parse_arguments",
    "run_call",
    "show_result",
    "stdin_is_terminal",
    "typed",
]
