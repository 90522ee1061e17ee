"""The typer application: commands, options, and the one place errors become exit codes."""

import asyncio
import contextlib
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from mrtr.cli._errors import (
    EXIT_ABANDONED,
    EXIT_INTERRUPTED,
    EXIT_PROTOCOL,
    EXIT_TASK_CANCELLED,
    EXIT_TOOL_ERROR,
    EXIT_UNREACHABLE,
    CliError,
)

if TYPE_CHECKING:
    from mrtr.cli._taskadmin import Filters
    from mrtr.stores import RecordSeal

_SHUTDOWN_TIMEOUT = 5.0

app = typer.Typer(
    name="mrtr",
    help="Try MRTR flows by hand, administer durable tasks, read sealed requestState.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
tasks_app = typer.Typer(
    help="List, show, cancel and purge durable tasks in a store (open_store URLs), and deliver events to them."
)
app.add_typer(tasks_app, name="tasks")

EXIT_CODES_HELP = (
    "Exit codes: 0 ok · 1 tool error / task failed · 2 bad input · 3 unreachable · 4 server error · "
    "5 abandoned (declined to answer, no answer) · 6 task cancelled · 130 interrupted."
)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def explain(exc: BaseException) -> tuple[int, str]:
    """The exit code and one-line message for anything a command raised."""
    from mcp.shared.exceptions import MCPError

    from mrtr.client._flowclient import InputAbandoned, RoundLimitExceeded
    from mrtr.client._tasks import TaskCancelled

    exc = leaf(exc)
    if isinstance(exc, CliError):
        return exc.exit_code, str(exc)
    if isinstance(exc, MCPError):
        return EXIT_PROTOCOL, f"server error {exc.error.code}: {exc.error.message}"
    if isinstance(exc, TaskCancelled):
        return EXIT_TASK_CANCELLED, f"task cancelled: {exc}"
    if isinstance(exc, InputAbandoned):
        return EXIT_ABANDONED, str(exc)
    if isinstance(exc, RoundLimitExceeded):
        return EXIT_PROTOCOL, str(exc)
    import httpx2

    from mrtr.client._transport import TransportError

    if isinstance(exc, TransportError) and exc.status is not None:  # an HTTP status, no JSON-RPC answer
        return EXIT_PROTOCOL, f"the server answered HTTP {exc.status}: {_one_line(exc)}"
    if isinstance(exc, TransportError | httpx2.TransportError | ConnectionError | TimeoutError):
        return EXIT_UNREACHABLE, f"cannot reach the server: {_one_line(exc) or type(exc).__name__}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return EXIT_PROTOCOL, f"the server answered HTTP {exc.response.status_code} ({exc.request.url})"
    if type(exc).__module__.split(".")[0] in ("redis", "psycopg", "psycopg_pool"):
        return EXIT_UNREACHABLE, f"store error: {_one_line(exc) or type(exc).__name__}"
    if isinstance(exc, FileNotFoundError):
        return EXIT_UNREACHABLE, f"cannot start the server: {exc.strerror}: {exc.filename}"
    return EXIT_TOOL_ERROR, f"{type(exc).__name__}: {_one_line(exc)}"


def leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups and bare re-raises."""
    for _ in range(20):
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        else:
            break
    return exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def run_loop(work: Callable[[], Awaitable[int]]) -> int:
    """`asyncio.run` without its SIGINT handler: Ctrl-C must interrupt a blocking prompt at once.

    (`asyncio.run` turns the first Ctrl-C into a task cancellation, which a thread blocked
    in `input()` would not notice until the person pressed Enter.)
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(work())
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=_SHUTDOWN_TIMEOUT))
        with contextlib.suppress(TimeoutError):  # an async generator that will not close must not hang the exit
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), _SHUTDOWN_TIMEOUT))
        loop.close()


