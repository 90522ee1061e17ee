"""Fork a finished task from a step, export it, and replay it against edited code (#38).

The flows live in a module written to a temporary directory, so the very code that ran a task
(served by a real task runtime over a SQLite file) is what `mrtr replay --app` imports, and an
edited copy of it (a question reworded, a step renamed) is a second module next to it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mcp import Client

from mrtr.client import TasksClient, update_task
from mrtr.stores import RecordSeal, SealedStore
from mrtr.stores._sqlite import SQLiteStore
from mrtr.tasks import StepUnknown, TaskAdmin
from mrtr.testing import ReplayDiverged, replay_export
from tests.support.flowkit import task_state

pytestmark = pytest.mark.anyio

APP = """
import os
from collections import Counter

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr.stores._sqlite import SQLiteStore

runs: Counter[str] = Counter()
KEY = bytes.fromhex(os.environ["FORK_APP_KEY"])
server = MCPServer("fork-replay", request_state_security=RequestStateSecurity(keys=[KEY]))
flows = mrtr.Flows(
    server,
    store=SQLiteStore(os.environ.get("FORK_APP_DB", ":memory:")),
    task_poll_interval=0.05,
    task_scan_interval=0.2,
)


class Approve(BaseModel):
    ok: bool


def one() -> str:
    runs["one"] += 1
    return "one"


def two() -> str:
    runs["two"] += 1
    return f"two#{runs['two']}"


def three() -> str:
    runs["three"] += 1
    return "three"


@flows.tool(task="required")
async def trio(ctx: mrtr.FlowContext, target: str) -> str:
    first = await ctx.step("one", one)
    start = await ctx.elicit(f"Start {target}?", Approve)
    second = await ctx.step(STEP_TWO, two)
    ship = await ctx.elicit(QUESTION, Approve)
    third = await ctx.step("three", three)
    return f"{first} {second} {third} start={start.ok} ship={ship.ok}"
