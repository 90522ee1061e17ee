"""`mrtr tasks ls|show|cancel|purge`: durable tasks in a store, for the people who run the fleet.

`ls` and `show` only read. `cancel` makes the same compare-and-set transition as the
extension's `tasks/cancel`: a task running under a live lease gets `cancel_requested`
(its worker's heartbeat sees the flag and cancels the flow at its next await); any other
unfinished task ends `cancelled` at once. `purge` deletes tasks past their TTL, and
without `--yes` only counts them.
"""

from __future__ import annotations

import getpass
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, final

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal, JournalFormatError, QuestionNote
from mrtr._wire import JSONObject
from mrtr.cli._errors import EXIT_OK, CliError, UsageError
from mrtr.cli._fleetbus import fleet_bus
from mrtr.cli._storeview import open_view
from mrtr.stores import WAITS, RecordSeal, TaskQuery, TaskRecord, waits_for
from mrtr.stores._sealed import PAYLOAD_FIELDS
from mrtr.tasks._admin import TaskAdmin, TaskSealed, TaskUnknown
from mrtr.tasks._history import history_rows, iso
from mrtr.tasks._records import waiting_wire

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
SEALED_TEXT = "sealed"
"""What stands where a record's payload would be when no key given opens it: never its ciphertext."""
NO_KEY = "sealed at rest: give the key ring (MRTR_STATE_KEY, hex keys newest first, or --key-file) to see it"


@dataclass
class Filters:
    status: list[str] = field(default_factory=list)
    flow: str | None = None
    """`--tool` (`--flow` on `ls`, its older name)."""
    older_than: str | None = None
    newer_than: str | None = None
    expired: bool = False
    waiting: str | None = None
    """`--waiting`: one of `mrtr.stores.WAITS`."""

    @property
    def given(self) -> bool:
        """Whether any filter narrows the tasks (a bulk action needs one, or an id)."""
        return bool(self.status or self.flow or self.older_than or self.newer_than or self.waiting)

    def query(self, now: float) -> TaskQuery:
        """The store query these filters make (`--newer-than` is checked on what it returns, by `select`)."""
        unknown = [s for s in self.status if s not in STATUSES]
        if unknown:
            raise UsageError(f"--status takes {', '.join(STATUSES)}; not {', '.join(unknown)}")
        if self.waiting is not None and self.waiting not in WAITS:
            raise UsageError(f"--waiting takes {', '.join(WAITS)}; not {self.waiting}")
        older = seconds(self.older_than, "--older-than") if self.older_than else None
        return TaskQuery(
            statuses=tuple(self.status),
            flow=self.flow,
            waiting=self.waiting,
            created_before=None if older is None else now - older,
        )