def run(work: Callable[[], Awaitable[int]]) -> None:
    """Run an async command; map every failure to one stderr line and an exit code."""
    from mrtr.cli._errors import debug

    try:
        code = run_loop(work)
    except KeyboardInterrupt:
        err_console().print("mrtr: interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:
        if debug():
            traceback.print_exc()
        code, message = explain(exc)
        if isinstance(leaf(exc), KeyboardInterrupt):
            code, message = EXIT_INTERRUPTED, "interrupted"
        err_console().print(f"mrtr: {message}", markup=False, soft_wrap=True)
        raise typer.Exit(code) from None
    raise typer.Exit(code)


# -- mrtr call --------------------------------------------------------------------------------


@app.command(epilog=EXIT_CODES_HELP)
def call(
    url: Annotated[
        str | None, typer.Argument(help="Server URL (streamable HTTP), e.g. http://127.0.0.1:8000/mcp")
    ] = None,
    tool: Annotated[str | None, typer.Argument(help="Tool to call (omit with --prompt / --resource)")] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", "-a", help="Argument NAME=VALUE (repeatable)")] = None,
    json_args: Annotated[str | None, typer.Option("--json", help="All arguments as one JSON object")] = None,
    stdio: Annotated[str | None, typer.Option(help="Launch the server: 'command args...' over stdio")] = None,
    prompt: Annotated[str | None, typer.Option(help="Get this prompt instead of calling a tool")] = None,
    resource: Annotated[str | None, typer.Option(help="Read this resource URI instead of calling a tool")] = None,
    answers: Annotated[
        Path | None, typer.Option(help="JSON/YAML answers by key or question, for non-interactive runs")
    ] = None,
    sampling: Annotated[
        str,
        typer.Option(
            help="Answer sampling: echo | ask | cmd:COMMAND (prompt text in, completion out) | json:COMMAND "
            "(the request as JSON in, tools included; a result JSON, tool_use allowed, or text out) | none"
        ),
    ] = "ask",
    root: Annotated[list[str] | None, typer.Option("--root", help="A root (path or URI) to offer (repeatable)")] = None,
    tasks: Annotated[bool, typer.Option("--tasks/--no-tasks", help="Declare the tasks extension")] = True,
    legacy: Annotated[bool, typer.Option(help="Speak 2025-11-25 (initialize handshake) instead")] = False,
    max_rounds: Annotated[int, typer.Option(help="Give up after this many rounds", min=1, max=1000)] = 25,
    output: Annotated[str, typer.Option(help="text | json (the final result as JSON on stdout)")] = "text",
    instance_header: Annotated[str, typer.Option(help="Response header naming the instance")] = "X-Mrtr-Instance",
    show_state: Annotated[bool, typer.Option(help="Print each round's sealed requestState")] = False,
) -> None:
    """Drive a tool call (or prompt, or resource read) through every MRTR round and task status.

    Forms are rendered from their JSON schema: Enter keeps the default, `:decline` and
    `:cancel` refuse. Each round shows the keys asked, the sealed state size and the
    instance that answered; a durable task is followed with a live status line.
    """
    from mrtr.cli._call import CallRequest, parse_arguments, run_call, stdin_is_terminal
    from mrtr.cli._errors import UsageError

    def build() -> CallRequest:
        target_url, target_tool = url, tool
        if stdio is not None and target_tool is None:
            target_url, target_tool = None, url  # with --stdio the only positional is the tool
        elif stdio is not None:
            raise UsageError("with --stdio give only TOOL, not a URL")
        if target_url is None and stdio is None:
            raise UsageError("give a server URL or --stdio 'command ...'")
        chosen = [x for x in (target_tool, prompt, resource) if x is not None]
        if len(chosen) != 1:
            raise UsageError("name exactly one of TOOL, --prompt NAME or --resource URI")
        if output not in ("text", "json"):
            raise UsageError("--output must be text or json")
        raw = list(arg or [])
        return CallRequest(
            url=target_url,
            stdio=stdio,
            tool=target_tool,
            prompt=prompt,
            resource=resource,
            arguments=parse_arguments(raw, json_args),
            raw_args=[a.partition("=")[0] for a in raw],
            answers=answers,
            sampling=sampling,
            roots=list(root or []),
            tasks=tasks,
            legacy=legacy,
            max_rounds=max_rounds,
            output=output,
            instance_header=instance_header,
            show_state=show_state,
        )

    async def work() -> int:
        request = build()
        out = Console(highlight=False)
        return await run_call(request, err_console(), out, stdin_is_terminal())

    run(work)


# -- mrtr tasks ---------------------------------------------------------------------------------

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="MRTR_STORE",
        help="sqlite:///PATH, redis://..., redis+cluster://HOST:PORT,..., postgresql://...",
    ),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option(envvar="MRTR_STORE_NAMESPACE", help="Redis key prefix / PostgreSQL table, as given to open_store"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output")]
KeyFileOption = Annotated[
    str | None,
    typer.Option(
        "--key-file",
        help="A file of hex keys (newest first) opening records sealed at rest; default: $MRTR_STATE_KEY",
    ),
]


TaskIdArgument = Annotated[str, typer.Argument(help="The task id (one starting with '-' works as it is, or after --)")]
OptionalTaskId = Annotated[
    str | None, typer.Argument(help="The task id; or, instead, filters that choose the tasks (all that match)")
]
StatusOption = Annotated[list[str] | None, typer.Option("--status", help="Only these statuses (repeatable)")]
ToolOption = Annotated[str | None, typer.Option("--tool", help="Only tasks of this tool (flow)")]
WaitingOption = Annotated[
    str | None,
    typer.Option(
        "--waiting", help="Only tasks waiting for this: input, timer, event, callback, or nothing (running or queued)"
    ),
]
OlderOption = Annotated[str | None, typer.Option(help="Created more than this long ago: 90s, 10m, 2h, 1d")]
NewerOption = Annotated[str | None, typer.Option(help="Created less than this long ago")]
YesOption = Annotated[bool, typer.Option("--yes", help="Act without asking (default: show the count and ask)")]
BusOption = Annotated[
    str | None,
    typer.Option("--bus", envvar="MRTR_BUS", help="The fleet bus URL: publish each change, so consoles update live"),
]
IDS = {"ignore_unknown_options": True}
"""Commands that take a task id: an id starting with '-' (one in 64 minted before ids avoided it)
is an argument, not an unknown option."""


def _filters(
    status: list[str] | None,
    tool: str | None,
    waiting: str | None,
    older_than: str | None,
    newer_than: str | None,
) -> "Filters":
    from mrtr.cli._taskadmin import Filters

    return Filters(status=status or [], flow=tool, older_than=older_than, newer_than=newer_than, waiting=waiting)


def _ring(key_file: str | None) -> "RecordSeal | None":
    """The ring of `--key-file`, else `$MRTR_STATE_KEY`, else None (read inside `run`: a bad key is a usage error)."""
    from mrtr.cli._storeview import key_ring

    return key_ring(key_file)


@tasks_app.command("ls")
def tasks_ls(
    store: StoreOption,
    namespace: NamespaceOption = None,
    status: StatusOption = None,
    tool: Annotated[str | None, typer.Option("--tool", "--flow", help="Only tasks of this tool (flow)")] = None,
    waiting: WaitingOption = None,
    older_than: OlderOption = None,
    newer_than: NewerOption = None,
    expired: Annotated[bool, typer.Option(help="Include tasks past their TTL (not yet purged)")] = False,
    limit: Annotated[int, typer.Option(min=1, max=100_000)] = 100,
    as_json: JsonOption = False,
    key_file: KeyFileOption = None,
) -> None:
    """List tasks, newest first (read-only)."""
    from mrtr.cli._taskadmin import list_tasks

    filters = _filters(status, tool, waiting, older_than, newer_than)
    filters.expired = expired
    run(lambda: list_tasks(store, namespace, filters, limit, as_json, Console(highlight=False), _ring(key_file)))


@tasks_app.command("show", context_settings=IDS)
def tasks_show(
    task_id: TaskIdArgument,
    store: StoreOption,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
    key_file: KeyFileOption = None,
) -> None:
    """Show one task: status, lease, its journal's asks, answers and steps (read-only)."""
    from mrtr.cli._taskadmin import show_task

    run(lambda: show_task(store, namespace, task_id, as_json, Console(highlight=False), _ring(key_file)))


@tasks_app.command("cancel", context_settings=IDS)
def tasks_cancel(
    store: StoreOption,
    task_id: OptionalTaskId = None,
    namespace: NamespaceOption = None,
    status: StatusOption = None,
    tool: ToolOption = None,
    waiting: WaitingOption = None,
    older_than: OlderOption = None,
    newer_than: NewerOption = None,
    yes: YesOption = False,
    bus: BusOption = None,
    as_json: JsonOption = False,
    key_file: KeyFileOption = None,
) -> None:
    """Cancel a task cooperatively, as tasks/cancel does: a running flow stops at its next await.

    With filters instead of an id, cancels every unfinished task they match, after showing the
    count and asking (--yes: without asking), and reports what each task became.
    """
    from mrtr.cli._bulk import bulk_action
    from mrtr.cli._taskadmin import cancel_task

    filters = _filters(status, tool, waiting, older_than, newer_than)
    out = Console(highlight=False)
    if task_id is not None:
        _only_id(filters)
        run(lambda: cancel_task(store, namespace, task_id, out, _ring(key_file), bus))
    else:
        run(lambda: bulk_action(store, namespace, "cancel", filters, yes, bus, as_json, out, _ring(key_file)))


@tasks_app.command("purge")
def tasks_purge(
    store: StoreOption,
    namespace: NamespaceOption = None,
    status: StatusOption = None,
    tool: ToolOption = None,
    waiting: WaitingOption = None,
    older_than: OlderOption = None,
    newer_than: NewerOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Really delete (default: expired tasks are only counted; filtered, asked)")
    ] = False,
    bus: BusOption = None,
    as_json: JsonOption = False,
    key_file: KeyFileOption = None,
) -> None:
    """Delete tasks past their TTL. Without --yes, only says how many would be deleted.

    With filters, deletes every finished task they match (completed, failed, cancelled; never
    an unfinished one), after showing the count and asking (--yes: without asking).
    """
    from mrtr.cli._bulk import bulk_action
    from mrtr.cli._taskadmin import purge_tasks

    filters = _filters(status, tool, waiting, older_than, newer_than)
    out = Console(highlight=False)
    if filters.given:
        run(lambda: bulk_action(store, namespace, "purge", filters, yes, bus, as_json, out, _ring(key_file)))
    else:
        run(lambda: purge_tasks(store, namespace, yes, out))


