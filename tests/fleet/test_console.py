"""The web console (`mrtr.console`, `mrtr console`) in headless Chromium, on a store filled by real task runs.

One in-process fleet instance (a real task runtime over a SQLite file) runs tasks into every
status; the console is served by uvicorn on 127.0.0.1 over the same file, and Chromium (Debian's,
driven by Playwright) uses it as a person would. Security is checked with plain HTTP: a
non-loopback bind needs the token, and a cross-site POST changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr.client import TasksClient, update_task
from mrtr.console import app as console_app
from mrtr.stores import RecordSeal, SealedStore, TaskRecord
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import ROOT_DIR, SHARED_KEY, new_server, task_state

pytestmark = [pytest.mark.anyio, pytest.mark.in_process]  # unless marked otherwise

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS_ENV = "MRTR_UPDATE_SCREENSHOTS"
"""Set to 1 to write the README's screenshots (docs/img/console-*.png) from this test's pages."""


def install_chromium() -> str | None:
    """Install Debian's chromium when missing and running as root (as the chaos tests do HAProxy)."""
    hint = "install it first: `sudo apt-get update && sudo apt-get install -y chromium`"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"Debian's chromium is not installed and this is not root with apt-get; {hint}"
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=120"]
    for argv in (["apt-get", *lock, "update"], ["apt-get", *lock, "install", "-y", "chromium"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr[-600:]}; {hint}"
    return None if Path(CHROMIUM).exists() else f"apt-get installed chromium but {CHROMIUM} is missing; {hint}"


def browser_problem() -> str | None:
    if not Path(CHROMIUM).exists():
        problem = install_chromium()
        if problem is not None:
            return problem
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    return None


@pytest.fixture
def browser_ready() -> None:
    problem = browser_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must run the console's browser tests")
        pytest.skip(problem)


class Approve(BaseModel):
    ok: bool


class Fleet:
    """One instance of a task fleet (real runtime, SQLite file) and what its flows did."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.marker = path.parent / "target-down"
        self.runs: Counter[str] = Counter()
        self.server = new_server("console-fleet")
        self.flows = flows = mrtr.Flows(
            self.server, store=SQLiteStore(str(path)), task_poll_interval=0.05, task_scan_interval=0.2
        )
        runs, marker = self.runs, self.marker

        def prepare() -> str:
            runs["prepare"] += 1
            return "prepared"

        def deploy() -> str:
            runs["deploy"] += 1
            if marker.exists():
                raise RuntimeError("the target is down")
            return "deployed"

        @flows.tool(task="required")
        async def chore(ctx: mrtr.FlowContext) -> str:
            return await ctx.step("prepare", prepare)

        @flows.tool(task="required")
        async def release(ctx: mrtr.FlowContext) -> str:
            await ctx.step("prepare", prepare)
            return await ctx.step("deploy", deploy)

        @flows.tool(task="required")
        async def broken(ctx: mrtr.FlowContext) -> str:
            raise MCPError(code=-32050, message="backend refused")

        @flows.tool(task="required")
        async def review(ctx: mrtr.FlowContext) -> str:
            await ctx.step("prepare", prepare)
            answer = await ctx.elicit("Approve the release?", Approve, key="approval")
            return f"approved={answer.ok}"

        @flows.tool(task="required")
        async def waiter(ctx: mrtr.FlowContext) -> str:
            payload = await ctx.wait_for_event("go")
            return f"went {payload}"

    def client(self) -> Client:
        return Client(self.server, extensions=[TasksClient(_never)], elicitation_callback=_never)


async def _never(*args: Any) -> Any:
    raise AssertionError("these tests answer through tasks/update")


async def wait_status(session: Any, task_id: str, status: str, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.get_running_loop().create_task(runner.serve(sockets=[sock]))
    try:
        while not runner.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        runner.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def start(client: Client, tool: str) -> str:
    created = await client.session.call_tool(tool, {}, allow_claimed=True)
    return str(created.task_id)


@pytest.mark.spawns
@pytest.mark.needs_chromium
async def test_the_console_in_a_browser(tmp_path: Path, browser_ready: None) -> None:
    from playwright.async_api import async_playwright

    shots = ROOT_DIR / "docs" / "img" if os.environ.get(SCREENSHOTS_ENV) == "1" else tmp_path

    fleet = Fleet(tmp_path / "tasks.db")
    fleet.marker.touch()
    async with fleet.client() as client:
        ids = {tool: await start(client, tool) for tool in ("chore", "release", "broken", "review", "waiter")}
        ids["waiter2"] = await start(client, "waiter")
        ids["answered"] = await start(client, "review")
        asked = await wait_status(client.session, ids["answered"], "input_required")
        await update_task(client.session, ids["answered"], {"approval": {"action": "accept", "content": {"ok": True}}})
        await wait_status(client.session, ids["answered"], "completed")
        ids["cancelled"] = await start(client, "waiter")
        await asyncio.sleep(0.3)
        await mrtr.client.cancel_task(client.session, ids["cancelled"])
        await wait_status(client.session, ids["broken"], "failed")
        await wait_status(client.session, ids["review"], "input_required")
        assert asked["inputRequests"]
        async with (
            serving(console_app(str(f"sqlite:///{fleet.path}"), seal=RecordSeal.from_keys([SHARED_KEY]))) as url,
            async_playwright() as pw,
        ):
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(url + "/")
            rows = page.locator("#rows tr")
            text = await page.locator("#rows").inner_text()
            for status in ("working", "input_required", "completed", "failed", "cancelled"):
                assert status in text, f"{status} missing from the tasks page"
            assert await rows.count() == 8
            assert "answer: approval" in text and "event 'go'" in text, "what each task waits for"
            shots.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(shots / "console-tasks.png"), full_page=True)

            # Filter by status, then by tool, then search by id (keyboard and form only).
            await page.select_option("select[name=status]", "failed")
            async with page.expect_navigation():
                await page.click("text=Show")
            assert await rows.count() == 1 and ids["broken"] in await page.locator("#rows").inner_text()
            await page.select_option("select[name=status]", "")
            await page.select_option("select[name=tool]", "waiter")
            async with page.expect_navigation():
                await page.click("text=Show")
            assert await rows.count() == 3
            await page.select_option("select[name=tool]", "")
            await page.fill("input[name=q]", ids["release"][:8])
            async with page.expect_navigation():
                await page.keyboard.press("Enter")
            assert await rows.count() == 1 and ids["release"] in await page.locator("#rows").inner_text()

            # A task page: its asks, answers and steps.
            await page.goto(f"{url}/tasks/{ids['answered']}")
            body = await page.locator("main").inner_text()
            assert "approval" in body and '"ok": true' in body and "prepare" in body, body
            await page.goto(f"{url}/tasks/{ids['review']}")
            body = await page.locator("main").inner_text()
            assert "Approve the release?" in body and "prepare" in body

            # Cancel from the browser: tasks/get over the wire says so.
            await page.goto(f"{url}/tasks/{ids['waiter']}")
            async with page.expect_navigation():
                await page.click("text=Cancel task")
            assert (await task_state(client.session, ids["waiter"]))["status"] == "cancelled"

            # A task completing elsewhere shows up without a reload.
            await page.goto(url + "/")
            row = page.locator(f"tr[data-task='{ids['waiter2']}']")
            assert "working" in await row.inner_text()
            sent = time.monotonic()
            await fleet.flows.send_event(ids["waiter2"], "go", "now")
            await row.locator("text=completed").wait_for(timeout=2000)
            print(f"completed elsewhere -> shown in {time.monotonic() - sent:.2f} s, no reload")

            # Re-run the failed task from its journal: its finished step is not run again.
            assert fleet.runs == Counter(prepare=4, deploy=1)
            fleet.marker.unlink()
            await page.goto(f"{url}/tasks/{ids['release']}")
            async with page.expect_navigation():
                await page.click("text=Re-run from journal")
            assert "attempt 2 queued" in await page.locator("main").inner_text()
            done = await wait_status(client.session, ids["release"], "completed")
            while done["result"].get("isError"):
                done = await wait_status(client.session, ids["release"], "completed")
            assert done["result"]["content"][0]["text"] == "deployed"
            assert fleet.runs == Counter(prepare=4, deploy=2), "prepare ran once for this task; deploy again"
            # Its page shows what ran: the step that raised (and why), the re-run, the step that then finished.
            await page.goto(f"{url}/tasks/{ids['release']}")
            ran = await page.locator("main").inner_text()
            assert "raised RuntimeError: the target is down" in ran and "rerun" in ran, ran
            rows = [line for line in ran.splitlines() if "deploy" in line]
            assert any("finished" in line and "\t2\t" in line for line in rows), rows
            await page.screenshot(path=str(shots / "console-task.png"), full_page=True)
            assert all((shots / name).stat().st_size > 10_000 for name in ("console-tasks.png", "console-task.png"))
            await browser.close()


async def test_cross_site_posts_change_nothing(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "tasks.db")
    async with fleet.client() as client:
        task_id = await start(client, "waiter")
        await asyncio.sleep(0.3)
        async with serving(console_app(SQLiteStore(str(fleet.path)))) as url, httpx2.AsyncClient() as http:
            page = (await http.get(f"{url}/tasks/{task_id}")).text
            csrf = page.split('name="csrf" value="')[1].split('"')[0]
            cancel = f"{url}/tasks/{task_id}/cancel"
            evil = await http.post(cancel, data={"csrf": csrf}, headers={"Origin": "http://evil.example"})
            assert evil.status_code == 403
            fetched = await http.post(cancel, data={"csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"})
            assert fetched.status_code == 403
            forged = await http.post(cancel, data={"csrf": "guess"})
            assert forged.status_code == 403
            assert (await task_state(client.session, task_id))["status"] == "working", "nothing changed"
            ours = await http.post(cancel, data={"csrf": csrf}, headers={"Origin": url})
            assert ours.status_code == 303
            assert (await task_state(client.session, task_id))["status"] == "cancelled"


async def test_a_sealed_task_shows_with_the_key_and_shows_sealed_without_it(tmp_path: Path) -> None:
    """Records sealed at rest (#36): the console opens them with the fleet's ring, never shows ciphertext."""
    path, key = tmp_path / "tasks.db", os.urandom(32)
    now = time.time()
    secret = f"ARG{os.urandom(4).hex()}"
    answer = f"RESULT{os.urandom(4).hex()}"
    writer = SealedStore(SQLiteStore(str(path)), RecordSeal.from_keys([key]))
    await writer.create(
        TaskRecord(
            task_id="sealed-task",
            flow="book",
            arguments={"city": secret},
            capabilities={},
            status="input_required",
            created_at=now,
            updated_at=now,
            ttl_ms=None,
            poll_interval_ms=500,
            journal="",
            input_requests={"hotel": {"method": "elicitation/create", "params": {"message": f"Hotel? {answer}"}}},
        )
    )
    await writer.close()
    async with httpx2.AsyncClient() as http:
        async with serving(console_app(SQLiteStore(str(path)), seal=RecordSeal.from_keys([key]))) as url:
            listed, page = (await http.get(f"{url}/")).text, (await http.get(f"{url}/tasks/sealed-task")).text
            assert "answer: hotel" in listed and secret in page and answer in page
        async with serving(console_app(SQLiteStore(str(path)))) as url:
            listed, page = (await http.get(f"{url}/")).text, (await http.get(f"{url}/tasks/sealed-task")).text
            assert "answer: sealed" in listed and "sealed at rest" in page and "book" in page
            assert secret not in page + listed and answer not in page + listed and "v1." not in page + listed
            csrf = page.split('name="csrf" value="')[1].split('"')[0]
            sent = await http.post(f"{url}/tasks/sealed-task/event", data={"csrf": csrf, "name": "paid"})
            assert sent.status_code == 303 and "sealed+at+rest" in sent.headers["location"], "refused, not crashed"
            cancelled = await http.post(f"{url}/tasks/sealed-task/cancel", data={"csrf": csrf}, headers={"Origin": url})
            assert cancelled.status_code == 303 and "cancelled" in cancelled.headers["location"], "no key needed"
    reader = SealedStore(SQLiteStore(str(path)), RecordSeal.from_keys([key]))
    kept = await reader.load("sealed-task", time.time())
    await reader.close()
    assert kept is not None and kept.status == "cancelled" and kept.arguments == {"city": secret}, "payload intact"


@pytest.mark.spawns
def test_a_non_loopback_bind_needs_the_token(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    mrtr_cli = [sys.executable, "-m", "mrtr.cli", "console", "--store", store, "--host", "127.0.0.2"]
    refused = subprocess.run([*mrtr_cli, "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give --token" in refused.stderr
    port = free_port()
    proc = subprocess.Popen([*mrtr_cli, "--port", str(port), "--token", "s3cret"], stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.2:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                anonymous = httpx2.get(base + "/fragment", timeout=2)
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "the console did not start"
                time.sleep(0.1)
        assert anonymous.status_code == 401
        page = httpx2.get(base + "/", headers={"Accept": "text/html"}, follow_redirects=False, timeout=5)
        assert page.status_code == 303 and page.headers["location"].endswith("/login")
        assert httpx2.get(base + "/fragment", headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
        assert httpx2.get(base + "/fragment", headers={"Authorization": "Bearer s3cret"}, timeout=5).status_code == 200
        with httpx2.Client(base_url=base, timeout=5) as browser_like:
            bad = browser_like.post("/login", data={"token": "nope"})
            assert bad.status_code == 401
            logged_in = browser_like.post("/login", data={"token": "s3cret"}, follow_redirects=True)
            assert logged_in.status_code == 200 and "Tasks" in logged_in.text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.needs_redis
async def test_live_updates_ride_the_fleet_bus(tmp_path: Path) -> None:
    """With a bus the console streams each task change heard on it (server-sent events) to its pages."""
    from tests.support.storekit import service_problem

    problem = await service_problem("redis")
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"redis is required under CI: {problem}")
        pytest.skip(f"redis not reachable: {problem}")
    from mrtr.buses import open_bus
    from mrtr.buses._events import TaskChanged

    namespace = f"mrtr_console_{os.urandom(4).hex()}"
    web = console_app(SQLiteStore(str(tmp_path / "tasks.db")), bus="redis://127.0.0.1:6379/0", namespace=namespace)
    fleet_bus = open_bus("redis://127.0.0.1:6379/0", namespace=namespace)
    await fleet_bus.start()
    try:
        async with serving(web) as url, httpx2.AsyncClient(timeout=10) as http:
            page = await http.get(url + "/")
            assert "new EventSource" in page.text, "a console with a bus listens instead of polling"
            async with http.stream("GET", url + "/events") as events:
                lines = events.aiter_lines()
                assert (await anext(lines)).startswith("retry:")
                for attempt in range(50):  # the console's subscription goes live asynchronously
                    await fleet_bus.publish(TaskChanged(task_id=f"t-{attempt}", task={"taskId": f"t-{attempt}"}))
                    try:
                        line = await asyncio.wait_for(anext(lines), 0.2)
                    except TimeoutError:
                        continue
                    while not line.startswith("data:"):
                        line = await asyncio.wait_for(anext(lines), 2)
                    assert line.startswith('data: "t-')
                    break
                else:
                    raise AssertionError("no task change reached the console's event stream")
    finally:
        await fleet_bus.close()
