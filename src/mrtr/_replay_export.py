"""Replay an exported task (`mrtr tasks export`) against the current code: `mrtr replay`, and
`mrtr.testing.replay_export` for pytest.

Temporal's Replayer, on mrtr's journal: the flow runs once, in process, as a dry run
(`RunOptions(dry_run=True)`): steps the journal holds return their recorded values, asks are
answered from the journal, and nothing else happens: a step the journal lacks is reported, not
run, and no network or store is touched. The run must reach the point the task had reached:
the same outstanding asks (same keys, same questions), the same durable waits, the same
result or error, or, for a task whose step raised, that same step. Otherwise the first
divergence is reported: which journal entry (its number in the export's `journal.entries`),
what the journal holds there, and what the code did instead.

What counts is what production would do with the new code, so it follows the engine's own
rules: answers are found by key and question, steps by name and arguments, in any order. A
pure reorder of two asks (or two steps) replays cleanly; a reworded question, a renamed
step, a step called with other arguments, or a changed result does not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp_types import ClientCapabilities

from mrtr._engine import journal as journal_codec
from mrtr._engine.asks import Ask
from mrtr._engine.journal import Journal, JournalFormatError
from mrtr._engine.run import Outcome, RunOptions, execute
from mrtr._host.base import BaseFlows
from mrtr._wire import JSONObject
from mrtr.tasks._export import FORMAT, journal_entries, step_kind
from mrtr.tasks._outcome import Settled
from mrtr.tasks._outcome import settle as settle_task

if TYPE_CHECKING:
    from mrtr.tasks._seam import ConvertResult

_SHORT = 160


class ExportUnreadable(ValueError):
    """Not an mrtr task export (or one this mrtr cannot read)."""


@dataclass(frozen=True)
class Divergence:
    """The first place the code parts from the journal."""

    index: int | None
    """The journal entry (its `index` in the export's `journal.entries`); None: the task's end state."""
    entry: Mapping[str, Any] | None
    journal: str
    """What the journal (or the task's end state) holds there."""
    code: str
    """What the code did instead."""

    def __str__(self) -> str:
        if self.entry is None:
            where = "the task's end"
        else:
            where = f"entry {self.index} ({self.entry['kind']} {self.entry['key']!r})"
        return f"{where}: the journal holds {self.journal}; the code {self.code}"


@dataclass
class ExportReplay:
    """What replaying one exported task against the current code found."""

    task_id: str
    flow: str
    status: str
    """The task's status when it was exported."""
    entries: int
    """Journal entries in the export."""
    used: int = 0
    """Entries the code reached and used."""
    reached: str = ""
    """Where the code stopped, for people."""
    divergence: Divergence | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def explain(self) -> str:
        head = f"task {self.task_id} (flow {self.flow!r}, {self.status})"
        if self.ok:
            return f"{head} replays: {self.used} of {self.entries} journal entries used; the code {self.reached}"
        return f"{head} diverges at {self.divergence}"


class ReplayDiverged(AssertionError):
    """`replay_export` found a divergence (`report.divergence`); an AssertionError, so pytest shows it."""

    def __init__(self, report: ExportReplay) -> None:
        super().__init__(report.explain())
        self.report = report


def load_export(source: str | os.PathLike[str] | Mapping[str, Any]) -> JSONObject:
    """An export document: a path to its JSON file, or the document itself.

    Raises:
        ExportUnreadable: Not an mrtr task export.
        OSError: The file cannot be read.
    """
    if isinstance(source, Mapping):
        document = dict(source)
    else:
        try:
            document = json.loads(Path(source).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ExportUnreadable(f"{source} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ExportUnreadable(f"not an mrtr task export (format {FORMAT!r}); make one with `mrtr tasks export`")
    task, journal = document.get("task"), document.get("journal")
    if not isinstance(task, dict) or "flow" not in task or not isinstance(journal, dict) or "wire" not in journal:
        raise ExportUnreadable("the export lacks task.flow or journal.wire")
    return document


async def replay_export(flows: BaseFlows, export: str | os.PathLike[str] | Mapping[str, Any]) -> ExportReplay:
    """Replay an exported task against the flows registered on `flows` (`mrtr.Flows` or `mrtr.fastmcp.Flows`).

    Returns the report when the code reaches the point the task had reached.

    Raises:
        ReplayDiverged: (an `AssertionError`) The code parts from the journal; the message
            names the first divergence: the entry, what the journal holds, what the code did.
        ExportUnreadable: Not an mrtr task export.
    """
    report = await replay_document(flows, load_export(export))
    if not report.ok:
        raise ReplayDiverged(report)
    return report


async def replay_document(flows: BaseFlows, document: Mapping[str, Any]) -> ExportReplay:
    """`replay_export`'s work, returning the report whatever it found (the CLI prints it)."""
    task = document["task"]
    name = str(task["flow"])
    try:
        recorded = Journal.from_wire(document["journal"]["wire"])
    except JournalFormatError as exc:
        raise ExportUnreadable(f"the export's journal cannot be read: {exc}") from None
    finished = task.get("status") in ("completed", "failed", "cancelled")
    entries = journal_entries(recorded, outstanding=not finished)
    report = ExportReplay(str(task.get("taskId", "?")), name, str(task.get("status", "?")), len(entries))
    spec = flows.specs.get(name)
    if spec is None:
        known = ", ".join(sorted(flows.specs)) or "none"
        registers = f"registers no such flow (it has: {known})"
        report.divergence = Divergence(None, None, f"a task of flow {name!r}", registers)
        return report
    convert = _converter(flows, name)
    capabilities = document.get("capabilities") or None
    declared = ClientCapabilities.model_validate(capabilities) if capabilities else None
    copy = journal_codec.decode(journal_codec.encode(recorded))  # the run may prune what it reads
    outcome = await execute(spec, copy, {}, declared, dict(document.get("arguments") or {}), RunOptions(dry_run=True))
    _judge(report, document, entries, outcome, spec, convert)
    return report


def _converter(flows: BaseFlows, name: str) -> ConvertResult | None:
    core = flows._core
    if not core.has_engine:
        return None
    served: Mapping[str, tuple[Any, ConvertResult]] = getattr(core.engine(), "flows", {})
    entry = served.get(name)
    return None if entry is None else entry[1]


def _judge(
    report: ExportReplay,
    document: Mapping[str, Any],
    entries: Sequence[Mapping[str, Any]],
    outcome: Outcome,
    spec: Any,
    convert: ConvertResult | None,
) -> None:
    replay = outcome.replay
    used_steps, used_answers = replay._used_steps, replay._used_answers
    parked = dict(replay.parked)
    asked = {key: ask.digest for key, ask in parked.items()}

    def used(entry: Mapping[str, Any]) -> bool:
        kind, key = entry["kind"], entry["key"]
        if kind == "answer":
            return key in used_answers
        if kind == "ask":
            return bool(asked.get(key) == entry["question"])
        return key in used_steps

    unused = [entry for entry in entries if not used(entry)]
    report.used = len(entries) - len(unused)

    def first(*kinds: str) -> Mapping[str, Any] | None:
        for group in kinds:
            for entry in unused:
                if (entry["kind"] == group) if group in ("answer", "ask") else (group == "step" and _is_step(entry)):
                    return entry
        return None

    task = document["task"]
    status = str(task.get("status"))
    would_run = list(outcome.would_run)
    waits = [key for key in would_run if step_kind(key) in ("timer", "event", "callback")]
    new_steps = [key for key in would_run if key not in waits]

    def diverge(entry: Mapping[str, Any] | None, code: str, end: str | None = None) -> None:
        if entry is None:
            report.divergence = Divergence(None, None, end or _end_state(document), code)
        else:
            report.divergence = Divergence(entry["index"], entry, _holds(entry), code)

    if outcome.error is not None and not _fails_alike(document, spec, convert, outcome):
        diverge(first("step", "answer", "ask"), f"raised {type(outcome.error).__name__}: {_short(outcome.error)}")
        return
    if new_steps:
        code = f"reached step {new_steps[0]!r}, which the journal lacks (reported, not run)"
        entry = first("step", "answer", "ask")
        if entry is not None:
            diverge(entry, code)
        elif new_steps[0] == _raised_step(document) or status in ("working", "cancelled"):
            report.reached = f"stops before step {new_steps[0]!r}, " + (
                "which raised when the task ran (not run here)" if status not in ("working", "cancelled") else "not run"
            )
        else:
            diverge(None, code)
        return
    if parked:
        key, ask = next(iter(parked.items()))
        fresh = [k for k in parked if asked[k] != recorded_pending(document).get(k)]
        if fresh:
            key, ask = fresh[0], parked[fresh[0]]
        code = f"asked {_describe(ask)} (key {key!r})" + (" instead" if fresh else "")
        entry = first("answer", "ask", "step")
        if entry is not None or fresh or status != "input_required":
            diverge(entry, code)
            return
        report.reached = f"waits for the same answer(s): {', '.join(map(repr, parked))}"
        return
    if waits:
        entry = first("step", "answer", "ask")
        pending_waits = [w.get("kind") for w in task.get("waiting") or []]
        if entry is not None or (status != "working" or not pending_waits):
            if status in ("cancelled",) and entry is None:
                report.reached = f"waits on {', '.join(map(repr, waits))}, where it was cancelled"
                return
            diverge(entry, f"waits on {', '.join(map(repr, waits))}" + (" instead" if entry is not None else ""))
            return
        report.reached = f"waits on the same {', '.join(map(repr, waits))}"
        return
    # The flow ended (returned, or raised as the task did).
    entry = first("step", "answer", "ask")
    ended = "raised as the task did" if outcome.error is not None else f"returned {_short(outcome.value)}"
    if entry is not None:
        diverge(entry, f"{ended} without reaching it")
        return
    if outcome.error is not None:
        report.reached = f"fails with the same {'error' if status == 'failed' else 'tool error'}"
        return
    settled = settle(spec, convert, outcome, report.task_id) if convert is not None else None
    if status not in ("completed", "failed"):
        if status == "cancelled":
            report.reached = f"{ended} (the task was cancelled before it could)"
            return
        diverge(None, ended)
        return
    if settled is not None and (settled.status, settled.result, settled.error) != (
        status,
        document.get("result"),
        document.get("error"),
    ):
        shown = settled.result if settled.result is not None else settled.error
        diverge(None, f"ended {settled.status} with {_short(shown)}")
        return
    report.reached = "completes with the same result" if settled is not None else "returns (no result to compare)"


def settle(spec: Any, convert: ConvertResult, outcome: Outcome, task_id: str) -> Settled:
    """The state the run would leave the task in, as every engine records it (`mrtr.tasks._outcome`).

    Quietly: a worker logs a flow's exception with its traceback; a replay reports it in one line.
    """
    with _quiet("mrtr.tasks.outcome"):
        return settle_task(spec, convert, outcome, task_id)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    was, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was


def recorded_pending(document: Mapping[str, Any]) -> dict[str, str]:
    if document["task"].get("status") != "input_required":
        return {}
    pending = document["journal"]["wire"].get("p") or {}
    return {str(k): str(v) for k, v in pending.items()}


def _is_step(entry: Mapping[str, Any]) -> bool:
    return entry["kind"] not in ("answer", "ask")


def _fails_alike(document: Mapping[str, Any], spec: Any, convert: ConvertResult | None, outcome: Outcome) -> bool:
    """The code raised, and so did the task: the same protocol error, or the same tool error."""
    status = document["task"].get("status")
    if status not in ("completed", "failed") or convert is None or outcome.replay.parked or outcome.would_run:
        return False
    if status == "completed" and not (document.get("result") or {}).get("isError"):
        return False
    settled = settle(spec, convert, outcome, str(document["task"].get("taskId")))
    return (settled.status, settled.result, settled.error) == (status, document.get("result"), document.get("error"))


def _raised_step(document: Mapping[str, Any]) -> str | None:
    """The step whose error ended the task's last attempt, per its history."""
    attempt = document["task"].get("attempt")
    steps = [e for e in document.get("history") or [] if e.get("kind") == "step" and e.get("attempt") == attempt]
    if steps and steps[-1].get("error"):
        return str(steps[-1].get("key"))
    return None


def _holds(entry: Mapping[str, Any]) -> str:
    kind, key = entry["kind"], entry["key"]
    if kind == "answer":
        recorded = entry.get("recorded")
        about = f" ({_short(recorded)})" if recorded else ""
        return f"the answer {_short(entry['answer'])} to question {entry['question']}{about}"
    if kind == "ask":
        return f"an outstanding ask {key!r} (question {entry['question']})"
    if kind == "step":
        return f"step {key!r} with result {_short(entry['result'])}"
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} wait {key!r} ({_short(entry['result'])})"


def _end_state(document: Mapping[str, Any]) -> str:
    status = document["task"].get("status")
    if status == "completed":
        return f"a task that completed with {_short(document.get('result'))}"
    if status == "failed":
        return f"a task that failed with {_short(document.get('error'))}"
    if status == "input_required":
        return f"a task waiting for {', '.join(map(repr, recorded_pending(document))) or 'input'}"
    return f"a task left {status}"


def _describe(ask: Ask) -> str:
    params = getattr(ask.request, "params", None)
    message = getattr(params, "message", None)
    if isinstance(message, str):
        return f"{ask.kind} {_short(message)}"
    messages = getattr(params, "messages", None)
    if messages:
        content = getattr(messages[-1], "content", None)
        text = getattr(content, "text", None)
        if isinstance(text, str):
            return f"sampling {_short(text)}"
    return f"a {ask.kind} request"


def _short(value: Any) -> str:
    if isinstance(value, BaseException):
        text = " ".join(str(value).split())
    else:
        text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"


__all__ = [
    "Divergence",
    "ExportReplay",
    "ExportUnreadable",
    "ReplayDiverged",
    "load_export",
    "replay_document",
    "replay_export",
]