@tasks_app.command("rerun", context_settings=IDS)
def tasks_rerun(
    store: StoreOption,
    task_id: OptionalTaskId = None,
    namespace: NamespaceOption = None,
    status: StatusOption = None,
    tool: ToolOption = None,
    waiting: WaitingOption = None,
    older_than: OlderOption = None,
    newer_than: NewerOption = None,
    yes: YesOption = False,
    bus: BusOption = None,
    as_json: JsonOption = False,
    key_file: KeyFileOption = None,
    from_step: Annotated[
        str | None,
        typer.Option(
            "--from-step",
            help="Fork a finished task from this step (a name, or a journal key like charge#2): the steps before "
            "it replay, it and the rest run again",
        ),
    ] = None,
) -> None:
    """Re-run a failed task from its journal: finished steps are kept, the failed step runs again.

    With --from-step, fork any finished task (completed, failed or cancelled) from that step instead.
    With filters instead of an id, re-runs every failed task they match, after showing the
    count and asking (--yes: without asking), and reports what each task became.
    """
    from mrtr.cli._bulk import bulk_action
    from mrtr.cli._taskadmin import rerun_task

    filters = _filters(status, tool, waiting, older_than, newer_than)
    out = Console(highlight=False)
    if task_id is not None:
        _only_id(filters)
        run(lambda: rerun_task(store, namespace, task_id, out, _ring(key_file), from_step, bus))
    elif from_step is not None:
        err_console().print("mrtr: --from-step forks one task: give its id")
        raise typer.Exit(2)
    else:
        run(lambda: bulk_action(store, namespace, "rerun", filters, yes, bus, as_json, out, _ring(key_file)))


