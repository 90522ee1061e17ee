"""Operating from the console, in headless Chromium (#38): the audit trail of an approval, bulk
actions on a filter, and admin writes from the command line reaching an open console live.

The fleet (`Fleet`: a real task runtime over a SQLite file) and the browser setup are those of
tests/fleet/test_console.py; the console is served by uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import httpx2
import pytest

from mrtr.client import update_task
from mrtr.console import app as console_app
from mrtr.stores import RecordSeal
from mrtr.stores._sqlite import SQLiteStore
from tests.fleet.test_console import CHROMIUM, CHROMIUM_ARGS, Fleet, serving, start, task_state, wait_status
from tests.support.flowkit import ROOT_DIR, SHARED_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.spawns, pytest.mark.needs_chromium]
RING = RecordSeal.from_keys([SHARED_KEY])
"""The fleet's records are sealed at rest (`new_server`'s key): the console opens them with it."""


@pytest.fixture
def browser_ready() -> None:
    from tests.fleet.test_console import browser_problem

    problem = browser_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must run the console's browser tests")
        pytest.skip(problem)


async def test_a_finished_approval_shows_its_question_and_answer(tmp_path: Path, browser_ready: None) -> None:
    from playwright.async_api import async_playwright

    fleet = Fleet(tmp_path / "tasks.db")
    async with fleet.client() as client:
        task_id = await start(client, "review")
        await wait_status(client.session, task_id, "input_required")
        await update_task(client.session, task_id, {"approval": {"action": "accept", "content": {"ok": True}}})
        await wait_status(client.session, task_id, "completed")
        async with serving(console_app(SQLiteStore(str(fleet.path)), seal=RING)) as url, async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/tasks/{task_id}")
            ask = await page.locator("#asks tr[data-ask='approval']").inner_text()
            assert "Approve the release?" in ask, ask  # the question: what was approved
            assert '"ok": true' in ask and '"accept"' in ask, ask  # the answer
            assert "Z" in ask and "anyone (no auth)" in ask, ask  # when, and who may answer (no auth here)
            assert "Approve" in ask, "the form's title"
            body = await page.locator("main").inner_text()
            assert "outstanding" not in body, "a finished task waits for nothing"
            # Long JSON is wrapped: the page never gets wider than the window.
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, width
            await browser.close()


async def test_a_bulk_cancel_on_a_filter_cancels_exactly_the_filtered_tasks(
    tmp_path: Path, browser_ready: None
) -> None:
    from playwright.async_api import async_playwright

    fleet = Fleet(tmp_path / "tasks.db")
    async with fleet.client() as client:
        waiters = [await start(client, "waiter") for _ in range(3)]
        reviews = [await start(client, "review") for _ in range(2)]
        for task_id in reviews:
            await wait_status(client.session, task_id, "input_required")
        async with asyncio.timeout(10):  # the waiters park on their event

            async def parked(task_id: str) -> bool:
                return bool((await task_state(client.session, task_id)).get("_meta", {}).get("mrtr/waiting"))

            while not all([await parked(t) for t in waiters]):
                await asyncio.sleep(0.05)
        async with serving(console_app(SQLiteStore(str(fleet.path)), seal=RING)) as url, async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(url + "/")
            await page.select_option("select[name=waiting]", "event")
            await page.fill("input[name=older]", "0s")
            async with page.expect_navigation():
                await page.click("text=Show")
            assert await page.locator("#rows tr").count() == 3
            async with page.expect_navigation():
                await page.click("text=Cancel matching…")
            confirm = await page.locator("main").inner_text()
            assert "Cancel 3 task(s)?" in confirm, confirm
            assert all(t in confirm for t in waiters) and not any(t in confirm for t in reviews)
            for task_id in waiters:  # nothing happens before the confirmation
                assert (await task_state(client.session, task_id))["status"] == "working"
            async with page.expect_navigation():
                await page.click("#confirm")
            done = await page.locator("main").inner_text()
            assert "Cancel: 3 of 3 task(s) done" in done, done
            assert await page.locator("#outcomes tr[data-task] >> text=cancelled").count() == 3
            for task_id in waiters:
                assert (await task_state(client.session, task_id))["status"] == "cancelled"
            for task_id in reviews:
                assert (await task_state(client.session, task_id))["status"] == "input_required", "not in the filter"
            await browser.close()


@pytest.mark.needs_redis
async def test_a_cli_cancel_shows_up_live_in_an_open_console(tmp_path: Path, browser_ready: None) -> None:
    from playwright.async_api import async_playwright

    from tests.support.storekit import service_problem

    problem = await service_problem("redis")
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"redis is required under CI: {problem}")
        pytest.skip(f"redis not reachable: {problem}")
    bus = "redis://127.0.0.1:6379/0"
    namespace = f"mrtr_ops_{os.urandom(4).hex()}"
    fleet = Fleet(tmp_path / "tasks.db")
    async with fleet.client() as client:
        task_id = await start(client, "waiter")
        await asyncio.sleep(0.3)
        web = console_app(SQLiteStore(str(fleet.path)), bus=bus, namespace=namespace, seal=RING)
        async with serving(web) as url, async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(url + "/")
            row = page.locator(f"tr[data-task='{task_id}']")
            assert "working" in await row.inner_text()
            # Beside the page, the console's own event stream: what it hears on the bus.
            heard: asyncio.Queue[str] = asyncio.Queue()

            async def listen() -> None:
                async with httpx2.AsyncClient(timeout=30) as http, http.stream("GET", url + "/events") as events:
                    async for line in events.aiter_lines():
                        if line.startswith("data:"):
                            heard.put_nowait(line)

            listener = asyncio.get_running_loop().create_task(listen())
            await asyncio.sleep(1.0)  # the stream (and the page's) subscribe
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "mrtr.cli",
                "tasks",
                "cancel",
                task_id,
                "--store",
                f"sqlite:///{fleet.path}",
                "--namespace",
                namespace,
                "--bus",
                bus,
                cwd=ROOT_DIR,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate()
            done = time.monotonic()
            assert proc.returncode == 0, (out, err)
            assert b"cancelled" in out
            try:
                line = await asyncio.wait_for(heard.get(), 5)
                assert task_id in line, "the console heard the CLI's change on the fleet bus"
            finally:
                listener.cancel()
            await row.locator("text=cancelled").wait_for(timeout=6000)
            print(f"CLI cancel -> shown in the open console {time.monotonic() - done:.2f} s after the CLI exited")
            await browser.close()
