"""Claude Code as a tested host: mrtr's MRTR rounds and durable tasks, driven by the real CLI.

Claude Code (npm `@anthropic-ai/claude-code`, pinned in `claude_code/install.py`, installed once
under ~/.cache) runs offline: its model is a local stand-in for the Anthropic API
(`ANTHROPIC_BASE_URL`, `claude_code/model_api.py`) that answers the prompt `CALL <tool> {...}`
with that tool call, and any other traffic is sent to a proxy that does not exist. The MCP
server (`claude_code/server.py`) runs as two processes sharing a key and a task store, behind a
round-robin proxy without stickiness (`tests/support/faultproxy.py`).

- Headless (`claude -p`): a flow of forms (one, two gathered, one) runs as 2026-07-28 MRTR
  rounds, the forms answered by an `Elicitation` hook, the rounds served by both instances.
- Interactive, in tmux: a `task="required"` tool becomes a task Claude Code polls; its task
  panel shows the status message the flow reports ("chunk 2 of 3"); the instance running it is
  killed with SIGKILL mid-step and the other one finishes it; its question is answered in
  Claude Code's form; a second task is stopped from the panel and ends `cancelled`.

Without npm or the npm registry the module skips with the reason, except under CI (env `CI`),
where it fails: a CI machine cannot pass it silently.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.external.claude_code.install import VERSION, Unavailable, ensure_claude_code
from tests.external.claude_code.model_api import ModelAPI, running_model_api
from tests.external.claude_code.server import READY
from tests.support.faultproxy import running_proxy
from tests.support.servers import ServerProcess, ServerSpec, new_key, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns, pytest.mark.needs_node]

SERVER = Path(__file__).parent / "claude_code" / "server.py"
API_KEY = "sk-ant-api03-" + "m" * 80  # Claude Code only checks its shape; the stand-in takes any
FOCUSED = "\u276f"  # the pointer Claude Code puts before the focused line
WAIT = 30.0  # seconds for any one thing Claude Code or the fleet should do


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so Claude Code must be tested", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def claude() -> Path:
    """The pinned Claude Code, installed once per machine (see `claude_code/install.py`)."""
    try:
        return ensure_claude_code()
    except Unavailable as exc:
        _unavailable(f"Claude Code {VERSION} cannot be installed: {exc}")
        raise AssertionError("unreachable") from None


# -- the fleet: two instances, one key, one store ---------------------------------------------------------------


@dataclass
class Fleet:
    workdir: Path
    servers: dict[str, ServerProcess]

    @property
    def gates(self) -> Path:
        return self.workdir / "gates"

    def open_gate(self, n: int) -> None:
        (self.gates / f"chunk-{n}").touch()

    def close_gates(self) -> None:
        for gate in self.gates.iterdir():
            gate.unlink()

    def audit(self) -> list[dict[str, Any]]:
        path = self.workdir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def status_of(self, task_id: str) -> str | None:
        """The task's status as the shared store holds it (a clear column: the payload is sealed)."""
        with sqlite3.connect(self.workdir / "tasks.db") as db:
            row = db.execute("SELECT status FROM mrtr_tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else str(row[0])


@contextmanager
def fleet(workdir: Path) -> Iterator[Fleet]:
    (workdir / "gates").mkdir()
    env = {
        "MRTR_STATE_KEY": new_key(),
        "MRTR_STORE": f"sqlite:///{workdir / 'tasks.db'}",
        "MRTR_GATES": str(workdir / "gates"),
        "MRTR_AUDIT": str(workdir / "audit.log"),
    }
    specs = [ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix=READY) for label in "AB"]
    with spawn_servers(specs, workdir) as servers:
        yield Fleet(workdir, servers)


# -- Claude Code's environment ----------------------------------------------------------------------------------


def claude_setup(
    workdir: Path, api: ModelAPI, mcp_url: str, hooks: dict[str, Any] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments every run shares: a fresh home (onboarded, the work
    directory trusted, the API key approved), the stand-in model, one MCP server, nothing else."""
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    state = {
        "hasCompletedOnboarding": True,
        "theme": "dark",
        "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
        "projects": {str(workdir): {"hasTrustDialogAccepted": True, "allowedTools": []}},
    }
    (home / ".claude.json").write_text(json.dumps(state))
    (workdir / "mcp.json").write_text(json.dumps({"mcpServers": {"trips": {"type": "http", "url": mcp_url}}}))
    (workdir / "settings.json").write_text(json.dumps({"hooks": hooks or {}}))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TERM": "xterm-256color",
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": api.base_url,
        "ENABLE_TOOL_SEARCH": "false",  # offer the MCP tools to the model directly
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # Offline: anything not for 127.0.0.1 goes to a proxy where nothing listens.
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    args = [
        "--mcp-config",
        str(workdir / "mcp.json"),
        "--strict-mcp-config",
        "--settings",
        str(workdir / "settings.json"),
    ]
    return env, args


HOOK = """\
import json, sys
asked = json.load(sys.stdin)
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(asked) + "\\n")
message = asked.get("message", "")
answers = {"Where to?": {"city": "Oslo"}, "How many nights": {"nights": 3}, "Window or aisle?": {"seat": "window"},
           "Book ": {"book": True}}