"""
ORIGINAL = {"STEP_TWO": '"two"', "QUESTION": 'f"Ship {target}?"'}


def write_app(directory: Path, name: str, **edits: str) -> Path:
    text = APP
    for marker, value in (ORIGINAL | edits).items():
        text = text.replace(marker, value)
    path = directory / f"{name}.py"
    path.write_text(text)
    return path


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mrtr_cli(directory: Path, key: bytes | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MRTR_STATE_KEY", "FORK_APP_DB")}
    env["FORK_APP_KEY"] = (key or os.urandom(32)).hex()
    if key is not None:
        env["MRTR_STATE_KEY"] = key.hex()
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "mrtr.cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env, cwd=directory
    )


async def _never(*args: Any) -> Any:
    raise AssertionError("these tests answer through tasks/update")


async def wait_for(session: Any, task_id: str, status: str, attempt_text: str = "", timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status and (status != "completed" or "result" in task):
                return task
            await asyncio.sleep(0.05)


async def answer_next(session: Any, task_id: str, fragment: str) -> str:
    """Answer the one outstanding ask (its message must hold `fragment`); returns its key."""
    task = await wait_for(session, task_id, "input_required")
    [(key, request)] = task["inputRequests"].items()
    assert fragment in request["params"]["message"], request
    await update_task(session, task_id, {key: {"action": "accept", "content": {"ok": True}}})
    return str(key)


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes]:
    key = os.urandom(32)
    monkeypatch.setenv("FORK_APP_KEY", key.hex())
    monkeypatch.setenv("FORK_APP_DB", str(tmp_path / "tasks.db"))
    return tmp_path, key


@pytest.mark.spawns  # the real mrtr CLI
async def test_fork_from_a_step_export_and_replay(app_dir: tuple[Path, bytes]) -> None:
    directory, key = app_dir
    app = load(write_app(directory, "app_v1"))
    write_app(directory, "app_reworded", QUESTION='f"Ship {target} to production?"')
    write_app(directory, "app_renamed", STEP_TWO='"second"')
    db = directory / "tasks.db"
    store = f"sqlite:///{db}"
    runs: Counter[str] = app.runs

    async with Client(app.server, extensions=[TasksClient(_never)], elicitation_callback=_never) as client:
        created = await client.session.call_tool("trio", {"target": "api"}, allow_claimed=True)
        task_id = created.task_id
        start_key = await answer_next(client.session, task_id, "Start api?")
        ship_key = await answer_next(client.session, task_id, "Ship api?")
        done = await wait_for(client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "one two#1 three start=True ship=True"
        assert runs == Counter(one=1, two=1, three=1)

        # Export: one JSON document, the journal numbered; replayed on the code that ran it.
        exported = await asyncio.to_thread(mrtr_cli, directory, key, "tasks", "export", task_id, "--store", store)
        assert exported.returncode == 0, exported.stderr
        document = json.loads(exported.stdout)
        assert document["task"]["status"] == "completed" and document["arguments"] == {"target": "api"}
        kinds = [(e["index"], e["kind"], e["key"]) for e in document["journal"]["entries"]]
        assert kinds == [
            (0, "step", "one"),
            (1, "step", "two"),
            (2, "step", "three"),
            (3, "answer", start_key),
            (4, "answer", ship_key),
        ]
        answers = document["journal"]["entries"][3:]
        assert [e.get("questionText") for e in answers] == ["Start api?", "Ship api?"], answers
        assert all(e["askKind"] == "elicit" and e["answeredAt"] >= e["askedAt"] for e in answers), answers
        ends = [h["key"] for h in document["history"] if h.get("phase") != "start"]
        assert document["result"] == done["result"] and ends == [
            "one",
            "two",
            "three",
        ]
        (directory / "task.json").write_text(exported.stdout)
        keyless = await asyncio.to_thread(mrtr_cli, directory, None, "tasks", "export", task_id, "--store", store)
        assert keyless.returncode == 2 and "sealed at rest" in keyless.stderr, keyless.stderr
        unknown = await asyncio.to_thread(mrtr_cli, directory, key, "tasks", "export", "nope", "--store", store)
        assert unknown.returncode == 2 and "no task 'nope'" in unknown.stderr

        same = await asyncio.to_thread(mrtr_cli, directory, key, "replay", "task.json", "--app", "app_v1:flows")
        assert same.returncode == 0, same.stdout + same.stderr
        assert "replays" in same.stdout and "completes with the same result" in same.stdout, same.stdout
        via_server = await asyncio.to_thread(mrtr_cli, directory, key, "replay", "task.json", "--app", "app_v1:server")
        assert via_server.returncode == 0, via_server.stdout + via_server.stderr
        reworded = await asyncio.to_thread(
            mrtr_cli, directory, key, "replay", "task.json", "--app", "app_reworded:flows"
        )
        assert reworded.returncode == 1, reworded.stdout + reworded.stderr
        assert f"entry 4 (answer {ship_key!r})" in reworded.stdout, reworded.stdout
        assert "Ship api to production?" in reworded.stdout, reworded.stdout
        renamed = await asyncio.to_thread(
            mrtr_cli, directory, key, "replay", "task.json", "--app", "app_renamed:flows", "--json"
        )
        assert renamed.returncode == 1, renamed.stdout + renamed.stderr
        verdict = json.loads(renamed.stdout)
        assert verdict["divergence"]["index"] == 1 and verdict["divergence"]["entry"]["key"] == "two"
        assert "'second'" in verdict["divergence"]["code"] and "not run" in verdict["divergence"]["code"]
        bad = await asyncio.to_thread(mrtr_cli, directory, key, "replay", "nope.json", "--app", "app_v1:flows")
        assert bad.returncode == 2 and "cannot read nope.json" in bad.stderr
        no_app = await asyncio.to_thread(mrtr_cli, directory, key, "replay", "task.json", "--app", "app_v1")
        assert no_app.returncode == 2 and "MODULE:ATTR" in no_app.stderr
        assert runs == Counter(one=1, two=1, three=1), "replays ran nothing in this process"

        # The same from Python (the replay module's own step counter stays at zero).
        report = await replay_export(app.flows, directory / "task.json")
        assert report.ok and report.used == 5 and runs == Counter(one=1, two=1, three=1)
        with pytest.raises(ReplayDiverged) as diverged:
            await replay_export(load(directory / "app_renamed.py").flows, directory / "task.json")
        assert diverged.value.report.divergence is not None and diverged.value.report.divergence.index == 1
        assert "entry 1 (step 'two')" in str(diverged.value)

        # Fork from step 2: unknown steps and unfinished tasks are refused, clearly.
        nope = await asyncio.to_thread(
            mrtr_cli, directory, key, "tasks", "rerun", task_id, "--from-step", "nope", "--store", store
        )
        assert nope.returncode == 2 and "has no step 'nope'" in nope.stderr and "'two'" in nope.stderr, nope.stderr
        assert "Traceback" not in nope.stderr
        forked = await asyncio.to_thread(
            mrtr_cli, directory, key, "tasks", "rerun", task_id, "--from-step", "two", "--store", store
        )
        assert forked.returncode == 0 and "forked from step 'two'" in forked.stdout, forked.stdout + forked.stderr
        again = await asyncio.to_thread(
            mrtr_cli, directory, key, "tasks", "rerun", task_id, "--from-step", "two", "--store", store
        )
        assert again.returncode == 2 and "only finished tasks" in again.stderr, again.stderr
        # The answer given before step 2 is kept; the ask after it is asked again.
        asked_again = await answer_next(client.session, task_id, "Ship api?")
        assert asked_again == ship_key
        done = await wait_for(client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "one two#2 three start=True ship=True"
        assert runs == Counter(one=1, two=2, three=2), "steps 2 and 3 ran again, step 1 did not"

        # Through the API: a forked task that is not finished, and unknown steps.
        admin = TaskAdmin(SQLiteStore(str(db)), seal=RecordSeal.from_keys([key]))
        try:
            with pytest.raises(StepUnknown, match="no step 'four'"):
                await admin.rerun(task_id, from_step="four")
            forked_record = await admin.rerun(task_id, from_step="three", by="a test")
            assert forked_record.attempt == 3 and forked_record.status == "working"
            done = await wait_for(client.session, task_id, "completed")
            while "result" not in done or runs["three"] < 3:
                await asyncio.sleep(0.05)
                done = await task_state(client.session, task_id)
            assert runs == Counter(one=1, two=2, three=3), "only step 3 ran again; no ask came before it"
        finally:
            await admin.store.close()

    reader = SealedStore(SQLiteStore(str(db)), RecordSeal.from_keys([key]))
    record = await reader.load(task_id, time.time())
    await reader.close()
    assert record is not None
    forks = [(e["step"], e["attempt"], e.get("by", "")) for e in record.history if e["kind"] == "fork"]
    assert forks[0][:2] == ("two", 2) and forks[0][2].startswith("mrtr tasks"), forks
    assert forks[1] == ("three", 3, "a test"), forks
    ran = [(e["key"], e["attempt"]) for e in record.history if e["kind"] == "step" and e.get("phase") == "end"]
    assert ran == [("one", 1), ("two", 1), ("three", 1), ("two", 2), ("three", 2), ("three", 3)]
