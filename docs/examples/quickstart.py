"""The landing page's example: a flow that asks, samples and runs steps, driven round by round.

Run it: `MRTR_STATE_KEY=$(python -c 'import secrets; print(secrets.token_hex(32))') python docs/examples/quickstart.py`
(`tests/integration/test_docs_examples.py` runs it in `make test`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

# isort: split
# --8<-- [start:flow]
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr

KEY = bytes.fromhex(os.environ["MRTR_STATE_KEY"])  # one key ring, every instance
security = RequestStateSecurity(keys=[KEY])
server = MCPServer("deployer", request_state_security=security)
flows = mrtr.Flows(server)


class Target(BaseModel):
    env: str


class Confirm(BaseModel):
    yes: bool


# what the flow will ask the client for: a host without one fails in round 1, before any question
@flows.tool(requires=["elicitation", "sampling"])
async def deploy(service: str, ctx: mrtr.FlowContext) -> str:
    """Deploy a service, asking where and confirming first."""
    # round 1: ask
    target = await ctx.elicit(f"Deploy {service} where?", Target)
    # a step runs once per flow; replays return its value
    plan = await ctx.step("plan", make_plan, service, target.env)
    # round 2: both asks at once
    ok, risk = await ctx.gather(
        ctx.elicit(f"Apply {plan.id}?", Confirm),
        ctx.sample_text(f"One-line risk of {plan.id}", max_tokens=100),
    )
    if not ok.yes:
        return "cancelled"
    # the side effect, once (its idempotency key is stable)
    return await ctx.step("apply", apply_plan, plan, risk)


# serve with uvicorn; run as many instances as you like
app = flows.streamable_http_app()
# --8<-- [end:flow]


@dataclass
class Plan:
    id: str
    service: str
    env: str


RUNS: list[str] = []  # what really ran, to show each step ran once


def make_plan(service: str, env: str) -> Plan:
    RUNS.append("plan")
    return Plan(id=f"{service}-{env}-1", service=service, env=env)


def apply_plan(plan: Plan, risk: str) -> str:
    RUNS.append("apply")
    return f"applied {plan.id} (risk: {risk})"


async def main() -> None:
    # --8<-- [start:drive]
    from mrtr.testing import run_rounds

    report = await run_rounds(
        flows,
        "deploy",
        {"service": "api"},
        answers={
            "where?": {"env": "staging"},
            "Apply": {"yes": True},
            "sampling/createMessage": "a typo",
        },
    )
    print(report.rounds)  # 3: ask; ask + sample; done
    print(report.result.content)  # applied api-staging-1 (risk: a typo)
    # --8<-- [end:drive]
    assert not report.result.is_error, report.result
    text = report.result.content[0]
    assert getattr(text, "text", "") == "applied api-staging-1 (risk: a typo)", text
    assert report.rounds == 3, report.rounds
    assert RUNS == ["plan", "apply"], RUNS  # the flow's body ran 3 times, each step once
    await without_sampling()


async def without_sampling() -> None:
    """A host with forms but no sampling (Claude Code, the MCP Inspector): refused in round 1, nothing asked."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    asked: list[str] = []

    async def form(context: object, params: object) -> object:
        asked.append("form")
        raise AssertionError("requires= refuses the call before the first question")

    async with Client(server, elicitation_callback=form) as client:  # type: ignore[arg-type]
        try:
            await client.call_tool("deploy", {"service": "api"})
        except MCPError as exc:
            assert exc.error.code == -32021, exc.error
            assert exc.error.data == {"requiredCapabilities": {"sampling": {}}}, exc.error.data
        else:
            raise AssertionError("a client without sampling was not refused")
    assert not asked and RUNS == ["plan", "apply"], (asked, RUNS)  # no question, no step


if __name__ == "__main__":
    asyncio.run(main())
