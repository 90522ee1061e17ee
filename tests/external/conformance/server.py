"""Fixtures for the official MCP conformance suite (server mode), served over streamable HTTP.

Usage:
    python tests/external/conformance/server.py --port PORT     # http://127.0.0.1:PORT/mcp (0: any free port)
    ... [--store URL]    # where tasks live: sqlite:///PATH, redis://..., postgresql://...
                         # (default: SQLite in a temporary file, deleted on exit)
    ... [--temporal HOST:PORT --task-queue Q]   # or: tasks run on Temporal (`mrtr.temporal`)
                         # (also read from MRTR_CONFORMANCE_TEMPORAL / MRTR_CONFORMANCE_TASK_QUEUE)

Why this exists: the suite (`@modelcontextprotocol/conformance`, `--suite all --spec-version
2026-07-28`) probes a server by name — fixed tools, prompts and resources it calls and checks.
The 14 `input-required-result-*` (MRTR) scenarios are the point: every one of their fixtures is
an **mrtr flow** (`@flows.tool()` / `@flows.prompt()` awaiting `ctx.elicit/sample/list_roots/
gather`), never a hand-built `InputRequiredResult`, so a passing run is evidence about mrtr, not
about this file. Where the suite needs a wire key it dictates (`user_name`, `step1`...), the flow
names it with `key=`; where a scenario answers a key without any prior round (no
`requestState`), the ask says `allow_preanswer=True`.

The tasks scenarios (`tasks-*`, SEP-2663, conformance.md §6) are served the same way: their
seven fixtures (`greet`, `slow_compute`, `failing_job`, `protocol_error_job`, `confirm_delete`,
`multi_input`, `test_tool_with_task`) are mrtr flows registered with `@flows.tool(task=...)`,
and the task surface (`tasks/get`, `tasks/update`, `tasks/cancel`) is mrtr's own tasks
extension over a real `TaskStore`.

Everything else here (content-type tools, prompts, resources, completion, the SEP-2575
diagnostics, a `x-mcp-header` tool, a JSON Schema 2020-12 tool) is a plain SDK fixture modelled
on the scenario descriptions bundled with the suite (and on the python-sdk "everything-server"),
so the non-MRTR scenarios can pass too. What still fails because of the SDK itself is listed,
per check and with reasons, in `tests/external/conformance/expected-failures.yml`.

Once listening, the process prints one line `READY_PREFIX URL` on stdout (spawners wait for it;
a bare GET /mcp would open a never-ending SSE stream, so it is no readiness probe).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Protocol, TypeVar

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mcp_types as t  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.server.mcpserver.prompts.base import UserMessage  # noqa: E402
from mcp.server.mcpserver.tools.base import Tool  # noqa: E402
from mcp.server.request_state import RequestStateSecurity  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

import mrtr  # noqa: E402
from mrtr.stores import TaskStore, open_store  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

SERVER_NAME = "mrtr-conformance-fixtures"
SERVER_VERSION = mrtr.__version__
READY_PREFIX = "mrtr conformance fixtures ready:"
"""First stdout line once uvicorn listens, followed by the URL (see tests/external/conformance/harness.py)."""

# A 1x1 PNG and a tiny WAV header, as in the python-sdk everything-server.
TEST_IMAGE_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
TEST_AUDIO_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

JSON_SCHEMA_2020_12_TOOL = "json_schema_2020_12_tool"
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}
"""Verbatim from the `json-schema-2020-12` scenario: the listing must keep every keyword."""


# -- MRTR fixtures: all mrtr flows ------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


class Name(BaseModel):
    name: str


class Color(BaseModel):
    color: str


class Ok(BaseModel):
    ok: bool


class PromptContext(BaseModel):
    context: str


class FlowRegistry(Protocol):
    """What `add_mrtr_fixtures` needs of a flow registry: `mrtr.Flows` (on the SDK's MCPServer)
    and `mrtr.fastmcp.Flows` (on FastMCP, see tests/external/conformance/fastmcp_server.py) both fit."""

    def tool(self, name: str | None = None, *, description: str | None = None) -> Callable[[F], F]: ...

    def prompt(self, name: str | None = None, *, description: str | None = None) -> Callable[[F], F]: ...


def add_mrtr_fixtures(flows: FlowRegistry) -> None:
    """The fixtures of the 14 `input-required-result-*` scenarios (conformance.md §4).

    The same flows whichever host registers them: the SDK's MCPServer here, FastMCP in
    tests/external/conformance/fastmcp_server.py.
    """

    @flows.tool(description="MRTR: asks the user's name (key user_name), then greets them.")
    async def test_input_required_result_elicitation(ctx: mrtr.FlowContext) -> str:
        # Pre-answerable: `ignore-extra-params` sends `user_name` on the first and only call,
        # with no requestState, and expects completion. A wrong-typed answer (`validate-input`)
        # or a missing one (`missing-input-response`) is simply asked again.
        answer = await ctx.elicit("What is your name?", Name, key="user_name", allow_preanswer=True)
        return f"Hello, {answer.name}!"

    @flows.tool(description="MRTR: asks the client's LLM (key capital_question), returns its answer.")
    async def test_input_required_result_sampling(ctx: mrtr.FlowContext) -> str:
        completion = await ctx.sample("What is the capital of France?", max_tokens=100, key="capital_question")
        return f"The model said: {_text_of(completion)}"

    @flows.tool(description="MRTR: asks the client's roots (key client_roots), returns them.")
    async def test_input_required_result_list_roots(ctx: mrtr.FlowContext) -> str:
        roots = await ctx.list_roots(key="client_roots")
        return "Roots: " + ", ".join(str(root.uri) for root in roots)

    @flows.tool(description="MRTR: one confirmation (key confirm); the journal rides in requestState.")
    async def test_input_required_result_request_state(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("Please confirm", Ok, key="confirm")
        # Reaching this line means the sealed requestState was verified and replayed.
        return f"state-ok: confirmed={answer.ok}"

    @flows.tool(description="MRTR: elicitation, sampling and roots asked together in one round.")
    async def test_input_required_result_multiple_inputs(ctx: mrtr.FlowContext) -> str:
        name, greeting, roots = await ctx.gather(
            ctx.elicit("What is your name?", Name, key="user_name"),
            ctx.sample("Generate a greeting", max_tokens=50, key="greeting"),
            ctx.list_roots(key="client_roots"),
        )
        return f"{_text_of(greeting)} {name.name} (roots: {len(roots)})"

    @flows.tool(description="MRTR: two rounds (step1 name, step2 color), a new requestState each time.")
    async def test_input_required_result_multi_round(ctx: mrtr.FlowContext) -> str:
        name = await ctx.elicit("Step 1: What is your name?", Name, key="step1")
        color = await ctx.elicit("Step 2: What is your favorite color?", Color, key="step2")
        return f"{name.name} likes {color.color}"

    @flows.prompt(description="MRTR on prompts/get: asks what context to use (key user_context).")
    async def test_input_required_result_prompt(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("What context should the prompt use?", PromptContext, key="user_context")
        return f"Use this context: {answer.context}"

    @flows.tool(description="MRTR: one confirmation; a tampered requestState is rejected before this runs.")
    async def test_input_required_result_tampered_state(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("Please confirm", Ok, key="confirm")
        return f"confirmed={answer.ok}"

    @flows.tool(description="MRTR: prefers asking the user; degrades to the LLM when elicitation is undeclared.")
    async def test_input_required_result_capabilities(ctx: mrtr.FlowContext) -> str:
        if ctx.client_supports("elicitation"):
            answer = await ctx.elicit("What is your name?", Name, key="user_name")
            return f"Hello, {answer.name}!"
        completion = await ctx.sample("Suggest a name for a new user", max_tokens=20, key="suggested_name")
        return f"Hello, {_text_of(completion)}!"


def _text_of(result: t.CreateMessageResult) -> str:
    content = result.content
    return content.text if isinstance(content, t.TextContent) else f"({content.type} answer)"


# -- tasks fixtures (SEP-2663): all mrtr flows ---------------------------------------------------

FAILING_JOB_SECONDS = 1.0
"""`failing_job` reports its tool error "after ~1s" (the scenario's fixture description)."""


class Confirm(BaseModel):
    confirm: bool


def add_task_fixtures(flows: mrtr.Flows) -> None:
    """The fixtures of the `tasks-*` scenarios (conformance.md §6), as task-enabled flows.

    Which tools may become tasks is server-internal (there is no wire declaration), so each
    fixture says it with `task=`: `"never"` for the sync-only `greet`, `"optional"` for tools
    that run as a task only when the request declares the extension, `"required"` for tools
    that refuse other clients with -32021.
    """

    @flows.tool(description="Tasks: sync only, never a task (even with a legacy `task` param).")
    async def greet(name: str, ctx: mrtr.FlowContext) -> str:
        return f"Hello, {name}!"

    @flows.tool(task="optional", description="Tasks: sleeps `seconds` (a step), then reports; a task when declared.")
    async def slow_compute(seconds: float, label: str = "", *, ctx: mrtr.FlowContext) -> str:
        # The sleep is the flow's one side effect, so it is a step: a replay after the
        # task is resumed elsewhere returns the journaled result instead of sleeping again,
        # and `tasks/cancel` cancels the flow right here, ending the task `cancelled`.
        await ctx.step("compute", asyncio.sleep, seconds)
        return f"{label or 'slow_compute'}: done after {seconds:g}s"

    @flows.tool(task="required", description="Tasks: task only; works ~1s, then ends with a tool error (isError).")
    async def failing_job(ctx: mrtr.FlowContext) -> str:
        await ctx.step("work", asyncio.sleep, FAILING_JOB_SECONDS)
        # A ToolError is a tool execution error: the task ends `completed` with isError.
        raise ToolError("failing_job failed on purpose (a tool execution error)")

    @flows.tool(task="optional", description="Tasks: fails with a JSON-RPC error; as a task it ends `failed`.")
    async def protocol_error_job(ctx: mrtr.FlowContext) -> str:
        # An MCPError is a protocol error: the task ends `failed` with it as `error`.
        raise MCPError(code=t.INTERNAL_ERROR, message="protocol_error_job failed on purpose (a protocol error)")

    @flows.tool(task="optional", description="Tasks: asks to confirm deleting `filename` (one elicitation).")
    async def confirm_delete(filename: str, ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit(f"Delete {filename}?", Confirm)
        return f"Deleted {filename}" if answer.confirm else f"Kept {filename}"

    @flows.tool(task="optional", description="Tasks: asks two questions at once (two keys pending together).")
    async def multi_input(ctx: mrtr.FlowContext) -> str:
        who, go = await ctx.gather(ctx.elicit("What is your name?", Name), ctx.elicit("Proceed?", Confirm))
        return f"{who.name}: {'proceeding' if go.confirm else 'stopped'}"

    @flows.tool(
        task="required",
        mrtr_first=True,
        description="Tasks: asks a name inline (MRTR, key user_name), then continues as a task that greets.",
    )
    async def test_tool_with_task(ctx: mrtr.FlowContext) -> str:
        # Round 1 is an ordinary MRTR round (no task yet); the round that brings the answer
        # reaches continue_as_task() and returns the CreateTaskResult (SEP-2663 composition).
        who = await ctx.elicit("What is your name?", Name, key="user_name")
        await ctx.continue_as_task()
        return f"Hello, {who.name}! (finished as a task)"


# -- SEP-2575 (server-stateless) diagnostics ----------------------------------------------------


def add_stateless_diagnostics(server: MCPServer[Any], flows: mrtr.Flows) -> None:
    """Tools the `server-stateless` scenario calls by name to probe per-request behaviour."""

    @flows.tool(description="Needs the client's LLM and never degrades: undeclared sampling -> -32021.")
    async def test_missing_capability(ctx: mrtr.FlowContext) -> str:
        completion = await ctx.sample("Say hello", max_tokens=10)
        return _text_of(completion)

    @flows.tool(description="Asks the user mid-call: on 2026-07-28 that is an input_required result, not a request.")
    async def test_streaming_elicitation(ctx: mrtr.FlowContext) -> str:
        answer = await ctx.elicit("What is your name?", Name)
        return f"Hello, {answer.name}!"

    @server.tool(description="Logs three messages; without a logLevel in _meta none may reach the client.")
    async def test_logging_tool(ctx: Context) -> str:
        for line in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await ctx.info(line)
        return "Tool with logging executed successfully"

    async def test_dynamic_tool() -> str:
        """Appears and disappears with each test_trigger_tool_change call."""
        return "dynamic"

    async def test_dynamic_prompt() -> str:
        """Appears and disappears with each test_trigger_prompt_change call."""
        return "dynamic"

    @server.tool(description="Toggles a tool in or out of tools/list and notifies listen streams.")
    async def test_trigger_tool_change(ctx: Context) -> str:
        names = {tool.name for tool in await server.list_tools()}
        if test_dynamic_tool.__name__ in names:
            server.remove_tool(test_dynamic_tool.__name__)
        else:
            server.add_tool(test_dynamic_tool)
        await ctx.notify_tools_changed()
        return "tools changed"

    @server.tool(description="Toggles a prompt in or out of prompts/list and notifies listen streams.")
    async def test_trigger_prompt_change(ctx: Context) -> str:
        names = {prompt.name for prompt in await server.list_prompts()}
        if test_dynamic_prompt.__name__ in names:
            server.remove_prompt(test_dynamic_prompt.__name__)
        else:
            server.prompt()(test_dynamic_prompt)
        await ctx.notify_prompts_changed()
        return "prompts changed"


# -- plain fixtures for the other scenarios ---------------------------------------------------


def add_plain_fixtures(server: MCPServer[Any]) -> None:
    """Tools, prompts, resources and completion named by the non-MRTR scenarios."""

    @server.tool(description="Tests simple text content response")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @server.tool(description="Tests image content response")
    def test_image_content() -> list[t.ImageContent]:
        return [t.ImageContent(data=TEST_IMAGE_BASE64, mime_type="image/png")]

    @server.tool(description="Tests audio content response")
    def test_audio_content() -> list[t.AudioContent]:
        return [t.AudioContent(data=TEST_AUDIO_BASE64, mime_type="audio/wav")]

    @server.tool(description="Tests embedded resource content response")
    def test_embedded_resource() -> list[t.EmbeddedResource]:
        contents = t.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        )
        return [t.EmbeddedResource(resource=contents)]

    @server.tool(description="Tests response with multiple content types (text, image, resource)")
    def test_multiple_content_types() -> list[t.TextContent | t.ImageContent | t.EmbeddedResource]:
        contents = t.TextResourceContents(
            uri="test://mixed-content-resource", mime_type="application/json", text='{"test": "data", "value": 123}'
        )
        return [
            t.TextContent(text="Multiple content types test:"),
            t.ImageContent(data=TEST_IMAGE_BASE64, mime_type="image/png"),
            t.EmbeddedResource(resource=contents),
        ]

    @server.tool(description="Tests error response handling")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool(description="Tests tool that reports progress notifications")
    async def test_tool_with_progress(ctx: Context) -> str:
        for progress in (0, 50, 100):
            await ctx.report_progress(progress=progress, total=100, message=f"Completed step {progress} of 100")
            if progress < 100:
                await asyncio.sleep(0.05)
        return "progress reported"

    @server.tool(description="Has a string argument mirrored into the Mcp-Param-Region header (SEP-2243)")
    def test_custom_header(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        return f"region={region}"

    @server.resource("test://static-text", mime_type="text/plain", description="A static text resource for testing")
    def static_text_resource() -> str:
        return "This is the content of the static text resource."

    @server.resource("test://static-binary", mime_type="image/png", description="A static binary resource (image)")
    def static_binary_resource() -> bytes:
        return base64.b64decode(TEST_IMAGE_BASE64)

    @server.resource(
        "test://template/{id}/data", mime_type="application/json", description="A resource template with parameters"
    )
    def template_resource(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.prompt(description="A simple prompt without arguments")
    def test_simple_prompt() -> list[UserMessage]:
        return [UserMessage("This is a simple prompt for testing.")]

    @server.prompt(description="A prompt with required arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @server.prompt(description="A prompt that includes an embedded resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        contents = t.TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(t.EmbeddedResource(resource=contents)),
            UserMessage("Please process the embedded resource above."),
        ]

    @server.prompt(description="A prompt that includes image content")
    def test_prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(t.ImageContent(data=TEST_IMAGE_BASE64, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]

    @server.completion()
    async def complete(
        ref: t.PromptReference | t.ResourceTemplateReference,
        argument: t.CompletionArgument,
        context: t.CompletionContext | None,
    ) -> t.Completion:
        # The scenario only needs a well-formed answer; offer the value itself as a candidate.
        return t.Completion(values=[argument.value] if argument.value else [], total=None, has_more=False)


def json_schema_2020_12_tool() -> Tool:
    """The `json-schema-2020-12` fixture: a tool listed with an author-supplied 2020-12 schema.

    The SDK derives a tool's inputSchema from its signature; this scenario checks that a
    hand-written schema is listed untouched, so the prebuilt `Tool` gets it explicitly and is
    handed to `MCPServer(tools=[...])`.
    """

    def contact(
        name: str | None = None,
        address: dict[str, Any] | None = None,
        contactMethod: str | None = None,
        phone: str | None = None,
        email: str | None = None,
    ) -> str:
        return f"contact {name or 'someone'} by {contactMethod or 'email'}"

    tool = Tool.from_function(
        contact, name=JSON_SCHEMA_2020_12_TOOL, description="Tool with JSON Schema 2020-12 features"
    )
    tool.parameters = JSON_SCHEMA_2020_12
    return tool


def build_server(store: TaskStore | None, tasks: Any = None) -> tuple[MCPServer[Any], mrtr.Flows]:
    """One server with every fixture; a fresh process-local key seals each `requestState`.

    `tasks`: another task engine (e.g. `mrtr.temporal.TemporalTasks`) instead of the lease
    runtime over `store`; the fixtures are the same flows either way.
    Returns the `Flows` too, so the caller can stop its task runtime before closing `store`.
    """
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        version=SERVER_VERSION,
        request_state_security=RequestStateSecurity.ephemeral(),
        tools=[json_schema_2020_12_tool()],
    )
    # The harness polls tasks every 200 ms; say so, instead of the 500 ms default.
    flows = mrtr.Flows(server, store=store, task_poll_interval=0.2, tasks=tasks)
    add_mrtr_fixtures(flows)
    add_task_fixtures(flows)
    add_stateless_diagnostics(server, flows)
    add_plain_fixtures(server)
    return server, flows


@contextlib.asynccontextmanager
async def task_store(url: str | None) -> AsyncIterator[TaskStore]:
    """The fixtures' store: `url`'s, or by default SQLite in a temporary file removed on exit.

    A file rather than `:memory:` so the default exercises the same code path as a real
    deployment (WAL, the worker thread, the busy timeout).
    """
    with contextlib.ExitStack() as files:
        if url is None:
            from mrtr.stores._sqlite import SQLiteStore

            tmp = files.enter_context(tempfile.TemporaryDirectory(prefix="mrtr-conformance-tasks-"))
            store: TaskStore = SQLiteStore(str(Path(tmp) / "tasks.db"))
        else:
            store = open_store(url, namespace="mrtr_conformance_tasks")
        try:
            yield store
        finally:
            await store.close()


async def serve(server: MCPServer[Any], port: int) -> None:
    """Serve on 127.0.0.1:`port` (0 = any free port), print the ready line, run until killed.

    `stateless_http=True`: the suite speaks 2026-07-28 only, whose requests are
    self-contained POSTs; no session state is kept between them.
    """
    await serve_http(server.streamable_http_app(stateless_http=True), port, READY_PREFIX)


async def run(port: int, store_url: str | None, temporal: str | None = None, task_queue: str = "") -> None:
    """Serve every fixture until stopped, then stop running tasks before the store closes."""
    if temporal:
        from temporalio.client import Client

        from mrtr.temporal import TemporalTasks

        engine = TemporalTasks(await Client.connect(temporal), task_queue=task_queue or "mrtr-conformance")
        server, flows = build_server(None, engine)
        try:
            await serve(server, port)  # the worker starts with the first task request
        finally:
            await flows.runtime.close()
        return
    async with task_store(store_url) as store:
        server, flows = build_server(store)
        try:
            await serve(server, port)
        finally:
            await flows.runtime.close()


class Terminated(Exception):
    """SIGTERM arrived: unwinds `run` so the task runtime, the store and the temporary file close.

    uvicorn shuts down gracefully on SIGTERM and then re-raises the signal under the handler
    that was there before it; with the default handler the process would die right there,
    skipping every `finally` (and leaving the temporary SQLite file behind on each run).
    """


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="task store: sqlite:///PATH, redis://..., postgresql://... (default: SQLite in a temporary file)",
    )
    parser.add_argument(
        "--temporal",
        default=os.environ.get("MRTR_CONFORMANCE_TEMPORAL"),
        metavar="HOST:PORT",
        help="run tasks on this Temporal frontend (mrtr.temporal) instead of a store",
    )
    parser.add_argument("--task-queue", default=os.environ.get("MRTR_CONFORMANCE_TASK_QUEUE", ""))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _raise_terminated)
    # Orderly stops: SIGTERM (tests/support/servers.py) or Ctrl-C; either way the `finally`s have run.
    with contextlib.suppress(Terminated, KeyboardInterrupt):
        asyncio.run(run(args.port, args.store, args.temporal, args.task_queue))


if __name__ == "__main__":
    main()