def seconds(text: str, option: str) -> float:
    """`90`, `90s`, `10m`, `2h`, `1d` as seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(f"{option} takes a duration like 90s, 10m, 2h or 1d, not {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def ago(ts: float, now: float) -> str:
    delta = now - ts
    future = delta < 0
    delta = abs(delta)
    if delta < 90:
        text = f"{delta:.0f}s"
    elif delta < 90 * 60:
        text = f"{delta / 60:.0f}m"
    elif delta < 36 * 3600:
        text = f"{delta / 3600:.1f}h"
    else:
        text = f"{delta / 86400:.1f}d"
    return f"in {text}" if future else f"{text} ago"


def lease_text(record: TaskRecord, now: float) -> str:
    if record.lease_owner is None:
        return "-"
    state = "held" if record.lease_until >= now else "lapsed"
    return f"{record.lease_owner} ({state}, until {ago(record.lease_until, now)})"


def select(records: list[TaskRecord], filters: Filters, now: float) -> list[TaskRecord]:
    unknown = [s for s in filters.status if s not in STATUSES]
    if unknown:
        raise UsageError(f"--status takes {', '.join(STATUSES)}; not {', '.join(unknown)}")
    older = seconds(filters.older_than, "--older-than") if filters.older_than else None
    newer = seconds(filters.newer_than, "--newer-than") if filters.newer_than else None
    chosen = [
        r
        for r in records
        if (not filters.status or r.status in filters.status)
        and (filters.flow is None or r.flow == filters.flow)
        and (older is None or now - r.created_at >= older)
        and (newer is None or now - r.created_at <= newer)
        and (filters.waiting is None or filters.waiting in waits_for(r))
    ]
    return sorted(chosen, key=lambda r: r.created_at, reverse=True)


_STATUS_STYLE = {
    "working": "cyan",
    "input_required": "magenta",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
}


async def list_tasks(
    url: str,
    namespace: str | None,
    filters: Filters,
    limit: int,
    as_json: bool,
    out: Console,
    seal: RecordSeal | None = None,
) -> int:
    opened = open_view(url, namespace, seal)
    try:
        now = time.time()
        query = filters.query(now)
        records = select([r async for r in opened.records(now, filters.expired, query)], filters, now)
    finally:
        await opened.close()
    shown = records[:limit]
    if as_json:
        out.print_json(json.dumps([summary(r) for r in shown]))
        return EXIT_OK
    table = Table(title=f"tasks in {opened.label}: {len(shown)} of {len(records)}", title_justify="left")
    for column in ("task", "flow", "status", "created", "updated", "lease", "asks / message"):
        table.add_column(column, overflow="fold")
    for r in shown:
        asks = SEALED_TEXT if r.sealed else ", ".join(r.input_requests)
        note = asks if r.status == "input_required" else (r.status_message or "")
        if r.cancel_requested and not r.terminal:
            note = f"cancel requested {note}".strip()
        style = _STATUS_STYLE.get(r.status, "")
        table.add_row(
            escape(r.task_id),
            escape(r.flow),
            f"[{style}]{r.status}[/]",
            ago(r.created_at, now),
            ago(r.updated_at, now),
            escape(lease_text(r, now)),
            escape(note),
        )
    out.print(table)
    return EXIT_OK


class TaskRow(TypedDict):
    """One task in `mrtr tasks list --json`: its state and lease, not its payload."""

    taskId: str
    flow: str
    status: str
    statusMessage: str | None
    createdAt: str
    updatedAt: str
    expiresAt: str | None
    leaseOwner: str | None
    leaseUntil: str | None
    cancelRequested: bool
    inputRequests: str | list[str]
    """The outstanding asks' keys ("sealed" when no key opened the payload)."""
    attempt: int
    waiting: list[JSONObject]
    pendingEvents: str | list[str | None]
    """Names of delivered events not consumed yet ("sealed" when no key opened the payload)."""
    sealed: bool


class AskView(TypedDict):
    """One ask of a journal for people (`mrtr tasks show`, `mrtr state`)."""

    question: str | None
    """Its text (None in a journal from before questions were kept)."""
    title: str | None
    kind: str | None
    askedAt: str | None
    answeredAt: str | None
    by: str | None
    """The principal tag of who may answer it (the task's creator)."""
    questionDigest: str | None


class AnswerView(AskView):
    """An answered ask: the ask, and the answer as journaled."""

    answer: Any


class StepView(TypedDict):
    """A journaled step for people: its idempotency key, argument digest and result."""

    idempotencyKey: str
    arguments: str
    result: Any


@final
class JournalView(TypedDict):
    """A journal for people (`describe_journal`)."""

    flowId: str
    startedAt: str
    rounds: int
    answers: dict[str, AnswerView]
    steps: dict[str, StepView]
    pending: dict[str, AskView]
    """The asks still out (none once the task finished)."""


@final
class JournalUnread(TypedDict, total=False):
    """In a journal's place when it cannot be shown: `sealed` (no key opened the record) or `error`
    (it does not decode)."""

    sealed: str
    error: str


def summary(record: TaskRecord) -> TaskRow:
    return {
        "taskId": record.task_id,
        "flow": record.flow,
        "status": record.status,
        "statusMessage": record.status_message,
        "createdAt": iso(record.created_at),
        "updatedAt": iso(record.updated_at),
        "expiresAt": iso(record.expires_at) if record.expires_at is not None else None,
        "leaseOwner": record.lease_owner,
        "leaseUntil": iso(record.lease_until) if record.lease_owner else None,
        "cancelRequested": record.cancel_requested,
        "inputRequests": SEALED_TEXT if record.sealed else sorted(record.input_requests),
        "attempt": record.attempt,
        "waiting": [waiting_wire(wait) for wait in record.waiting],
        "pendingEvents": SEALED_TEXT if record.sealed else [event.get("name") for event in record.inbox],
        "sealed": record.sealed,
    }


