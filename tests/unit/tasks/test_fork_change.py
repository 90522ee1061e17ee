"""The record a fork leaves (`mrtr.tasks._fork.fork_change`), and the journal entries an export shows."""

from __future__ import annotations

import pytest

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr.stores import TaskRecord
from mrtr.tasks import StepUnknown
from mrtr.tasks._export import journal_entries
from mrtr.tasks._fork import fork_change


def finished(status: str = "completed") -> TaskRecord:
    journal = Journal.start()
    journal.steps = {"one": ("d1", 1), "two": ("d2", 2), "0/side": ("d3", 3), "three": ("d4", 4), "two#2": ("d5", 5)}
    journal.answers = {"gate": ("q1", {"ok": True}), "ship": ("q2", {"ok": False})}
    journal.pending = {"ship": "q2"}
    history = [{"at": 1.0, "kind": "step", "key": k, "seconds": 0.1, "attempt": 1} for k in journal.steps]
    history.append({"at": 2.0, "kind": "step", "key": "four", "seconds": 0.1, "attempt": 1, "error": "boom"})
    return TaskRecord(
        task_id="t1",
        flow="trio",
        arguments={},
        capabilities={},
        status=status,  # type: ignore[arg-type]
        created_at=0.0,
        updated_at=0.0,
        ttl_ms=None,
        poll_interval_ms=500,
        journal=journal_codec.encode(journal),
        result={"content": []} if status == "completed" else None,
        history=history,  # type: ignore[arg-type]
    )


def test_a_fork_cuts_that_step_and_the_later_ones_and_marks_the_point() -> None:
    forked = fork_change(finished(), "two", 100.0, by="someone")
    journal = journal_codec.decode(forked.journal)
    assert list(journal.steps) == ["one"], "steps journaled from `two` on run again"
    assert journal.answers.keys() == {"gate", "ship"}, "answers are dropped by the run that reaches the fork point"
    assert journal.fork_from == "two" and journal.pending == {} and journal.started_at == 100.0
    assert (forked.status, forked.attempt, forked.result, forked.lease_owner) == ("working", 2, None, None)
    assert forked.history[-1] == {"at": 100.0, "kind": "fork", "step": "two", "attempt": 2, "by": "someone"}
    assert journal_codec.decode(journal_codec.encode(journal)).fork_from == "two", "the fork point travels"


def test_fork_points_by_key_by_name_and_from_the_history() -> None:
    assert list(journal_codec.decode(fork_change(finished(), "two#2", 1.0).journal).steps) == [
        "one",
        "two",
        "0/side",
        "three",
    ]
    assert list(journal_codec.decode(fork_change(finished(), "side", 1.0).journal).steps) == ["one", "two"]
    raised = journal_codec.decode(fork_change(finished("failed"), "four", 1.0).journal)
    assert len(raised.steps) == 5 and raised.fork_from == "four", "a step that raised cuts nothing"


def test_unknown_steps_and_unfinished_tasks_are_refused_clearly() -> None:
    with pytest.raises(StepUnknown, match=r"task 't1': the task has no step 'nope'; its steps: 'one', 'two'"):
        fork_change(finished(), "nope", 1.0)
    with pytest.raises(ValueError, match="only finished tasks"):
        fork_change(finished("input_required"), "two", 1.0)


def test_export_entries_show_what_the_journal_holds_for_each_ask() -> None:
    journal = journal_codec.decode(finished().journal)
    journal.extras = {"q": {"ship": {"text": "Ship it?"}}}
    entries = journal_entries(journal, outstanding=False)
    assert [(e["index"], e["kind"], e["key"]) for e in entries][-2:] == [(5, "answer", "gate"), (6, "answer", "ship")]
    assert entries[6]["recorded"] == {"q": {"text": "Ship it?"}} and "recorded" not in entries[5]
    assert journal_entries(journal)[-1] == {"index": 7, "kind": "ask", "key": "ship", "question": "q2"}
