"""Drive the deployer's `deploy` flow by hand, one round per request, across instances.

Under MCP 2026-07-28 a server never calls the client back: it ends the request with
`input_required`, listing its questions and an opaque `requestState`. This client
answers the questions and sends a *new* `tools/call` carrying the answers and the
state, echoed verbatim. Each round goes to the next URL given on the command line, so
with two instances the rounds alternate A, B, A, ... and the output shows that any
instance can pick the flow up (the `X-Mrtr-Instance` response header names who answered).

With `--migrate` it drives the durable `migrate` task instead (servers started with
`MRTR_STORE`): `tools/call` on the first URL only *creates* the task (a `CreateTaskResult`
with its `taskId`); the client then follows it on the last URL with `tasks/get` polls and
answers its question with `tasks/update`. No round carries state: the journal is in the
servers' shared store, so the instance that started the task may die meanwhile.

Answers come from the keyboard when stdin is a terminal, from a script otherwise
(`--scripted` forces the script). Sampling is always scripted: there is no LLM here.

Usage:
    python examples/deployer_client.py http://127.0.0.1:8001/mcp http://127.0.0.1:8002/mcp
    python examples/deployer_client.py URL_A URL_B --scripted --scenario staging
    python examples/deployer_client.py URL_A URL_B --migrate        # start on A, follow on B
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import httpx2
import mcp_types as t
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from mrtr.client import CreatedTask, TasksClient, get_task, update_task

INSTANCE_HEADER = "x-mrtr-instance"
MODERN = "2026-07-28"

SAMPLING_NOTE = "scripted stand-in for an LLM"

# Scripted answers by wire key (the deployer uses readable explicit keys). A list is
# consumed one entry per time the key is asked: a re-ask gets the next entry.
SCENARIOS: dict[str, dict[str, list[Any]]] = {
    "production": {
        "target": [{"environment": "production"}],
        "service_1": [{"service": "api"}],
        "service_2": [{"service": "worker"}],
        "service_3": [{"done": True}],
        "approve_api": [{"approve": True}],
        "approve_worker": [{"approve": False}],
        # The first ticket breaks the schema's pattern: the server asks again.
        "ticket": [{"ticket": "1234"}, {"ticket": "CHG-1234"}],
    },
    "staging": {
        "target": [{"environment": "staging"}],
        "service_1": [{"service": "api", "done": True}],
        "confirm": [{"approve": True}],
    },
    "decline": {
        "target": ["decline"],
    },
}
# Scripted answers for the `migrate` task (same format).
MIGRATION_SCRIPT: dict[str, list[Any]] = {"cutover": [{"switch": True}]}
SCRIPTED_ROOTS = ["file:///srv/shop"]
SCRIPTED_RISK = "The worker's schema migration may lock the orders table for ~30 s; deploy off-peak."


# -- answering ----------------------------------------------------------------------------------


def scripted_elicitation(script: dict[str, list[Any]], key: str) -> t.ElicitResult:
    """The next scripted answer for `key`; unknown keys (and exhausted lists) are declined."""
    queue = script.get(key, [])
    answer: Any = queue.pop(0) if queue else "decline"
    if answer in ("decline", "cancel"):
        return t.ElicitResult(action=answer)
    return t.ElicitResult(action="accept", content=answer)


def interactive_elicitation(key: str, params: t.ElicitRequestFormParams) -> t.ElicitResult:
    """Ask on the terminal, field by field; `/decline` or `/cancel` at any prompt refuses."""
    print(f"  ? [{key}] {params.message}")
    content: dict[str, Any] = {}
    schema = params.requested_schema
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        while True:
            hint = _field_hint(prop, name in required)
            raw = input(f"      {prop.get('description') or name} {hint}: ").strip()
            if raw in ("/decline", "/cancel"):
                return t.ElicitResult(action="decline" if raw == "/decline" else "cancel")
            if not raw:
                if name not in required:
                    break
                print("      (required)")
                continue
            value = _parse_field(prop, raw)
            if value is None:
                print(f"      (expected {_field_hint(prop, name in required)})")
                continue
            content[name] = value
            break
    return t.ElicitResult(action="accept", content=content)


def _field_hint(prop: Mapping[str, Any], required: bool) -> str:
    if "enum" in prop:
        choices = "|".join(prop["enum"])
    elif prop.get("type") == "boolean":
        choices = "y|n"
    else:
        choices = prop.get("type", "text")
    default = f", default {prop['default']!r}" if "default" in prop else ""
    return f"[{choices}{default}{'' if required else ', optional'}]"


def _parse_field(prop: Mapping[str, Any], raw: str) -> Any:
    kind = prop.get("type")
    if "enum" in prop:
        return raw if raw in prop["enum"] else None
    if kind == "boolean":
        return {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}.get(raw.lower())
    if kind in ("integer", "number"):
        try:
            return int(raw) if kind == "integer" else float(raw)
        except ValueError:
            return None
    return raw


@dataclass
class Answerer:
    """Turns each `InputRequest` into its bare result, and says how it came up with it."""

    interactive: bool
    script: dict[str, list[Any]] = field(default_factory=dict)

    def answer(self, key: str, request: t.InputRequest) -> tuple[t.InputResponse, str]:
        if isinstance(request, t.ElicitRequest):
            params = request.params
            if isinstance(params, t.ElicitRequestURLParams):
                # This client opens no browser: consent only, as the spec's URL mode defines.
                return t.ElicitResult(action="accept"), f"consent to open {params.url}"
            if self.interactive:
                result, how = interactive_elicitation(key, params), "you"
            else:
                result, how = scripted_elicitation(self.script, key), "scripted"
            return result, f"{result.action} {json.dumps(result.content) if result.content else ''} ({how})"
        if isinstance(request, t.CreateMessageRequest):
            sampled = t.CreateMessageResult(
                role="assistant", content=t.TextContent(type="text", text=SCRIPTED_RISK), model="scripted-no-llm"
            )
            return sampled, f"{SCRIPTED_RISK!r} ({SAMPLING_NOTE})"
        roots = [t.Root.model_validate({"uri": uri, "name": "workspace"}) for uri in SCRIPTED_ROOTS]
        return t.ListRootsResult(roots=roots), f"roots {SCRIPTED_ROOTS} (scripted)"


# -- printing -----------------------------------------------------------------------------------


def describe(request: t.InputRequest) -> str:
    """One line saying what the server asked."""
    if isinstance(request, t.ElicitRequest):
        params = request.params
        if isinstance(params, t.ElicitRequestURLParams):
            return f"elicitation (url): {params.message} -> {params.url}"
        fields = ", ".join(params.requested_schema.get("properties", {}))
        return f"elicitation: {params.message!r} [fields: {fields}]"
    if isinstance(request, t.CreateMessageRequest):
        first = request.params.messages[0].content
        text = first.text if isinstance(first, t.TextContent) else type(first).__name__
        return f"sampling: {text!r} (max {request.params.max_tokens} tokens)"
    return "roots/list"


def summarize(result: t.CallToolResult) -> str:
    """The final result, readable: the deployer's structured report when there is one."""
    if result.is_error:
        text = " ".join(c.text for c in result.content if isinstance(c, t.TextContent))
        return f"tool error: {text}"
    report = result.structured_content or {}
    lines = [f"status: {report.get('status')}  app: {report.get('app')}  environment: {report.get('environment')}"]
    for name in ("services", "workspace", "plan_id", "planned_on", "risk", "ticket", "skipped"):
        if report.get(name) not in (None, []):
            lines.append(f"{name}: {report[name]}")
    for rollout in report.get("rolled_out", []):
        lines.append(
            f"rolled out {rollout['service']}: receipt {rollout['receipt']} on instance {rollout['ran_on']} "
            f"(idempotency key {rollout['idempotency_key']})"
        )
    return "\n".join(lines)


