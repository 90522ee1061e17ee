"""A round that became a task, as the replay guard keeps its outcome and gives it again to a resend."""

from __future__ import annotations

from mrtr._engine.spec import TaskStarted
from mrtr._guard import _replayed, _value_outcome
from mrtr._wire import CreateTaskResult
from tests.unit.tasks.kit import COUNT

STORED_BEFORE = {
    "k": "task",
    "r": {
        "taskId": "t1",
        "status": "working",
        "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:00Z",
        "ttlMs": None,
        "pollIntervalMs": 500,
        "resultType": "task",
    },
}
"""An outcome as the guard stored it while `TaskStarted.result` was the wire dict."""


def test_the_kept_outcome_is_the_result_as_sent_and_comes_back_typed() -> None:
    started = TaskStarted(CreateTaskResult.model_validate(STORED_BEFORE["r"]))
    kept = _value_outcome(started)
    assert kept == STORED_BEFORE, "the stored format is unchanged: the wire CreateTaskResult"
    again = _replayed(COUNT, kept)
    assert isinstance(again, TaskStarted) and isinstance(again.result, CreateTaskResult)
    assert again.result == started.result and again.result.wire() == STORED_BEFORE["r"]
