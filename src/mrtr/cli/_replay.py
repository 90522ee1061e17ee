"""`mrtr tasks export` and `mrtr replay`: take a production task home and replay it against your code.

`export` reads one task through the store's API (opening a record sealed at rest with the key
ring, as `show` does) and prints it as one JSON document (`mrtr.tasks.export_task`). `replay`
imports your app, finds its `Flows`, and replays the document in process
(`mrtr.testing.replay_export`'s work): exit 0 when the code reaches the point the task had
reached, 1 with the first divergence otherwise.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from mrtr._engine.journal import JournalFormatError
from mrtr._host.base import BaseFlows
from mrtr._replay_export import ExportUnreadable, load_export, replay_document
from mrtr.cli._errors import EXIT_OK, EXIT_TOOL_ERROR, CliError, UsageError
from mrtr.cli._storeview import open_view
from mrtr.stores import RecordSeal
from mrtr.tasks._export import ExportSealed, export_task


async def export_command(
    url: str, namespace: str | None, task_id: str, output: str | None, out: Console, seal: RecordSeal | None
) -> int:
    opened = open_view(url, namespace, seal)
    try:
        record = await opened.call(lambda: opened.store.load(task_id, time.time()))
    finally:
        await opened.close()
    if record is None:
        raise CliError(f"no task {task_id!r} in {opened.label} (unknown, or past its TTL)")
    try:
        document = export_task(record)
    except ExportSealed as exc:
        raise CliError(str(exc)) from None
    except JournalFormatError as exc:
        raise CliError(f"task {task_id!r}: its journal cannot be read ({exc})") from None
    text = json.dumps(document, indent=2, ensure_ascii=False, default=str)
    if output is None or output == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        try:
            Path(output).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
        out.print(f"task {escape(task_id)} exported to {escape(output)}")
    return EXIT_OK


def find_flows(target: str) -> BaseFlows:
    """The `Flows` named by `MODULE:ATTR`: the attribute itself, or the `Flows` registered on the
    server (an `MCPServer`, a `FastMCP`) or app it names.

    The module is imported with the working directory on `sys.path`, as `uvicorn` does.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--app takes MODULE:ATTR (e.g. myapp.server:flows), not {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, BaseFlows):
        return obj
    found = [f for f in vars(module).values() if isinstance(f, BaseFlows) and _wraps(f, obj)]
    if not found:  # a Flows kept elsewhere (a factory's local): anything that holds the server
        found = [f for f in gc.get_referrers(obj) if isinstance(f, BaseFlows) and _wraps(f, obj)]
        found += [
            owner
            for holder in gc.get_referrers(obj)
            if isinstance(holder, dict)
            for owner in gc.get_referrers(holder)
            if isinstance(owner, BaseFlows) and _wraps(owner, obj)
        ]
    unique = list({id(f): f for f in found}.values())
    if len(unique) != 1:
        what = "no mrtr Flows" if not unique else f"{len(unique)} mrtr Flows"
        raise UsageError(f"{target} is not a Flows, and {what} wrap it; name the Flows itself (MODULE:ATTR)")
    return unique[0]


def _wraps(flows: BaseFlows, obj: Any) -> bool:
    return any(getattr(flows, name, None) is obj for name in ("server", "mcp"))


async def replay_command(path: str, target: str, as_json: bool, out: Console) -> int:
    try:
        document = load_export(path)
    except ExportUnreadable as exc:
        raise UsageError(f"{path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    flows = find_flows(target)
    report = await replay_document(flows, document)
    if as_json:
        divergence = report.divergence
        out.print_json(
            json.dumps(
                {
                    "ok": report.ok,
                    "taskId": report.task_id,
                    "flow": report.flow,
                    "status": report.status,
                    "entries": report.entries,
                    "used": report.used,
                    "reached": report.reached or None,
                    "divergence": None
                    if divergence is None
                    else {
                        "index": divergence.index,
                        "entry": divergence.entry,
                        "journal": divergence.journal,
                        "code": divergence.code,
                        "message": str(divergence),
                    },
                },
                default=str,
            )
        )
    elif report.ok:
        out.print(escape(report.explain()), soft_wrap=True)
    else:
        out.print(f"[red]{escape(report.explain())}[/]", soft_wrap=True)
    return EXIT_OK if report.ok else EXIT_TOOL_ERROR


__all__ = ["export_command", "find_flows", "replay_command"]