def record_data(record: TaskRecord) -> JSONObject:
    """The record as JSON for `show --json`: a payload no key opened is "sealed", never its token."""
    data = asdict(record)
    extras = data.pop("extras", {})
    data.update({k: v for k, v in extras.items() if k != "sealed"})
    if record.sealed:
        data.update(dict.fromkeys(PAYLOAD_FIELDS, SEALED_TEXT))
    data["sealed"] = record.sealed
    return data


async def _load(url: str, namespace: str | None, task_id: str, seal: RecordSeal | None) -> tuple[Any, TaskRecord]:
    opened = open_view(url, namespace, seal)
    try:
        record = await opened.call(lambda: opened.store.load(task_id, time.time()))
    except BaseException:
        await opened.close()
        raise
    if record is None:
        await opened.close()
        raise CliError(f"no task {task_id!r} in {opened.label} (unknown, or past its TTL)")
    return opened, record


def journal_view(record: TaskRecord) -> JournalView | JournalUnread:
    """The record's journal, decoded for people: answers, steps with idempotency keys, pending asks."""
    if record.sealed:
        return {"sealed": NO_KEY}
    try:
        journal = journal_codec.decode(record.journal)
    except JournalFormatError as exc:
        return {"error": str(exc)}
    return describe_journal(journal, finished=record.terminal, by=record.owner)


def describe_journal(journal: Journal, *, finished: bool = False, by: str | None = None) -> JournalView:
    """A journal for people (and `--json`): each ask's question and answer, steps with their
    idempotency keys, and the asks still out (none once the task `finished`).

    `by` is the principal tag of the task's creator (`TaskRecord.owner`), the only one who may
    answer its asks (`tasks/update` checks it): who said yes to what.
    """
    return {
        "flowId": journal.flow_id,
        "startedAt": iso(journal.started_at),
        "rounds": journal.rounds,
        "answers": {k: AnswerView(**ask_view(journal, k, by), answer=v) for k, (_, v) in journal.answers.items()},
        "steps": {
            k: {"idempotencyKey": f"{journal.flow_id}:{k}", "arguments": d, "result": v}
            for k, (d, v) in journal.steps.items()
        },
        "pending": {} if finished else {k: ask_view(journal, k, by) for k in journal.pending},
    }


def ask_view(journal: Journal, key: str, by: str | None) -> AskView:
    """One ask for people: its question (None in a journal from before questions were kept), its
    form's title, when it was asked and answered, who may answer it, and its question's digest."""
    note: QuestionNote = journal.questions.get(key) or {}
    answered = journal.answers.get(key)
    asked, replied = note.get("a"), note.get("r")
    return {
        "question": note.get("q"),
        "title": note.get("t"),
        "kind": note.get("k"),
        "askedAt": iso(asked) if isinstance(asked, int | float) else None,
        "answeredAt": iso(replied) if isinstance(replied, int | float) and answered is not None else None,
        "by": by,
        "questionDigest": answered[0] if answered is not None else journal.pending.get(key),
    }