def _only_id(filters: "Filters") -> None:
    if filters.given:
        err_console().print("mrtr: give a task id or filters, not both")
        raise typer.Exit(2)


@tasks_app.command("export", context_settings=IDS)
def tasks_export(
    task_id: Annotated[str, typer.Argument(help="The task id")],
    store: StoreOption,
    namespace: NamespaceOption = None,
    key_file: KeyFileOption = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Write to this file (default: stdout)")] = None,
) -> None:
    """Write one task as a JSON document (record, arguments, journal, history, result), for `mrtr replay`."""
    from mrtr.cli._replay import export_command

    run(lambda: export_command(store, namespace, task_id, output, err_console(), _ring(key_file)))


@tasks_app.command("reseal")
def tasks_reseal(
    store: StoreOption,
    namespace: NamespaceOption = None,
    key_file: KeyFileOption = None,
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Records per page and per progress line")] = 200,
) -> None:
    """Seal every task record under the ring's first key (plain ones, and those under older keys).

    Safe beside a live fleet: each rewrite is a compare-and-set on the record's version. Once it
    reports nothing left, the older keys can leave the ring.
    """
    from mrtr.cli._taskadmin import reseal_tasks

    run(lambda: reseal_tasks(store, namespace, _ring(key_file), batch, Console(highlight=False), err_console()))


@tasks_app.command("event", context_settings=IDS)
def tasks_event(
    task_id: TaskIdArgument,
    name: Annotated[str, typer.Argument(help="The event name the flow waits for (ctx.wait_for_event)")],
    store: StoreOption,
    namespace: NamespaceOption = None,
    data: Annotated[str | None, typer.Option("--data", help="The event's payload, as JSON")] = None,
    event_id: Annotated[
        str | None, typer.Option("--event-id", help="Deliver at most once under this id (resends change nothing)")
    ] = None,
    key_file: KeyFileOption = None,
    bus: BusOption = None,
) -> None:
    """Deliver an event to a durable task; one parked on it resumes on the fleet's next scan."""
    from mrtr.cli._events import send_event

    out = Console(highlight=False)
    run(lambda: send_event(store, namespace, task_id, name, data, event_id, out, _ring(key_file), bus))


