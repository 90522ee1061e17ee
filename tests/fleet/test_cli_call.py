"""`mrtr call` end to end: a person at a real pseudo-terminal, scripts, and bad input.

The interactive test runs the real `mrtr` process under `pexpect` against a real uvicorn
server (tests/support/cli_server.py), types answers like a person (including wrong ones, to
see them re-asked), and asserts what the screen showed: each round with its keys and state
size, the form, the sampling prompt, the durable task's status line and the result. The
other tests run `mrtr` as scripts do (no terminal) and check exit codes and one-line errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from mrtr._engine import journal as journal_codec
from mrtr.stores import RecordSeal, SealedStore, SQLiteStore
from tests.support.servers import ROOT, SERVER_SCRIPT, ServerSpec, http_servers, new_key, spawn_servers

pytestmark = pytest.mark.spawns

CLI_SERVER = ROOT / "tests" / "support" / "cli_server.py"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\r")
RUN_TIMEOUT = 60


def mrtr_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mrtr.cli", *args]


def screen_text(raw: str) -> str:
    """What a person saw, without colour codes and carriage returns."""
    return ANSI.sub("", raw)


def run_mrtr(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mrtr_argv(*args),
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=ROOT,
        env=os.environ | {"COLUMNS": "120"} | (env or {}),
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mrtr:")]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


CLI_KEY = new_key()
"""The module's server's key ring: it seals the task records it writes."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    workdir = tmp_path_factory.mktemp("cli-server")
    db = workdir / "tasks.db"
    env = {"MRTR_STATE_KEY": CLI_KEY, "MRTR_STORE": f"sqlite:///{db}"}
    spec = ServerSpec("cli", env, script=CLI_SERVER, ready_prefix="cli-server ready:")
    with spawn_servers([spec], workdir) as servers:
        yield servers["cli"].url, db


def spawn_terminal(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "mrtr.cli", *args],
        cwd=str(ROOT),
        env=os.environ | {"TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"},
        encoding="utf-8",
        timeout=20,
        dimensions=(40, 120),
    )
    return child


_WAITING_SYSCALLS = {"0", "7", "23", "270", "271"}
"""read, poll, select, pselect6, ppoll (x86-64 numbers): where a prompt waits for a key."""


def wait_until_blocked_reading(pid: int, timeout: float = 10.0) -> None:
    """Return once process `pid`'s main thread sits in a blocking read or poll (Linux's
    /proc/PID/syscall); elsewhere, or if it never shows, after half a second at least."""
    started = time.monotonic()
    syscall = Path(f"/proc/{pid}/syscall")
    while time.monotonic() - started < timeout:
        try:
            number = syscall.read_text().split(maxsplit=1)[0]
        except (OSError, IndexError):
            break
        if number in _WAITING_SYSCALLS:
            time.sleep(0.05)  # past the syscall's entry: the signal now interrupts it
            return
        time.sleep(0.02)
    time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))


def type_line(child: pexpect.spawn, prompt: str, text: str) -> None:
    child.expect(prompt)
    child.sendline(text)


def test_a_person_answers_a_form_a_sampling_request_and_a_task_in_a_terminal(server: tuple[str, Path]) -> None:
    url, db = server
    child = spawn_terminal("call", url, "onboard", "--arg", "greeting=Hi there")
    try:
        type_line(child, r"name \(string, min 2 chars\): ", "A")  # too short: asked again
        type_line(child, r"name \(string, min 2 chars\): ", "Ada Lovelace")
        type_line(child, r"age \(integer, ≥ 18, ≤ 130\): ", "twelve")  # not a number
        type_line(child, r"age \(integer, ≥ 18, ≤ 130\): ", "12")  # below the minimum
        type_line(child, r"age \(integer, ≥ 18, ≤ 130\): ", "36")
        type_line(child, r"team \(number or value\): ", "2")  # data
        type_line(child, r"newsletter \(y/n\) \[y\]: ", "")  # keep the default
        type_line(child, r"completion \(:cancel gives up\): ", "Glad to have you, Ada!")
        type_line(child, r"send \(y/n\): ", "y")  # asked by the durable task
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    # The whole screen, as the terminal received it.
    seen = screen_text(getattr(child, "_mrtr_log", ""))
    for expected in (
        'round 1 · asks: "Who is joining?" (profile) · state ',  # the question, then its key
        "form profile  Who is joining?",
        "'A' is too short",
        "a whole number, please",
        "12 is less than the minimum of 18",
        "1) infra  2) data  3) web",
        'round 2 · asks: "sampling" (welcome) · state ',
        "sampling welcome  the server asks your LLM",
        "Write a one-line welcome for Ada Lovelace of team data",
        "durable task ",
        "task input_required asks: send",
        "Send 'Hi there, Glad to have you, Ada!' to acct-data-ada-lovelace?",
        "task completed",
        "acct-data-ada-lovelace (age 36, with newsletter): welcome sent: Hi there, Glad to have you, Ada!",
    ):
        assert expected in seen, f"{expected!r} not on screen:\n{seen}"
    assert seen.index("round 2") < seen.index("durable task") < seen.index("task completed")

    # The server really kept what the person typed: the task's journal in the store, sealed at rest
    # (the raw row holds none of it), opened with the server's key.
    rows = [json.loads(r[0]) for r in sqlite3.connect(db).execute("SELECT data FROM mrtr_tasks").fetchall()]
    (task,) = [r for r in rows if r["status"] == "completed"]
    assert "Ada Lovelace" not in json.dumps(task), "the answer lies sealed in the store"
    opened = SealedStore(SQLiteStore(str(db)), RecordSeal.from_keys([bytes.fromhex(CLI_KEY)]))
    record = asyncio.run(opened.load(task["task_id"], time.time()))
    assert record is not None
    journal = journal_codec.decode(record.journal)
    typed = {"name": "Ada Lovelace", "age": 36, "team": "data", "newsletter": True}
    assert journal.answers["profile"][1]["content"] == typed
    assert "create_account" in journal.steps