def summarize_migration(result: t.CallToolResult) -> str:
    """The `migrate` task's final result, readable."""
    if result.is_error:
        return "tool error: " + " ".join(c.text for c in result.content if isinstance(c, t.TextContent))
    report = result.structured_content or {}
    lines = [
        f"status: {report.get('status')}  app: {report.get('app')}  schema: {report.get('schema_version')}",
        f"backup {report.get('backup')} taken on instance {report.get('backed_up_on')}",
        f"schema migrated on instance {report.get('migrated_on')} (idempotency key {report.get('idempotency_key')})",
    ]
    if report.get("switched_on"):
        lines.append(f"traffic switched on instance {report['switched_on']}")
    return "\n".join(lines)


# -- driving ------------------------------------------------------------------------------------


@dataclass
class Endpoint:
    """One server URL with its own client; `last_instance` is the header of its latest response."""

    url: str
    client: Client
    last_instance: str = "?"


@asynccontextmanager
async def connect(url: str, *, tasks: bool = False) -> AsyncIterator[Endpoint]:
    """A modern-mode `Client` for `url` whose HTTP responses report the answering instance.

    `tasks=True` declares the tasks extension (through `TasksClient`), which a
    `task="required"` tool demands; the task is then followed by hand, never by the extension.
    """

    async def on_response(response: httpx2.Response) -> None:
        endpoint.last_instance = response.headers.get(INSTANCE_HEADER, "?")

    async def never(*_: Any) -> NoReturn:  # callbacks only declare capabilities; we answer by hand
        raise RuntimeError("this client drives input_required rounds itself")

    async def no_elicitation(context: ClientRequestContext, params: t.ElicitRequestParams) -> t.ElicitResult:
        return await never()

    async def no_sampling(context: ClientRequestContext, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return await never()

    async def no_roots(context: ClientRequestContext) -> t.ListRootsResult:
        return await never()

    timeout = httpx2.Timeout(30.0, read=60.0)
    async with httpx2.AsyncClient(timeout=timeout, trust_env=False, event_hooks={"response": [on_response]}) as http:
        client = Client(
            streamable_http_client(url, http_client=http),
            mode="auto",
            extensions=[TasksClient(never)] if tasks else [],
            elicitation_callback=no_elicitation,
            sampling_callback=no_sampling,
            list_roots_callback=no_roots,
        )
        endpoint = Endpoint(url, client)
        async with client:
            if client.protocol_version != MODERN:
                raise SystemExit(f"{url} speaks {client.protocol_version}; manual rounds need {MODERN}")
            await client.list_tools()  # so the session knows the tool's schemas
            yield endpoint


async def drive(
    urls: list[str],
    app: str,
    answerer: Answerer,
    *,
    out: Callable[[str], None] = print,
    max_rounds: int = 20,
) -> t.CallToolResult:
    """Run one `deploy` flow to the end, round i going to `urls[i % len(urls)]`."""
    async with AsyncExitStack() as stack:
        endpoints = [await stack.enter_async_context(connect(url)) for url in urls]
        responses: dict[str, t.InputResponse] | None = None
        state: str | None = None
        for round_no in range(1, max_rounds + 1):
            endpoint = endpoints[(round_no - 1) % len(endpoints)]
            sent = f"{len(responses or {})} answer(s)" + (", requestState" if state else "")
            result = await endpoint.client.session.call_tool(
                "deploy", {"app": app}, input_responses=responses, request_state=state, allow_input_required=True
            )
            status = "input_required" if isinstance(result, t.InputRequiredResult) else "complete"
            out(f"\nround {round_no}: tools/call deploy ({sent}) -> {endpoint.url}")
            out(f"  answered by instance {endpoint.last_instance}: {status}")
            if not isinstance(result, t.InputRequiredResult):
                return result
            requests = result.input_requests or {}
            for key, request in requests.items():
                again = "  (asked again: the previous answer was not accepted)" if key in (responses or {}) else ""
                out(f"  asks [{key}] {describe(request)}{again}")
            responses = {}
            for key, request in requests.items():
                responses[key], how = answerer.answer(key, request)
                out(f"  reply [{key}] {how}")
            state = result.request_state
            if state is not None:
                out(f"  requestState: {len(state)} opaque chars, echoed verbatim next round")
        raise RuntimeError(f"flow still asking after {max_rounds} rounds")


_INPUT_REQUEST = TypeAdapter[t.InputRequest](cast(Any, t.InputRequest))  # a union: mypy versions disagree on its type


async def start_migration(url: str, app: str, seconds: float, *, out: Callable[[str], None] = print) -> str:
    """Create a `migrate` task on `url` and return its id; the task runs on without this client."""
    async with connect(url, tasks=True) as endpoint:
        out(f"tools/call migrate -> {endpoint.url}")
        arguments = {"app": app, "seconds": seconds}
        created = await endpoint.client.session.call_tool("migrate", arguments, allow_claimed=True)
        if not isinstance(created, CreatedTask):
            raise RuntimeError(f"expected a CreateTaskResult, got {type(created).__name__}")
        out(f"  answered by instance {endpoint.last_instance}: CreateTaskResult")
        out(f"  taskId: {created.task_id}  status: {created.status}  pollIntervalMs: {created.poll_interval_ms}")
        return created.task_id


async def follow_migration(
    url: str,
    task_id: str,
    answerer: Answerer,
    *,
    out: Callable[[str], None] = print,
    timeout: float = 60.0,
    since: float | None = None,
) -> t.CallToolResult:
    """Poll a task on `url` until it ends, printing each status change and answering its asks.

    Written out by hand (rather than `mrtr.client._tasks.follow_task`) so that every
    `tasks/get` and `tasks/update` shows up in the output, with the instance that served it.
    Printed offsets count from `since` (a `time.monotonic()` value; default: now), so a
    caller can put them on one clock with its own output.
    """
    async with connect(url, tasks=True) as endpoint:
        session = endpoint.client.session
        started = time.monotonic() if since is None else since
        last: tuple[str, str | None] | None = None
        answered: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            task = await get_task(session, task_id)
            status = task.status
            current = (status, task.status_message)
            if current != last:
                message = f" ({current[1]})" if current[1] else ""
                elapsed = time.monotonic() - started
                out(f"  +{elapsed:4.1f}s tasks/get -> answered by instance {endpoint.last_instance}: {status}{message}")
                last = current
            if status == "completed":
                return t.CallToolResult.model_validate(task.result or {"content": []})
            if status in ("failed", "cancelled"):
                raise RuntimeError(f"task {task_id} ended {status}: {task.error or task.status_message}")
            # A parked task repeats its pending asks on every poll: answer each key once.
            requests = (task.input_requests or {}) if status == "input_required" else {}
            fresh = {key: _INPUT_REQUEST.validate_python(raw) for key, raw in requests.items() if key not in answered}
            if fresh:
                wire: dict[str, Any] = {}
                for key, request in fresh.items():
                    out(f"  asks [{key}] {describe(request)}")
                    response, how = answerer.answer(key, request)
                    out(f"  reply [{key}] {how}")
                    wire[key] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
                await update_task(session, task_id, wire)
                out(f"  tasks/update -> answered by instance {endpoint.last_instance}: accepted")
                answered |= set(fresh)
                continue
            interval = task.poll_interval_ms
            await asyncio.sleep(interval / 1000 if isinstance(interval, int) and interval > 0 else 0.5)
        raise TimeoutError(f"task {task_id} did not finish within {timeout:.0f}s")


async def migrate(urls: list[str], app: str, answerer: Answerer, seconds: float) -> t.CallToolResult:
    """Start a `migrate` task on the first URL and follow it to its end on the last."""
    task_id = await start_migration(urls[0], app, seconds)
    print(f"\nfollowing task {task_id} on {urls[-1]}")
    return await follow_migration(urls[-1], task_id, answerer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Drive the deployer flow round by round across server URLs.")
    parser.add_argument("urls", nargs="+", help="MCP endpoints; rounds rotate through them")
    parser.add_argument("--app", default="shop", help="the app to deploy (default: shop)")
    parser.add_argument("--scripted", action="store_true", help="use scripted answers even on a terminal")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="production", help="which script to use")
    parser.add_argument("--migrate", action="store_true", help="run the durable `migrate` task (needs MRTR_STORE)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long the migration's slow step takes")
    args = parser.parse_args(argv)

    interactive = sys.stdin.isatty() and not args.scripted
    if args.migrate:
        mode = "interactive (type /decline or /cancel to refuse)" if interactive else "scripted"
        print(f"migrating {args.app!r} as a durable task; answers: {mode}")
        script = {key: list(values) for key, values in MIGRATION_SCRIPT.items()}
        try:
            result = asyncio.run(migrate(args.urls, args.app, Answerer(interactive, script), args.seconds))
        except MCPError as exc:
            print(f"\nserver error {exc.code}: {exc}")
            return 1
        print("\nresult:\n" + "\n".join("  " + line for line in summarize_migration(result).splitlines()))
        return 1 if result.is_error else 0
    script = {key: list(values) for key, values in SCENARIOS[args.scenario].items()}
    mode = "interactive (type /decline or /cancel to refuse)" if interactive else f"scripted ({args.scenario})"
    print(f"deploying {args.app!r}; answers: {mode}; sampling: {SAMPLING_NOTE}")
    try:
        result = asyncio.run(drive(args.urls, args.app, Answerer(interactive, script)))
    except MCPError as exc:
        print(f"\nserver error {exc.code}: {exc}")
        return 1
    print("\nresult:\n" + "\n".join("  " + line for line in summarize(result).splitlines()))
    return 1 if result.is_error else 0


if __name__ == "__main__":
    sys.exit(main())
