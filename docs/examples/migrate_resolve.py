"""The migration guide's example: a tool on the SDK's `Resolve` resolvers, and the same as a flow.

Both are registered on one server (the resolver tool is type-checked; the SDK tests its own
API); `main` runs the flow to its end in-process. Run by `tests/integration/test_docs_examples.py`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

import mrtr
from mrtr.testing import run_rounds

server = MCPServer("deployer", request_state_security=RequestStateSecurity(keys=[os.urandom(32)]))
flows = mrtr.Flows(server)


class Target(BaseModel):
    env: str


def deploy_to(service: str, env: str) -> str:
    return f"deployed {service} to {env}"


# --8<-- [start:before]
# Before: the SDK's resolvers. Every question is a resolver, filled in before the body runs.
async def ask_target() -> Elicit[Target]:
    return Elicit("Deploy where?", Target)


@server.tool()
async def deploy_resolved(service: str, target: Annotated[Target, Resolve(ask_target)]) -> str:
    return deploy_to(service, target.env)  # runs again if the call ever takes another round


# --8<-- [end:before]


# --8<-- [start:after]
# After: an mrtr flow. Questions are awaited where they are needed; side effects are steps.
@flows.tool()
async def deploy(service: str, ctx: mrtr.FlowContext) -> str:
    target = await ctx.elicit("Deploy where?", Target)
    return await ctx.step("deploy", deploy_to, service, target.env)  # runs once per flow


# --8<-- [end:after]


async def main() -> None:
    report = await run_rounds(flows, "deploy", {"service": "api"}, answers={"Deploy where?": {"env": "prod"}})
    assert "deployed api to prod" in str(report.result.content[0]), report.result


if __name__ == "__main__":
    asyncio.run(main())