async def show_task(
    url: str, namespace: str | None, task_id: str, as_json: bool, out: Console, seal: RecordSeal | None = None
) -> int:
    opened, record = await _load(url, namespace, task_id, seal)
    await opened.close()
    now = time.time()
    journal = journal_view(record)
    if as_json:
        data = record_data(record)
        data["journal"] = SEALED_TEXT if record.sealed else journal
        out.print_json(json.dumps(data, default=str))
        return EXIT_OK
    style = _STATUS_STYLE.get(record.status, "")
    head = f"[bold]task {escape(record.task_id)}[/]  flow [bold]{escape(record.flow)}[/]"
    out.print(f"{head}  [{style}]{record.status}[/]")
    if record.status_message:
        out.print(f"  message: {escape(record.status_message)}")
    created = f"{iso(record.created_at)} ({ago(record.created_at, now)})"
    out.print(f"  created {created}, updated {ago(record.updated_at, now)}")
    if record.expires_at is not None:
        out.print(f"  expires {iso(record.expires_at)} ({ago(record.expires_at, now)})")
    out.print(f"  lease: {escape(lease_text(record, now))}")
    if record.cancel_requested:
        out.print("  [yellow]cancel requested[/]")
    if record.sealed:
        out.print(f"  arguments, journal, asks, answers, events, result: [yellow]{NO_KEY}[/]", soft_wrap=True)
        return EXIT_OK
    out.print(f"  arguments: {escape(json.dumps(record.arguments))}")
    if "flowId" not in journal:
        out.print(f"  [red]journal unreadable: {escape(journal.get('error', ''))}[/]")
    else:
        out.print(f"  journal: flow id {journal['flowId']}, started {journal['startedAt']}, rounds {journal['rounds']}")
        _table(
            out,
            "steps",
            ["step", "idempotency key", "result"],
            [[k, s["idempotencyKey"], _short(s["result"])] for k, s in journal["steps"].items()],
        )
        _table(
            out,
            "asks answered (question, answer, when, who)",
            ["key", "question", "answer", "when", "who"],
            [
                [
                    k,
                    _question_text(a),
                    _short(a["answer"]),
                    a["answeredAt"] or "-",
                    a["by"] or "anyone (no auth)",
                ]
                for k, a in journal["answers"].items()
            ],
        )
    if record.input_requests:
        rows = [
            [k, str(r.get("method", "")), _short((r.get("params") or {}).get("message", ""))]
            for k, r in record.input_requests.items()
        ]
        _table(out, "waiting for input", ["key", "method", "question"], rows)
    if record.waiting:
        rows = [
            [str(w.get("kind")), str(w.get("name") or ""), iso(until) if (until := w.get("until")) is not None else "-"]
            for w in record.waiting
        ]
        _table(out, "waiting for", ["kind", "event", "until"], rows)
    if record.inbox:
        rows = [[str(e.get("name")), str(e.get("id")), _short(e.get("data"))] for e in record.inbox]
        _table(out, "events not yet consumed", ["event", "id", "payload"], rows)
    if record.responses:
        asked = {k: str((r.get("params") or {}).get("message", "")) for k, r in record.input_requests.items()}
        for table in ("pending", "answers"):  # the questions the journal kept, by key (none when sealed)
            kept: Any = journal.get(table) or {}
            asked |= {k: str(a.get("question") or "") for k, a in kept.items() if k not in asked}
        rows = [[k, _short(asked.get(k, "")), _short(v)] for k, v in record.responses.items()]
        _table(out, "answers not yet used", ["key", "question", "answer"], rows)
    columns = ["at", "kind", "attempt", "what", "run", "where", "key", "took", "outcome"]
    running = record.status == "working"
    rows = [[row[c] for c in columns] for row in history_rows(record.history, running)]
    _table(out, "history", columns, rows)  # steps that ran (every run of each) and operators' actions
    if record.result is not None:
        out.print(f"  result: {escape(_short(record.result, 400))}")
    if record.error is not None:
        out.print(f"  [red]error: {escape(_short(record.error, 400))}[/]")
    return EXIT_OK


def _question_text(ask: AskView) -> str:
    if ask["question"] is None:
        return "(not recorded: journaled before questions were kept)"
    title = f"[{ask['title']}] " if ask.get("title") else ""
    return _short(title + ask["question"], 400)


