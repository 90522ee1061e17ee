"""A callback POST that loses every compare-and-set on the task's record: 503, retry later, URL kept.

`deliver` retries a lost compare-and-set (with jittered backoff) and then gives up as `busy`.
That is not the sender's fault and not final, so the callback route answers 503 with
`Retry-After` (not the 409 of a reused URL), delivers nothing, and the same URL works once the
contention is gone. The contention is real: a rival write lands on the stored record just
before each of the delivery's saves.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx2 as httpx
import pytest
from mcp import Client

import mrtr
import mrtr.tasks._inbox
from mrtr.client import TasksClient
from mrtr.stores import TaskRecord
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import new_server, task_state

pytestmark = pytest.mark.anyio


class ContendedStore(SQLiteStore):
    """While `contended`, another writer updates a task just before every save that delivers an event.

    It looks at `event_ids`, which stays clear at rest (the inbox itself is sealed)."""

    contended = False
    rival_writes = 0

    async def save(self, record: TaskRecord) -> bool:
        if self.contended and record.event_ids:
            current = await self.load(record.task_id, time.time())
            if current is not None and await super().save(current.copy(updated_at=time.time())):
                self.rival_writes += 1
        return await super().save(record)


async def _no_answers(request: Any) -> Any:
    raise AssertionError("the flow never asks")


async def test_a_busy_task_answers_503_and_keeps_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    # Four lost compare-and-sets make the same 503 as the 64 a real send tries (~5 s of backoff).
    monkeypatch.setattr(mrtr.tasks._inbox, "_CAS_RETRIES", 4)
    store = ContendedStore(":memory:")
    server = new_server("callback-busy")
    flows = mrtr.Flows(server, store=store, task_poll_interval=0.05, public_url="http://hooks.test")
    urls: list[str] = []

    @flows.tool(task="required")
    async def hooked(ctx: mrtr.FlowContext) -> str:
        url = await ctx.callback_url("ci")
        await ctx.step("hand-out", lambda: urls.append(url))
        payload = await ctx.wait_for_event("ci")
        return f"ci said {payload['status']}"

    transport = httpx.ASGITransport(app=flows.streamable_http_app())
    client = Client(server, extensions=[TasksClient(_no_answers)], elicitation_callback=_no_answers)
    async with client, httpx.AsyncClient(transport=transport, base_url="http://hooks.test") as http:
        created = await client.session.call_tool("hooked", {}, allow_claimed=True)
        task_id = str(created.task_id)
        async with asyncio.timeout(5):
            while not urls or "waiting for event" not in (await task_state(client.session, task_id)).get(
                "statusMessage", ""
            ):
                await asyncio.sleep(0.02)
        (url,) = urls

        store.contended = True
        refused = await http.post(url, json={"status": "green"})
        store.contended = False
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("retry-after") == "1"
        assert refused.json()["delivered"] is False and store.rival_writes >= 2
        parked = await task_state(client.session, task_id)
        assert parked["status"] == "working", "nothing was delivered"

        accepted = await http.post(url, json={"status": "green"})
        assert accepted.status_code == 202, accepted.text
        async with asyncio.timeout(5):
            while (done := await task_state(client.session, task_id))["status"] != "completed":
                await asyncio.sleep(0.02)
    assert done["result"]["content"][0]["text"] == "ci said green"
