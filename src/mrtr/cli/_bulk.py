"""`mrtr tasks cancel|rerun|purge <filters>`: act on every task a filter matches, after a yes.

The filters are `mrtr tasks ls`'s (`--status`, `--tool`, `--waiting`, `--older-than`,
`--newer-than`). The command counts what they match and asks before it changes anything
(`--yes` answers for a script); then `TaskAdmin.bulk` changes one task at a time, each by the
same compare-and-set transition as the single-task command, and the command prints what each
task became. With `--bus` (or `$MRTR_BUS`) every change is published on the fleet bus, as the
runtime publishes its own, so open consoles and listen streams update at once.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import typer
from click.exceptions import Abort
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mrtr.cli._errors import EXIT_OK, EXIT_TOOL_ERROR, Abandoned, UsageError
from mrtr.cli._fleetbus import fleet_bus
from mrtr.cli._storeview import open_view
from mrtr.cli._taskadmin import Filters, ago, select
from mrtr.stores import RecordSeal
from mrtr.tasks._admin import BulkAction, TaskAdmin, applies

_VERB = {"cancel": "cancel", "rerun": "re-run", "purge": "purge (delete)"}
_WHICH = {
    "cancel": "unfinished",
    "rerun": "failed",
    "purge": "finished",
}


async def bulk_action(
    url: str,
    namespace: str | None,
    action: BulkAction,
    filters: Filters,
    yes: bool,
    bus_url: str | None,
    as_json: bool,
    out: Console,
    seal: RecordSeal | None = None,
) -> int:
    """Count the tasks `filters` match that `action` applies to, ask, act, and report each one."""
    if not filters.given:
        raise UsageError(f"give a task id, or filters (--status, --tool, --waiting, --older-than) to {action} by")
    say = Console(stderr=True, highlight=False) if as_json else out  # stdout holds only the JSON
    opened = open_view(url, namespace, seal)
    try:
        now = time.time()
        query = filters.query(now)
        matched = select([r async for r in opened.records(now, False, query)], filters, now)
        chosen = [r for r in matched if applies(action, r)]
        left = len(matched) - len(chosen)
        aside = f" ({left} more match but are not {_WHICH[action]}: left alone)" if left else ""
        if not chosen:
            say.print(f"no {_WHICH[action]} task matches in {opened.label}{aside}; nothing to do", soft_wrap=True)
            if as_json:
                out.print_json("[]")
            return EXIT_OK
        tools = ", ".join(sorted({r.flow for r in chosen}))
        say.print(
            f"{len(chosen)} task(s) in {opened.label} to {_VERB[action]} (tools: {escape(tools)}){aside}",
            soft_wrap=True,
        )
        if not yes:
            try:
                sure = typer.confirm(
                    f"{_VERB[action].capitalize()} these {len(chosen)} task(s)?", default=False, err=as_json
                )
            except Abort:
                sure = False
            if not sure:
                raise Abandoned("nothing changed (not confirmed; --yes confirms without asking)")
        async with fleet_bus(bus_url, namespace) as bus:
            admin = TaskAdmin(opened.store, bus=bus)
            outcomes = await opened.call(lambda: admin.bulk(action, [r.task_id for r in chosen]))
    finally:
        await opened.close()
    errors = sum(o.outcome == "error" for o in outcomes)
    if as_json:
        out.print_json(json.dumps([asdict(o) for o in outcomes]))
        return EXIT_TOOL_ERROR if errors else EXIT_OK
    created = {r.task_id: r for r in chosen}
    table = Table(title=f"{_VERB[action]}: what each task became", title_justify="left")
    for column in ("task", "tool", "created", "was", "now", "outcome", "note"):
        table.add_column(column, overflow="fold")
    for o in outcomes:
        record = created[o.task_id]
        style = {"done": "green", "skipped": "yellow", "error": "red"}[o.outcome]
        table.add_row(
            escape(o.task_id),
            escape(record.flow),
            ago(record.created_at, now),
            o.before,
            o.after,
            f"[{style}]{o.outcome}[/]",
            escape(o.note),
        )
    out.print(table)
    done = sum(o.outcome == "done" for o in outcomes)
    out.print(f"{done} done, {len(outcomes) - done - errors} skipped, {errors} failed", soft_wrap=True)
    return EXIT_TOOL_ERROR if errors else EXIT_OK


__all__ = ["bulk_action"]
