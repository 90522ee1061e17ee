"""Fork from a step in the console, in headless Chromium (#38): the steps before it are not run again.

A real task runtime over a SQLite file runs a three-step task to the end; the console, served by
uvicorn over the same file, shows what ran with a "Fork from here" button beside each step. A
person clicks the one beside step 2: steps 2 and 3 run again (counted where they really run),
step 1 does not, and the page's history shows the fork and who made it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx2
import pytest
from mcp import Client

import mrtr
from mrtr.client import TasksClient
from mrtr.console import app as console_app
from mrtr.stores import RecordSeal
from mrtr.stores._sqlite import SQLiteStore
from tests.fleet.test_console import CHROMIUM, CHROMIUM_ARGS, _never, browser_ready, serving, wait_status
from tests.support.flowkit import SHARED_KEY, new_server, task_state

pytestmark = [pytest.mark.anyio]

__all__ = ["browser_ready"]  # the fixture, imported for the test below


def three_steps(path: Path, runs: Counter[str]) -> mrtr.Flows:
    flows = mrtr.Flows(
        new_server("console-fork"), store=SQLiteStore(str(path)), task_poll_interval=0.05, task_scan_interval=0.2
    )

    def step(name: str) -> str:
        runs[name] += 1
        return f"{name}#{runs[name]}"

    @flows.tool(task="required")
    async def pipeline(ctx: mrtr.FlowContext) -> str:
        first = await ctx.step("extract", step, "extract")
        second = await ctx.step("transform", step, "transform")
        third = await ctx.step("load", step, "load")
        return f"{first} {second} {third}"

    return flows


@pytest.mark.spawns  # a browser
@pytest.mark.needs_chromium
async def test_fork_from_step_two_in_the_browser_reruns_two_and_three(tmp_path: Path, browser_ready: None) -> None:
    from playwright.async_api import async_playwright

    path, runs = tmp_path / "tasks.db", Counter[str]()
    flows = three_steps(path, runs)
    async with Client(flows.server, extensions=[TasksClient(_never)]) as mcp_client:
        created = await mcp_client.session.call_tool("pipeline", {}, allow_claimed=True)
        task_id = str(created.task_id)
        done = await wait_status(mcp_client.session, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "extract#1 transform#1 load#1"
        assert runs == Counter(extract=1, transform=1, load=1)
        async with (
            serving(console_app(f"sqlite:///{path}", seal=RecordSeal.from_keys([SHARED_KEY]))) as url,
            async_playwright() as pw,
        ):
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/tasks/{task_id}")
            buttons = page.get_by_role("button", name="Fork from step transform")
            assert await buttons.count() == 1
            assert await page.get_by_role("button", name="Fork from step extract").count() == 1
            async with page.expect_navigation():
                await buttons.click()
            notice = page.locator("p[role=status]")
            await notice.wait_for(timeout=5000)
            assert "forked from step 'transform': attempt 2 queued" in await notice.inner_text(), page.url
            async with asyncio.timeout(10):
                while True:
                    state = await task_state(mcp_client.session, task_id)
                    if state["status"] == "completed" and "result" in state:
                        break
                    await asyncio.sleep(0.05)
            assert state["result"]["content"][0]["text"] == "extract#1 transform#2 load#2"
            assert runs == Counter(extract=1, transform=2, load=2), "steps 2 and 3 ran again, step 1 did not"

            await page.goto(f"{url}/tasks/{task_id}")
            history = await page.locator("main").inner_text()
            fork_rows = [line for line in history.splitlines() if line.startswith(("20", "19")) and "fork" in line]
            assert any("transform" in line and "forked by the console" in line for line in fork_rows), history
            assert "attempt 2" in history

            # A step name the task does not have is refused with a notice, not a 500.
            page_html = await page.content()
            csrf = page_html.split('name="csrf" value="')[1].split('"')[0]
            async with httpx2.AsyncClient() as http:
                refused = await http.post(f"{url}/tasks/{task_id}/fork", data={"csrf": csrf, "step": "nope"})
            assert refused.status_code == 303 and "no+step+%27nope%27" in refused.headers["location"]
            await browser.close()