@pytest.fixture(autouse=True)
def _log_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every byte a spawned terminal printed (pexpect's `before` holds only the last stretch)."""
    original = pexpect.spawn.read_nonblocking

    def recording(self: pexpect.spawn, size: int = 1, timeout: float | None = -1) -> str:
        data = original(self, size, timeout)
        self._mrtr_log = getattr(self, "_mrtr_log", "") + data  # type: ignore[attr-defined]
        return data

    monkeypatch.setattr(pexpect.spawn, "read_nonblocking", recording)


def test_declining_a_form_ends_the_call_as_the_flow_decides(server: tuple[str, Path]) -> None:
    url, _ = server
    child = spawn_terminal("call", url, "onboard")
    try:
        type_line(child, r"name \(string, min 2 chars\): ", ":decline")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close()
    seen = screen_text(getattr(child, "_mrtr_log", ""))
    assert "→ decline" in seen
    assert "tool error" in seen  # the flow did not catch mrtr.Declined: the call is a tool error
    assert child.exitstatus == 1


def test_an_answers_file_runs_the_same_flow_without_a_person(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    answers = tmp_path / "answers.yml"
    answers.write_text(
        "profile: {name: Grace Hopper, age: 85, team: infra, newsletter: false}\n"
        "'Write a one-line welcome for *': Welcome aboard, Grace.\n"  # by question, as a pattern
        "send: {action: accept, content: {send: false}}\n"
    )
    proc = run_mrtr("call", url, "onboard", "--answers", str(answers), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    text = result["content"][0]["text"]
    assert text == "acct-infra-grace-hopper (age 85, no newsletter): welcome kept: Welcome, Welcome aboard, Grace."
    # every answer named alike: its question, then its key
    assert 'answers file → "Who is joining?" (profile): accept' in proc.stderr
    assert 'answers file → "sampling: Write a one-line welcome for Grace Hopper' in proc.stderr
    assert 'round 1 · asks: "Who is joining?" (profile)' in proc.stderr


def test_stdio_server_with_roots_and_echo_sampling(tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps(
            {
                "target": {"environment": "staging"},
                "service_1": {"service": "api", "done": True},
                "confirm": {"approve": True},
                "In one sentence*": "a pattern for questions must not override --sampling echo",
            }
        )
    )
    proc = run_mrtr(
        "call",
        "--stdio",
        f"{sys.executable} {SERVER_SCRIPT} --stdio",
        "deploy",
        "--arg",
        "app=shop",
        "--answers",
        str(answers),
        "--sampling",
        "echo",
        "--root",
        str(tmp_path),
        "--output",
        "json",
        env={"MRTR_STATE_KEY": new_key()},
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["structuredContent"]
    assert report["status"] == "deployed" and report["services"] == ["api"]
    assert report["workspace"] == tmp_path.resolve().as_uri()
    assert report["risk"].startswith("In one sentence: the main risk of deploying api of shop")  # echoed


def test_unknown_tool_is_a_one_line_usage_error(server: tuple[str, Path]) -> None:
    proc = run_mrtr("call", server[0], "no_such_tool")
    assert_one_line_error(proc, 2, "unknown tool 'no_such_tool'; the server offers: onboard, schedule")


def test_unreachable_url_is_a_one_line_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    proc = run_mrtr("call", f"http://127.0.0.1:{port}/mcp", "onboard")
    assert_one_line_error(proc, 3, "cannot reach the server")


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("broken.json", "{not json", "is not valid JSON/YAML"),
        ("broken.yml", "profile: [unclosed", "is not valid JSON/YAML"),
        ("list.yml", "- a\n- b\n", "must hold a mapping"),
    ],
)
def test_malformed_answers_file_is_a_one_line_usage_error(
    server: tuple[str, Path], tmp_path: Path, name: str, content: str, fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    proc = run_mrtr("call", server[0], "onboard", "--answers", str(path))
    assert_one_line_error(proc, 2, fragment)


def test_no_terminal_and_no_answer_stops_with_its_own_exit_code(server: tuple[str, Path]) -> None:
    proc = run_mrtr("call", server[0], "onboard")
    assert_one_line_error(proc, 5, "no answer for 'profile' and stdin is not a terminal")


def test_bad_arguments_are_one_line_errors(server: tuple[str, Path]) -> None:
    assert_one_line_error(run_mrtr("call", server[0], "onboard", "--arg", "novalue"), 2, "--arg takes NAME=VALUE")
    assert_one_line_error(run_mrtr("call", "ftp://x/mcp", "onboard"), 2, "URL must start with http")
    assert_one_line_error(run_mrtr("call", server[0], "onboard", "--sampling", "maybe"), 2, "--sampling must be")


@pytest.fixture(scope="module")
def legacy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same server on stateful HTTP: a 2025-11-25 client keeps its session and is asked by requests."""
    workdir = tmp_path_factory.mktemp("cli-legacy-server")
    env = {"MRTR_STATE_KEY": new_key(), "MRTR_STORE": f"sqlite:///{workdir / 'tasks.db'}", "CLI_SERVER_STATEFUL": "1"}
    spec = ServerSpec("legacy", env, script=CLI_SERVER, ready_prefix="cli-server ready:")
    with spawn_servers([spec], workdir) as servers:
        yield servers["legacy"].url


def test_legacy_asks_carry_no_wire_key_and_an_answers_file_keyed_by_one_is_abandoned(
    legacy_server: str, tmp_path: Path
) -> None:
    by_key = tmp_path / "by-key.yml"  # what the README advises for 2026-07-28 servers
    by_key.write_text(
        "profile: {name: Grace Hopper, age: 85, team: infra, newsletter: false}\n"
        "welcome: Welcome aboard, Grace.\n"
        "send: {send: true}\n"
    )
    proc = run_mrtr("call", "--legacy", legacy_server, "onboard", "--answers", str(by_key))
    assert_one_line_error(
        proc,
        5,
        "no answer for 'Who is joining?' and stdin is not a terminal: legacy 2025-11-25 servers ask without "
        "wire keys, so key the answers file by the question ('Who is joining?') or a * pattern",
    )
    assert "server error" not in proc.stderr and "handler for" not in proc.stderr

    by_question = tmp_path / "by-question.yml"  # the same answers, keyed as a legacy server can be answered
    by_question.write_text(
        "Who is joining?: {name: Grace Hopper, age: 85, team: infra, newsletter: false}\n"
        "'Write a one-line welcome for *': Welcome aboard, Grace.\n"
        "'Send *': {send: true}\n"
    )
    proc = run_mrtr("call", "--legacy", legacy_server, "onboard", "--answers", str(by_question), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    text = json.loads(proc.stdout)["content"][0]["text"]
    assert text == "acct-infra-grace-hopper (age 85, no newsletter): welcome sent: Welcome, Welcome aboard, Grace."
    assert "round " not in proc.stderr  # legacy: no rounds, the server asked by requests


def test_a_value_of_the_wrong_format_is_re_asked_alone_with_the_reason(server: tuple[str, Path]) -> None:
    child = spawn_terminal("call", server[0], "schedule")
    try:
        type_line(child, r"contact \(string, email\): ", "ada at example")
        type_line(child, r"contact \(string, email\): ", "ada@example.com")
        type_line(child, r"link \(string, min 1 chars, uri\): ", "meet.example.com/ada")  # no scheme
        type_line(child, r"link \(string, min 1 chars, uri\): ", "https://meet.example.com/ada")
        type_line(child, r"day \(string, date\): ", "2026-02-30")
        type_line(child, r"day \(string, date\): ", "2026-07-28")
        type_line(child, r"starts \(string, date-time\): ", "2026-07-28 09:30")  # no T, seconds nor offset
        type_line(child, r"starts \(string, date-time\): ", "2026-07-28T09:30:00+02:00")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close()
    seen = screen_text(getattr(child, "_mrtr_log", ""))
    assert child.exitstatus == 0, seen
    for expected in (
        "'ada at example' is not a 'email': give an address such as ada@example.com",
        "'meet.example.com/ada' is not a 'uri': give an absolute URI such as https://example.com/page",
        "'2026-02-30' is not a 'date': give a date such as 2026-07-28",
        "'2026-07-28 09:30' is not a 'date-time': give a date and time with its UTC offset, such as "
        "2026-07-28T09:30:00Z",
        "ada@example.com meets at https://meet.example.com/ada on 2026-07-28, from 2026-07-28T09:30:00+02:00",
    ):
        assert expected in seen, f"{expected!r} not on screen:\n{seen}"
    for field in ("contact", "link", "day", "starts"):  # each asked twice: itself, not the whole form again
        assert seen.count(f"  {field} (string") == 2, seen
    assert "once more" not in seen and "round 2" not in seen  # nor did the server have to re-ask


GOOD_MEETING = {
    "contact": "ada@example.com",
    "link": "https://meet.example.com/ada",
    "day": "2026-07-28",
    "starts": "2026-07-28T09:30:00Z",
}


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("contact", "ada at example", "contact: 'ada at example' is not a 'email'"),
        ("link", "not a url", "link: 'not a url' is not a 'uri': give an absolute URI"),
        ("day", "28/07/2026", "day: '28/07/2026' is not a 'date'"),
        ("starts", "2026-07-28T09:30:00", "starts: '2026-07-28T09:30:00' is not a 'date-time': give a date and"),
    ],
)
def test_a_value_of_the_wrong_format_in_an_answers_file_is_a_one_line_usage_error(
    server: tuple[str, Path], tmp_path: Path, field: str, value: str, fragment: str
) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"meeting": GOOD_MEETING | {field: value}}))
    proc = run_mrtr("call", server[0], "schedule", "--answers", str(answers))
    assert_one_line_error(proc, 2, f"answer for 'meeting' in the answers file: {fragment}")
    assert "round 2" not in proc.stderr  # refused here, not sent for the server to re-ask

    answers.write_text(json.dumps({"meeting": GOOD_MEETING}))  # the same file, right: it goes through
    proc = run_mrtr("call", server[0], "schedule", "--answers", str(answers))
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def deployer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example server, as the README shows it."""
    workdir = tmp_path_factory.mktemp("deployer")
    with http_servers([("A", new_key())], workdir) as servers:
        yield servers["A"].url


def test_url_elicitation_is_a_link_to_confirm_and_prompts_work(deployer: str) -> None:
    child = spawn_terminal("call", deployer, "--resource", "deployer://console-session")
    try:
        type_line(child, r"Done in the browser\? ", "")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close()
    seen = screen_text(getattr(child, "_mrtr_log", ""))
    assert child.exitstatus == 0, seen
    assert "link console_login  Sign in to the deploy console to continue." in seen
    assert "open: https://console.deployer.example/login?flow=" in seen
    assert '"status": "signed in"' in seen and "instance A" in seen

    child = spawn_terminal("call", deployer, "--prompt", "announcement", "--arg", "app=shop")
    try:
        type_line(child, r"audience \(number or value\): ", "customers")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close()
    seen = screen_text(getattr(child, "_mrtr_log", ""))
    assert child.exitstatus == 0, seen
    assert "1) engineers  2) customers" in seen
    assert "friendly and jargon-free announcement of the new shop release for customers" in seen


def test_ctrl_c_at_a_prompt_exits_130_without_a_traceback(server: tuple[str, Path]) -> None:
    child = spawn_terminal("call", server[0], "onboard")
    try:
        child.expect(r"name \(string, min 2 chars\): ")
        # As a person would: once the prompt waits for a key. A SIGINT that lands after the
        # prompt is written but before `input()` blocks in the kernel only sets CPython's flag,
        # and the read waits on (a second Ctrl-C would end it): in a full suite a fixed 0.5 s
        # was not always enough for the process to get there, so wait until it does.
        wait_until_blocked_reading(child.pid)
        child.sendintr()
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close()
    seen = screen_text(getattr(child, "_mrtr_log", ""))
    assert child.exitstatus == 130, seen
    assert "mrtr: interrupted" in seen and "Traceback" not in seen


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "mrtr"
    assert script.exists(), "reinstall the package (pip install -e '.[dev]') to get the mrtr script"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0 and "call" in proc.stdout and "inspect-state" in proc.stdout