def _short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(out: Console, title: str, columns: list[str], rows: list[list[str]]) -> None:
    if not rows:
        out.print(f"  {title}: none")
        return
    table = Table(title=f"  {title}", title_justify="left", show_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    out.print(table)


async def cancel_task(
    url: str,
    namespace: str | None,
    task_id: str,
    out: Console,
    seal: RecordSeal | None = None,
    bus: str | None = None,
) -> int:
    """Through `TaskAdmin.cancel`: the same compare-and-set transition as `tasks/cancel` (no key needed)."""
    opened, record = await _load(url, namespace, task_id, seal)
    try:
        if record.terminal:
            out.print(f"task {escape(task_id)} already {record.status}; nothing to cancel")
            return EXIT_OK
        if record.cancel_requested:
            out.print(f"task {escape(task_id)}: cancel already requested; its worker stops it at its next await")
            return EXIT_OK
        try:
            async with fleet_bus(bus, namespace) as fleet:
                changed, running = await opened.call(lambda: TaskAdmin(opened.store, bus=fleet).cancel(task_id))
        except TaskUnknown:
            raise CliError(f"task {task_id!r} disappeared (expired or purged)") from None
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
        if running:
            out.print(f"task {escape(task_id)}: cancel requested; {escape(changed.lease_owner or '?')} stops it")
        else:
            out.print(f"task {escape(task_id)} {changed.status}")
        return EXIT_OK
    finally:
        await opened.close()


async def rerun_task(
    url: str,
    namespace: str | None,
    task_id: str,
    out: Console,
    seal: RecordSeal | None = None,
    from_step: str | None = None,
    bus: str | None = None,
) -> int:
    """Through `TaskAdmin.rerun`: a failed task back to `working`, its journal kept (needs the key if sealed);
    with `from_step`, any finished task forked from that step."""
    opened, _ = await _load(url, namespace, task_id, seal)
    try:
        try:
            async with fleet_bus(bus, namespace) as fleet:
                admin = TaskAdmin(opened.store, bus=fleet)
                changed = await opened.call(lambda: admin.rerun(task_id, from_step=from_step, by=_operator()))
        except TaskSealed:
            raise CliError(f"task {task_id!r}: {NO_KEY}") from None
        except (ValueError, RuntimeError) as exc:
            raise CliError(str(exc)) from None
        except TaskUnknown:
            raise CliError(f"task {task_id!r} disappeared (expired or purged)") from None
        if from_step is not None:
            out.print(
                f"task {escape(task_id)}: forked from step {escape(repr(changed.history[-1].get('step')))}, attempt "
                f"{changed.attempt} queued; the next scan of an instance serving {escape(changed.flow)!r} replays the "
                "steps before it and runs it and the rest again",
                soft_wrap=True,
            )
            return EXIT_OK
        out.print(
            f"task {escape(task_id)}: attempt {changed.attempt} queued; the next scan of an instance serving "
            f"{escape(changed.flow)!r} replays it (finished steps are kept, the failed one runs again)",
            soft_wrap=True,
        )
        return EXIT_OK
    finally:
        await opened.close()


def _operator() -> str:
    """Who acts, for the task's history: this tool, and the login running it where known."""
    try:
        return f"mrtr tasks ({getpass.getuser()})"
    except (OSError, KeyError, ImportError):
        return "mrtr tasks"


async def purge_tasks(url: str, namespace: str | None, yes: bool, out: Console) -> int:
    opened = open_view(url, namespace)
    try:
        now = time.time()
        if not yes:
            count = await opened.call(lambda: opened.store.count_expired(now))
            out.print(f"{count} expired task(s) in {opened.label} would be deleted; rerun with --yes to delete them")
            return EXIT_OK
        count = await opened.call(lambda: TaskAdmin(opened.store, clock=lambda: now).purge_expired())
        out.print(f"deleted {count} expired task(s) from {opened.label}")
        return EXIT_OK
    finally:
        await opened.close()


async def reseal_tasks(
    url: str, namespace: str | None, seal: RecordSeal | None, batch: int, out: Console, err: Console
) -> int:
    """Through `TaskAdmin.reseal`: every live record sealed under the ring's first key, a batch at a time."""
    if seal is None:
        raise UsageError("reseal needs the key ring: MRTR_STATE_KEY (hex keys, newest first) or --key-file")
    opened = open_view(url, namespace)
    try:
        admin = TaskAdmin(opened.store, seal=seal)

        def progress(done: Any) -> None:
            err.print(f"  {done.rewritten} rewritten, {done.current} already current so far")

        done = await opened.call(lambda: admin.reseal(batch=batch, on_batch=progress))
    finally:
        await opened.close()
    out.print(
        f"resealed {opened.label}: {done.rewritten} rewritten under the first key, {done.current} already were, "
        f"{done.unreadable} no key of the ring opens, {done.busy} kept changing (a live instance rewrote them)",
        soft_wrap=True,
    )
    if done.unreadable or done.busy:
        raise CliError(
            "some records are not sealed under the first key yet: keep the older keys in the ring "
            "(and run reseal again)"
        )
    return EXIT_OK


__all__ = [
    "SEALED_TEXT",
    "STATUSES",
    "AnswerView",
    "AskView",
    "Filters",
    "JournalUnread",
    "JournalView",
    "StepView",
    "TaskRow",
    "ago",
    "cancel_task",
    "ask_view",
    "describe_journal",
    "iso",
    "journal_view",
    "lease_text",
    "list_tasks",
    "purge_tasks",
    "record_data",
    "reseal_tasks",
    "seconds",
    "select",
    "show_task",
    "summary",
]
