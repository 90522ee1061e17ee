"""The durable tasks guide's example: the same flow body, as a task whose journal lives in a store.

A client that declares the tasks extension gets a task (`task="optional"`); others, like the
in-process driver in `main`, get the result inline, so this file runs anywhere. Run by
`tests/integration/test_docs_examples.py`; `tests/fleet/test_task_fleet.py` kills real workers
mid-step on SQLite, Redis and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr.testing import run_rounds


class Confirm(BaseModel):
    yes: bool


class Plan(BaseModel):
    steps: int


def plan_migration(table: str) -> Plan:
    return Plan(steps=3)


def run_migration(plan: Plan) -> None:
    key = mrtr.current_step().idempotency_key  # the same on every retry, on every instance
    print(f"running {plan.steps} steps under idempotency key {key}")


def build(store: mrtr.TaskStore) -> mrtr.Flows:
    server = MCPServer("migrator", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
    # --8<-- [start:task]
    flows = mrtr.Flows(server, store=store)  # e.g. mrtr.PostgresStore("postgresql://app@db/app")

    @flows.tool(task="optional")  # a task when the client opts in, inline otherwise
    async def migrate(table: str, ctx: mrtr.FlowContext) -> str:
        plan = await ctx.step("plan", plan_migration, table)  # checkpointed to the store
        ok = await ctx.elicit(f"Run {plan.steps} steps on {table}?", Confirm)  # task -> input_required
        if not ok.yes:
            return "skipped"
        await ctx.step("run", run_migration, plan)  # idempotency key: mrtr.current_step().idempotency_key
        return "migrated"

    # --8<-- [end:task]
    return flows


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # --8<-- [start:stores]
        store = mrtr.open_store(f"sqlite:///{Path(tmp) / 'tasks.db'}")  # or redis://..., postgresql://...
        # --8<-- [end:stores]
        flows = build(store)
        try:
            report = await run_rounds(flows, "migrate", {"table": "users"}, answers={"Run 3 steps": {"yes": True}})
        finally:
            await store.close()
        assert report.rounds == 2, report.rounds
        assert "migrated" in str(report.result.content[0]), report.result


if __name__ == "__main__":
    asyncio.run(main())