# -- mrtr console -------------------------------------------------------------------------------

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@app.command("console")
def console(
    store: StoreOption,
    namespace: NamespaceOption = None,
    bus: Annotated[
        str | None, typer.Option("--bus", envvar="MRTR_BUS", help="A fleet bus URL: pages update as tasks change")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind (anything but loopback needs --token)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8765,
    token: Annotated[
        str | None, typer.Option("--token", envvar="MRTR_CONSOLE_TOKEN", help="Require this bearer token / login")
    ] = None,
    redact: Annotated[bool, typer.Option("--redact", help="Hide answers and step results in the timeline")] = False,
    key_file: KeyFileOption = None,
) -> None:
    """Serve the web console for the store's durable tasks (http://127.0.0.1:8765 by default)."""
    from mrtr.cli._errors import UsageError

    if host not in _LOOPBACK and not token:
        err_console().print(
            f"mrtr: --host {host} is reachable from other machines: give --token (or MRTR_CONSOLE_TOKEN) too"
        )
        raise typer.Exit(UsageError.exit_code)
    try:
        import uvicorn

        from mrtr.console import app as console_app
    except ImportError as exc:
        # markup=False: rich would read `[console]` as a style tag and print `pip install 'mrtr'`
        hint = f"mrtr: the console needs its extra: pip install 'mrtr[console]' ({exc.name} is missing)"
        err_console().print(hint, markup=False)
        raise typer.Exit(UsageError.exit_code) from None
    try:
        ring = _ring(key_file)
    except UsageError as exc:
        err_console().print(f"mrtr: {exc}")
        raise typer.Exit(UsageError.exit_code) from None
    web = console_app(store, bus=bus, token=token, redact=redact, namespace=namespace, seal=ring)
    err_console().print(f"mrtr console on http://{host}:{port}/ ({'token required' if token else 'no login'})")
    uvicorn.run(web, host=host, port=port, log_level="warning")


# -- mrtr replay --------------------------------------------------------------------------------


@app.command("replay")
def replay(
    export: Annotated[str, typer.Argument(metavar="FILE", help="A task exported with `mrtr tasks export`")],
    app_target: Annotated[
        str, typer.Option("--app", help="MODULE:ATTR: your Flows, or the MCPServer / FastMCP server it wraps")
    ],
    as_json: JsonOption = False,
) -> None:
    """Replay an exported task against the current code, in process: no network, no side effects.

    Steps return their recorded values, asks are answered from the journal, a step the journal
    lacks is reported, not run. Exit 0 when the code reaches the point the task had reached (the
    same asks, waits or result); 1 with the first divergence (the journal entry, what it holds,
    what the code did); 2 for a bad file or --app.
    """
    from mrtr.cli._replay import replay_command

    run(lambda: replay_command(export, app_target, as_json, Console(highlight=False)))


# -- mrtr inspect-state -------------------------------------------------------------------------


@app.command("inspect-state")
def inspect_state(
    state: Annotated[str, typer.Argument(help="The sealed requestState token, or - to read it from stdin")] = "-",
    key_env: Annotated[
        str, typer.Option(help="Environment variable holding the hex key (comma-separated ring)")
    ] = "MRTR_STATE_KEY",
    as_json: JsonOption = False,
) -> None:
    """Unseal and pretty-print a requestState (journal, pending asks, flow age). For debugging only."""
    from mrtr.cli._state import inspect

    token = sys.stdin.read().strip() if state == "-" else state.strip()

    async def work() -> int:
        return inspect(token, key_env, as_json, Console(highlight=False))

    run(work)


__all__ = [
    "EXIT_CODES_HELP",
    "console",
    "JsonOption",
    "NamespaceOption",
    "StoreOption",
    "app",
    "call",
    "err_console",
    "explain",
    "inspect_state",
    "leaf",
    "replay",
    "run",
    "run_loop",
    "tasks_app",
    "tasks_cancel",
    "tasks_event",
    "tasks_export",
    "tasks_ls",
    "tasks_purge",
    "tasks_reseal",
    "tasks_rerun",
    "tasks_show",
]
