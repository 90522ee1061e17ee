"""`mrtr tasks ls|show|cancel|purge` against real stores: a SQLite file, Redis and PostgreSQL.

Each test fills a fresh namespace (a temp file, a random Redis prefix, a random table)
with tasks in every interesting state through the store's own `create`, runs the real
`mrtr` process on it, and checks both what it printed and what the store holds after.
Redis and PostgreSQL are the local services; when one is missing its tests are skipped
with the reason, except under `CI=true`, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr.cli._app import app
from mrtr.stores import TaskRecord, TaskStore, open_store
from tests.support.markers import backends
from tests.support.servers import ROOT
from tests.support.storekit import cluster_url, drop_namespace, service_problem

pytestmark = pytest.mark.spawns  # the real mrtr process

REDIS_URL = os.environ.get("MRTR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get("MRTR_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass
class Target:
    url: str
    namespace: str | None

    def args(self) -> list[str]:
        return ["--store", self.url, *(["--namespace", self.namespace] if self.namespace else [])]

    def store(self) -> TaskStore:
        return open_store(self.url, namespace=self.namespace)


def _service_problem(backend: str) -> str | None:
    return asyncio.run(service_problem(backend))


def _cleanup(target: Target, backend: str) -> None:
    asyncio.run(drop_namespace(backend, str(target.namespace), url=target.url))


@pytest.fixture(params=backends("sqlite", "redis", "redis-cluster", "postgres"))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    backend = request.param
    if backend == "sqlite":
        yield Target(f"sqlite:///{tmp_path / 'tasks.db'}", None)
        return
    cluster = cluster_url(backend, request)
    if cluster is not None:
        found = Target(cluster, f"mrtr_cli_{uuid.uuid4().hex[:10]}")
        try:
            yield found
        finally:
            _cleanup(found, backend)
        return
    problem = _service_problem(backend)
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{backend} is required under CI: {problem}")
        pytest.skip(f"{backend} not reachable: {problem}")
    namespace = f"mrtr_cli_{uuid.uuid4().hex[:10]}"
    found = Target(REDIS_URL if backend == "redis" else POSTGRES_DSN, namespace)
    try:
        yield found
    finally:
        _cleanup(found, backend)


def _record(task_id: str, flow: str, status: str, *, age: float, **changes: object) -> TaskRecord:
    now = time.time()
    journal = Journal(flow_id=f"flow-{task_id}", started_at=now - age)
    journal.steps["backup"] = ("digest", {"backup": f"b-{task_id}"})
    journal.answers["cutover"] = ("q", {"action": "accept", "content": {"switch": True}})
    record = TaskRecord(
        task_id=task_id,
        flow=flow,
        arguments={"app": task_id},
        capabilities={},
        status=status,  # type: ignore[arg-type]
        created_at=now - age,
        updated_at=now - age / 2,
        ttl_ms=3_600_000,
        poll_interval_ms=500,
        journal=journal_codec.encode(journal),
    )
    return record.copy(**changes)


def seed(target: Target) -> None:
    """Five tasks: running under a live lease, waiting for input, done, old, and past its TTL."""
    now = time.time()
    records = [
        _record("running", "migrate", "working", age=5, lease_owner="host-a:101:ab", lease_until=now + 60),
        _record(
            "waiting",
            "migrate",
            "input_required",
            age=30,
            status_message="needs a decision",
            input_requests={
                "cutover": {"method": "elicitation/create", "params": {"message": "Switch traffic?"}},
            },
        ),
        _record("done", "deploy", "completed", age=60, result={"content": [{"type": "text", "text": "ok"}]}),
        _record("old", "deploy", "failed", age=7200, ttl_ms=None, error={"code": -32603, "message": "boom"}),
        _record("stale", "deploy", "completed", age=100, ttl_ms=1000),  # expired 99 s ago
    ]

    async def create() -> None:
        store = target.store()
        try:
            for record in records:
                await store.create(record)
        finally:
            await store.close()

    asyncio.run(create())


def load(target: Target, task_id: str) -> TaskRecord | None:
    async def read() -> TaskRecord | None:
        store = target.store()
        try:
            return await store.load(task_id, time.time())
        finally:
            await store.close()

    return asyncio.run(read())


def mrtr(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI in this process (real stores, real commands; a process start per call is slow)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def mrtr_process(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real `mrtr` process, as a script would."""
    return subprocess.run(
        [sys.executable, "-m", "mrtr.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=os.environ | {"COLUMNS": "200"},
    )


def keeps_expired(target: Target) -> bool:
    return not target.url.startswith("redis")


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_ls_lists_live_tasks_newest_first_and_filters(target: Target) -> None:
    seed(target)
    listed = json.loads(ok(mrtr("tasks", "ls", *target.args(), "--json")))
    assert [t["taskId"] for t in listed] == ["running", "waiting", "done", "old"]  # "stale" is past its TTL
    assert listed[1]["inputRequests"] == ["cutover"] and listed[0]["leaseOwner"] == "host-a:101:ab"

    def ids(*extra: str) -> list[str]:
        return [t["taskId"] for t in json.loads(ok(mrtr("tasks", "ls", *target.args(), "--json", *extra)))]

    assert ids("--status", "input_required") == ["waiting"]
    assert ids("--status", "completed", "--status", "failed") == ["done", "old"]
    assert ids("--flow", "deploy") == ["done", "old"]
    assert ids("--older-than", "1h") == ["old"]
    assert ids("--newer-than", "45s") == ["running", "waiting"]
    # Past its TTL a task is hidden; SQL stores keep the row until purged, Redis drops the key itself.
    assert (
        ids("--expired", "--flow", "deploy") == ["done", "stale", "old"] if keeps_expired(target) else ["done", "old"]
    )

    table = ok(mrtr("tasks", "ls", *target.args()))
    assert "4 of 4" in table and "input_required" in table and "cutover" in table
    assert "host-a:101:ab (held" in table


def test_show_prints_the_journal_lease_and_pending_asks(target: Target) -> None:
    seed(target)
    shown = ok(mrtr("tasks", "show", "waiting", *target.args()))
    for expected in (
        "task waiting  flow migrate  input_required",
        "message: needs a decision",
        "flow-waiting:backup",  # the step's idempotency key
        '{"backup": "b-waiting"}',
        "cutover",
        "Switch traffic?",
        '"app": "waiting"',
    ):
        assert expected in shown, f"{expected!r} not in:\n{shown}"
    running = ok(mrtr("tasks", "show", "running", *target.args()))
    assert "lease: host-a:101:ab (held, until in " in running
    data = json.loads(ok(mrtr("tasks", "show", "old", *target.args(), "--json")))
    assert (
        data["error"]["message"] == "boom" and data["journal"]["steps"]["backup"]["idempotencyKey"] == "flow-old:backup"
    )

    missing = mrtr("tasks", "show", "nope", *target.args())
    assert missing.returncode == 2 and "no task 'nope'" in missing.stderr and "Traceback" not in missing.stderr


def test_cancel_is_cooperative_and_idempotent(target: Target) -> None:
    seed(target)
    assert "waiting cancelled" in ok(mrtr("tasks", "cancel", "waiting", *target.args()))
    waiting = load(target, "waiting")
    assert waiting is not None and waiting.status == "cancelled" and waiting.input_requests == {}

    # Running under a live lease: only flagged; the worker holding it stops the flow.
    assert "cancel requested; host-a:101:ab stops it" in ok(mrtr("tasks", "cancel", "running", *target.args()))
    running = load(target, "running")
    assert running is not None and running.status == "working" and running.cancel_requested
    assert "cancel already requested" in ok(mrtr("tasks", "cancel", "running", *target.args()))

    assert "already completed" in ok(mrtr("tasks", "cancel", "done", *target.args()))
    done = load(target, "done")
    assert done is not None and done.status == "completed" and not done.cancel_requested


def test_purge_counts_first_and_deletes_only_with_yes(target: Target) -> None:
    seed(target)
    assert "1 expired task(s)" in ok(mrtr("tasks", "purge", *target.args()))
    listed = json.loads(ok(mrtr("tasks", "ls", *target.args(), "--json", "--expired")))
    assert ("stale" in [t["taskId"] for t in listed]) == keeps_expired(target)  # the dry run deleted nothing
    assert "deleted 1 expired task(s)" in ok(mrtr("tasks", "purge", *target.args(), "--yes"))
    listed = json.loads(ok(mrtr("tasks", "ls", *target.args(), "--json", "--expired")))
    assert [t["taskId"] for t in listed] == ["running", "waiting", "done", "old"]


@pytest.mark.parametrize(
    ("store", "code", "fragment"),
    [
        ("mysql://127.0.0.1/x", 2, "unknown task store URL 'mysql://127.0.0.1/x'"),
        ("sqlite:////nonexistent/dir/tasks.db", 2, "no SQLite task store at /nonexistent/dir/tasks.db"),
        ("redis://127.0.0.1:1/0", 3, "cannot read the store"),
        ("redis+cluster://127.0.0.1:1", 3, "cannot read the store"),
        ("postgresql://postgres@127.0.0.1:1/postgres", 3, "cannot connect to the store"),
    ],
)
def test_a_wrong_store_url_is_a_one_line_error(store: str, code: int, fragment: str) -> None:
    for command in (["ls"], ["show", "x"], ["cancel", "x"], ["purge"]):
        proc = (
            mrtr_process("tasks", *command, "--store", store)
            if command == ["ls"]
            else mrtr("tasks", *command, "--store", store)
        )
        assert proc.returncode == code, (command, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mrtr: ") and fragment in lines[0], proc.stderr


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    import sqlite3

    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    proc = mrtr_process("tasks", "ls", "--store", f"sqlite:///{other}")
    assert proc.returncode == 2 and "is not an mrtr task store" in proc.stderr and "Traceback" not in proc.stderr


def mrtr_answering(answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in this process, with `answer` typed at its prompt."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, input=answer)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def seed_fleet(target: Target) -> None:
    """`seed`, plus tasks waiting for input on `deploy` (two old, one new) and parked on a timer."""
    seed(target)
    now = time.time()
    asking = {"confirm": {"method": "elicitation/create", "params": {"message": "Ship it?"}}}
    records = [
        _record("ask-old-1", "deploy", "input_required", age=2 * 86400, input_requests=asking),
        _record("ask-old-2", "deploy", "input_required", age=3 * 86400, input_requests=asking),
        _record("ask-new", "deploy", "input_required", age=10, input_requests=asking),
        _record("ask-other", "migrate", "input_required", age=2 * 86400, input_requests=asking),
        _record("sleeper", "deploy", "working", age=2 * 86400, waiting=[{"kind": "timer", "name": None, "until": now}]),
    ]

    async def create() -> None:
        store = target.store()
        try:
            for record in records:
                await store.create(record.copy(ttl_ms=None))
        finally:
            await store.close()

    asyncio.run(create())


def test_ls_filters_by_tool_wait_and_age(target: Target) -> None:
    seed_fleet(target)

    def ids(*extra: str) -> list[str]:
        return [t["taskId"] for t in json.loads(ok(mrtr("tasks", "ls", *target.args(), "--json", *extra)))]

    assert ids("--tool", "deploy", "--waiting", "input") == ["ask-new", "ask-old-1", "ask-old-2"]
    assert ids("--flow", "deploy", "--waiting", "input", "--older-than", "1d") == ["ask-old-1", "ask-old-2"]
    assert ids("--waiting", "timer") == ["sleeper"]
    assert ids("--waiting", "nothing") == ["running"]
    assert ids("--waiting", "event") == [] and ids("--waiting", "callback") == []
    bad = mrtr("tasks", "ls", *target.args(), "--waiting", "tuesday")
    assert bad.returncode == 2 and "--waiting takes input, timer, event, callback, nothing" in bad.stderr


def test_bulk_cancel_counts_asks_and_cancels_exactly_the_filtered_tasks(target: Target) -> None:
    seed_fleet(target)
    chosen = ("--status", "input_required", "--tool", "deploy", "--older-than", "1d")
    declined = mrtr_answering("n\n", "tasks", "cancel", *target.args(), *chosen)
    assert declined.returncode == 5, declined
    assert "2 task(s)" in declined.stdout and "nothing changed" in declined.stderr
    assert all(
        r is not None and r.status == "input_required" for r in (load(target, "ask-old-1"), load(target, "ask-old-2"))
    )

    done = mrtr_answering("y\n", "tasks", "cancel", *target.args(), *chosen)
    assert done.returncode == 0, done
    assert "Cancel these 2 task(s)?" in done.stdout and "2 done, 0 skipped, 0 failed" in done.stdout
    for task_id in ("ask-old-1", "ask-old-2"):
        assert task_id in done.stdout
        record = load(target, task_id)
        assert record is not None and record.status == "cancelled"
    for task_id in ("ask-new", "ask-other", "waiting", "sleeper"):  # not matched: untouched
        record = load(target, task_id)
        assert record is not None and record.status != "cancelled", task_id

    again = ok(mrtr("tasks", "cancel", *target.args(), *chosen, "--yes"))
    assert "no unfinished task matches" in again, "cancelled, they no longer wait for input"
    as_json = json.loads(ok(mrtr("tasks", "cancel", *target.args(), "--waiting", "timer", "--yes", "--json")))
    assert as_json == [{"task_id": "sleeper", "before": "working", "after": "cancelled", "outcome": "done", "note": ""}]
    nothing = mrtr("tasks", "cancel", *target.args())
    assert nothing.returncode == 2 and "give a task id, or filters" in nothing.stderr
    both = mrtr("tasks", "cancel", "waiting", *target.args(), "--tool", "deploy")
    assert both.returncode == 2 and "not both" in both.stderr


def test_bulk_rerun_requeues_the_failed_tasks_a_filter_matches(target: Target) -> None:
    seed_fleet(target)
    proc = ok(mrtr("tasks", "rerun", *target.args(), "--tool", "deploy", "--yes"))
    assert "1 task(s)" in proc and "old" in proc and "attempt 2 queued" in proc
    assert "more match but are not failed: left alone" in proc
    old = load(target, "old")
    assert old is not None and old.status == "working" and old.attempt == 2
    done = load(target, "done")
    assert done is not None and done.status == "completed"
    none_left = ok(mrtr("tasks", "rerun", *target.args(), "--status", "failed", "--yes"))
    assert "no failed task matches" in none_left


def test_bulk_purge_deletes_only_finished_tasks_the_filter_matches(target: Target) -> None:
    seed_fleet(target)
    proc = ok(mrtr("tasks", "purge", *target.args(), "--tool", "deploy", "--yes"))
    assert "2 task(s)" in proc and "purged" in proc and "2 done, 0 skipped, 0 failed" in proc
    assert load(target, "done") is None and load(target, "old") is None
    listed = [t["taskId"] for t in json.loads(ok(mrtr("tasks", "ls", *target.args(), "--json", "--tool", "deploy")))]
    assert sorted(listed) == ["ask-new", "ask-old-1", "ask-old-2", "sleeper"], "unfinished tasks stay"
    declined = mrtr_answering("\n", "tasks", "purge", *target.args(), "--status", "input_required")
    assert declined.returncode == 0 and "no finished task matches" in declined.stdout


def test_show_prints_each_asks_question_answer_when_and_who(target: Target) -> None:
    now = time.time()
    journal = Journal(flow_id="flow-approved", started_at=now - 60)
    journal.answers["approval"] = ("dgst", {"action": "accept", "content": {"ok": True}})
    journal.questions["approval"] = {
        "k": "elicit",
        "q": "Approve release 4.2?",
        "t": "Approve",
        "d": "dgst",
        "a": now - 50,
        "r": now - 40,
    }
    journal.pending["approval"] = "dgst"  # the last round's ask: a finished task no longer waits for it
    # A journal written before questions were kept: it still reads, and says so.
    old_wire = {"v": 1, "f": "flow-legacy", "t": round(now - 90, 3), "n": 1, "a": {"go": ["q", {"action": "accept"}]}}
    legacy = journal_codec.decode("j" + json.dumps(old_wire))

    async def create() -> None:
        store = target.store()
        try:
            base = _record("approved", "release", "completed", age=60, owner="f00d" * 16)
            await store.create(base.copy(journal=journal_codec.encode(journal)))
            await store.create(
                _record("legacy", "release", "completed", age=90).copy(journal=journal_codec.encode(legacy))
            )
        finally:
            await store.close()

    asyncio.run(create())
    shown = ok(mrtr("tasks", "show", "approved", *target.args()))
    for expected in ("Approve release 4.2?", "[Approve]", '"ok": true', "f00d", "Z"):
        assert expected in shown, f"{expected!r} not in:\n{shown}"
    assert "waiting for input" not in shown
    data = json.loads(ok(mrtr("tasks", "show", "approved", *target.args(), "--json")))
    ask = data["journal"]["answers"]["approval"]
    assert ask["question"] == "Approve release 4.2?" and ask["title"] == "Approve" and ask["by"] == "f00d" * 16
    assert ask["answeredAt"].endswith("Z") and ask["answer"] == {"action": "accept", "content": {"ok": True}}
    assert data["journal"]["pending"] == {}, "a finished task has no outstanding asks"
    old = ok(mrtr("tasks", "show", "legacy", *target.args()))
    assert "not recorded" in old and "go" in old


def test_an_id_starting_with_a_dash_is_an_argument(target: Target) -> None:
    async def create() -> None:
        store = target.store()
        try:
            await store.create(_record("-Th2dash", "deploy", "input_required", age=5).copy(ttl_ms=None))
        finally:
            await store.close()

    asyncio.run(create())
    assert "task -Th2dash" in ok(mrtr("tasks", "show", "-Th2dash", *target.args()))
    assert "task -Th2dash" in ok(mrtr("tasks", "show", *target.args(), "--", "-Th2dash"))
    assert "-Th2dash cancelled" in ok(mrtr("tasks", "cancel", *target.args(), "-Th2dash"))
    record = load(target, "-Th2dash")
    assert record is not None and record.status == "cancelled"
    refused = mrtr("tasks", "event", "-Th2dash", "go", *target.args())
    assert refused.returncode == 2 and "cancelled" in refused.stderr


def test_show_prints_the_history_with_a_fork_and_who_made_it(target: Target) -> None:
    seed(target)
    assert "history: none" in ok(mrtr("tasks", "show", "done", *target.args()))
    forked = ok(mrtr("tasks", "rerun", "done", "--from-step", "backup", *target.args()))
    assert "forked from step 'backup'" in forked, forked
    shown = ok(mrtr("tasks", "show", "done", *target.args()))
    history = shown[shown.index("  history") :]
    rows = [line for line in history.splitlines() if " fork " in line]
    assert len(rows) == 1, history
    assert "backup" in rows[0] and "forked by mrtr tasks" in rows[0] and " 2 " in rows[0], rows[0]
