"""What the tasks unit tests share: flows, a result conversion, a fresh record, a state recorder."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel

from mrtr._engine import journal as journal_codec
from mrtr._engine.context import FlowContext
from mrtr._engine.journal import Journal
from mrtr._wire import TaskView
from mrtr.stores import TaskRecord, TaskStore
from tests.support.enginekit import spec_of

ELICITING = {"elicitation": {"form": {}}}
"""The capabilities of a client that can answer forms (wire JSON)."""


class Name(BaseModel):
    name: str


async def greet(ctx: FlowContext) -> str:
    """Asks once, then answers."""
    who = await ctx.elicit("Who?", Name)
    return f"hello {who.name}"


async def count(ctx: FlowContext, upto: int = 3) -> int:
    """Runs one step: nothing to ask."""
    return int(await ctx.step("count", lambda: upto))


def convert(value: Any) -> CallToolResult:
    """A flow's value as the tool's result (what the SDK's conversion does, for text)."""
    return CallToolResult(content=[TextContent(type="text", text=str(value))])


GREET = spec_of(greet)
COUNT = spec_of(count)


def fresh(task_id: str, flow: str, **changes: Any) -> TaskRecord:
    """A task as just created and never claimed: `working`, no lease, an empty journal."""
    now = time.time()
    record = TaskRecord(
        task_id=task_id,
        flow=flow,
        arguments={},
        capabilities=ELICITING,
        status="working",
        created_at=now,
        updated_at=now,
        ttl_ms=60_000,
        poll_interval_ms=500,
        journal=journal_codec.encode(Journal.start()),
    )
    return record.copy(**changes)


class Reported:
    """Collects the states a runtime or worker reports (its `report` / `on_change` hook)."""

    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []

    async def __call__(self, task: TaskView) -> None:
        self.states.append((task.task_id, task.status))


async def settled(store: TaskStore, task_id: str, *statuses: str, within: float = 5.0) -> TaskRecord:
    """The record once its status is one of `statuses` and no worker holds it."""
    async with asyncio.timeout(within):
        while True:
            record = await store.load(task_id, time.time())
            if record is not None and record.status in statuses and record.lease_owner is None:
                return record
            await asyncio.sleep(0.01)


__all__ = ["COUNT", "ELICITING", "GREET", "Name", "Reported", "convert", "fresh", "settled"]