content = next((a for start, a in answers.items() if message.startswith(start)), None)
out = {"hookEventName": "Elicitation", "action": "accept" if content else "decline", "content": content or {}}
print(json.dumps({"hookSpecificOutput": out}))
"""


async def test_headless_mrtr_rounds_alternate_between_two_instances(claude: Path, tmp_path: Path) -> None:
    hook, asked_log = tmp_path / "hook.py", tmp_path / "asked.jsonl"
    hook.write_text(HOOK)
    command = f"{sys.executable} {hook} {asked_log}"
    hooks = {"Elicitation": [{"matcher": "trips", "hooks": [{"type": "command", "command": command}]}]}
    with fleet(tmp_path) as f:
        upstreams = [f.servers[label].url for label in "AB"]
        async with running_model_api() as api, running_proxy(upstreams) as proxy:
            env, args = claude_setup(tmp_path, api, proxy.url, hooks)
            argv = [str(claude), "-p", "CALL book_trip {}", *args, "--allowedTools", "mcp__trips__book_trip"]
            run = await asyncio.create_subprocess_exec(
                *argv, "--output-format", "json", env=env, cwd=tmp_path,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                out, err = await asyncio.wait_for(run.communicate(), 120)
            finally:
                if run.returncode is None:
                    run.kill()
            assert run.returncode == 0, err.decode()[-3000:]
            answer = json.loads(out)
            calls = proxy.calls("tools/call")
    assert not answer["is_error"] and "booked Oslo for 3 nights, window" in answer["result"], answer
    asked = [json.loads(line)["message"] for line in asked_log.read_text().splitlines()]
    assert asked[0] == "Where to?" and asked[-1] == "Book 3 nights in Oslo, window seat?", asked
    assert sorted(asked[1:3]) == ["How many nights in Oslo?", "Window or aisle?"], "both forms of one round"
    # Four rounds of one tools/call: each after the first carries the sealed state and the answers.
    assert len(calls) == 4, [(c.upstream, c.outcome) for c in calls]
    assert all(c.headers.get("mcp-protocol-version") == "2026-07-28" for c in calls)
    assert all("requestState" in c.params and "inputResponses" in c.params for c in calls[1:])
    assert {c.upstream for c in calls} == set(upstreams), "rounds were served by both instances"


# -- interactive: tasks in tmux -----------------------------------------------------------------------------------


class Screen:
    """Claude Code's interactive UI in a detached tmux session on a private tmux server."""

    def __init__(self, name: str) -> None:
        self.socket = f"mrtr-claude-{os.getpid()}-{name}"

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=False)
        return done.stdout

    def start(self, cwd: Path, env: dict[str, str], argv: list[str]) -> None:
        command = " ".join(["env", "-i", *(f"{k}={_quote(v)}" for k, v in env.items()), *map(_quote, argv)])
        self.tmux("new-session", "-d", "-s", "cc", "-x", "170", "-y", "50", "-c", str(cwd), command)

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "cc", "-S", "-200")

    def keys(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", "cc", key)

    async def type(self, line: str) -> None:
        """Type `line` at the prompt and submit it, once the prompt shows it (an Enter sent sooner is lost)."""
        before = self.text().count(line)
        self.tmux("send-keys", "-t", "cc", "-l", line)
        await until(f"the prompt to show {line!r}", lambda: self.text().count(line) > before, self, timeout=10)
        self.keys("Enter")

    def close(self) -> None:
        self.tmux("kill-server")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


async def until(what: str, check: Callable[[], Any], screen: Screen | None = None, timeout: float = WAIT) -> Any:
    """Wait until `check()` is truthy; its value. On timeout, fail showing the screen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = screen.text() if screen is not None else ""
            pytest.fail(f"waited {timeout:g}s for {what}\n--- screen ---\n{shown}")
        await asyncio.sleep(0.1)


def tmux_problem() -> str | None:
    """None once tmux is there: installed from Debian when missing and running as root (as the
    chaos tests install HAProxy), else why it is not."""
    if shutil.which("tmux") is not None:
        return None
    hint = "install it first: `sudo apt-get install -y tmux` (Claude Code's interactive mode runs in it)"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"tmux is not installed and this is not root with apt-get; {hint}"
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=120"]
    for argv in (["apt-get", *lock, "update"], ["apt-get", *lock, "install", "-y", "tmux"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr[-600:]}; {hint}"
    return None if shutil.which("tmux") else f"apt-get installed tmux but it is not on the PATH; {hint}"


@pytest.fixture
def screen() -> Iterator[Screen]:
    problem = tmux_problem()
    if problem is not None:
        _unavailable(problem)
    made = Screen("tasks")
    try:
        yield made
    finally:
        made.close()


def _started(f: Fleet, n: int, count: int = 1) -> list[dict[str, Any]]:
    started = [e for e in f.audit() if e["event"] == "chunk-start" and e["n"] == n]
    return started if len(started) >= count else []


async def test_tasks_in_the_interactive_mode(claude: Path, tmp_path: Path, screen: Screen) -> None:
    with fleet(tmp_path) as f:
        upstreams = {label: f.servers[label].url for label in "AB"}
        async with running_model_api() as api, running_proxy(list(upstreams.values())) as proxy:
            env, args = claude_setup(tmp_path, api, proxy.url)
            screen.start(tmp_path, env, [str(claude), *args, "--allowedTools", "mcp__trips__reindex"])
            await until("Claude Code's prompt", lambda: "shift+tab to cycle" in screen.text(), screen)
            await until("the MCP server's tools listed", lambda: proxy.calls("tools/list"), screen)

            # Created and polled: the task panel shows what the flow reports, while it works.
            await screen.type("CALL reindex {}")
            (first,) = await until("chunk 1 to start", lambda: _started(f, 1), screen)
            f.open_gate(1)
            await until("chunk 2 to start", lambda: _started(f, 2), screen)
            await until("the task hint", lambda: "to manage" in screen.text(), screen)
            await open_panel(screen)
            panel = await until(
                "the panel's status", lambda: re.search(r"Status:\s+working · chunk 2 of 3", screen.text()), screen
            )
            assert panel is not None
            task_id = await until("the server task id", lambda: _server_task(screen.text()), screen)
            screen.keys("Enter")  # close the panel

            # SIGKILL the instance running it, mid-step: the balancer takes it out, the other one resumes it.
            running = first["instance"]
            other = "B" if running == "A" else "A"
            f.servers[running].process.kill()
            proxy.upstreams.remove(upstreams[running])
            resumed = await until("the other instance to resume chunk 2", lambda: [
                e for e in _started(f, 2, 2) if e["instance"] == other
            ], screen)  # fmt: skip
            assert resumed
            f.open_gate(2)
            f.open_gate(3)

            # Its question, answered in Claude Code's form: toggle, go to Accept, submit.
            await until("the task's question", lambda: "Publish the new index?" in screen.text(), screen)
            await press(screen, "Space", "the box ticked", lambda: "☒" in screen.text())
            focused = re.compile(FOCUSED + r"\s+Accept")
            await press(screen, "Enter", "Accept focused", lambda: focused.search(screen.text()))  # field -> buttons
            await press(screen, "Enter", "the form submitted", lambda: "requests your input" not in screen.text())
            await until("the task to complete", lambda: "(trips/reindex) completed" in screen.text(), screen)
            assert f.status_of(task_id) == "completed"
            created = [c for c in proxy.calls("tools/call") if c.params.get("name") == "reindex"]
            declared = created[0].params["_meta"]["io.modelcontextprotocol/clientCapabilities"]
            assert "io.modelcontextprotocol/tasks" in declared.get("extensions", {}), declared
            polls = [c for c in proxy.calls("tasks/get") if c.params.get("taskId") == task_id]
            assert len(polls) >= 2 and {c.upstream for c in polls} == set(upstreams.values()), "polled, on both"
            await until("the result to reach the model", lambda: "index published" in json.dumps(api.requests), screen)
            ends = [e["n"] for e in f.audit() if e["event"] == "chunk-end"]
            assert ends == [1, 2, 3], f"each chunk finished once: {f.audit()}"

            # A second task, stopped from the panel while it works: cancelled on the server.
            f.close_gates()
            await screen.type("CALL reindex {}")
            await until("the second task's chunk 1", lambda: _started(f, 1, 2), screen)
            await until("the task hint", lambda: "to manage" in screen.text(), screen)
            await open_panel(screen)
            await until("the panel", lambda: re.search(r"Status:\s+working · chunk 1 of 3", screen.text()), screen)
            second = _server_task(screen.text())
            assert second is not None and second != task_id
            screen.keys("x")
            await until("the task cancelled on the server", lambda: f.status_of(second) == "cancelled", screen)


async def open_panel(screen: Screen) -> None:
    """The task panel: Down to the tasks line under the prompt, Enter to view the task."""
    await press(screen, "Down", "the tasks line selected", lambda: "enter to view tasks" in screen.text())
    await press(screen, "Enter", "the task panel", lambda: "Server task:" in screen.text())


async def press(screen: Screen, key: str, what: str, done: Callable[[], Any]) -> None:
    """Press `key` until `done()`: a key that lands while a form is still redrawing is dropped by
    Claude Code (seen about one run in three), so it is pressed again after a second."""
    for _ in range(5):
        screen.keys(key)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if done():
                return
            await asyncio.sleep(0.1)
    pytest.fail(f"{what}: not after five presses of {key}\n--- screen ---\n{screen.text()}")


def _server_task(text: str) -> str | None:
    found = re.findall(r"Server task:\s+(\S+)", text)
    return found[-1] if found else None
