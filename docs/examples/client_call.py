"""The clients guide's example: `FlowClient` answers every round of a call with your handlers.

`FlowClient` takes a URL (mrtr's own HTTP transport), a stdio command, or, as here, a server
object in the same process. Run by `tests/integration/test_docs_examples.py`.
"""

from __future__ import annotations

import asyncio
import os
import secrets

os.environ.setdefault("MRTR_STATE_KEY", secrets.token_hex(32))

# isort: split
from quickstart import server  # the landing page's deploy flow

# isort: split
# --8<-- [start:client]
import mcp_types as t

from mrtr.client import FlowClient, Round


async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
    """Your UI: here every form is answered at once."""
    if "where" in params.message:
        return t.ElicitResult(action="accept", content={"env": "staging"})
    return t.ElicitResult(action="accept", content={"yes": True})


async def sample(params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
    """Your LLM: here a canned completion."""
    return t.CreateMessageResult(role="assistant", model="canned", content=t.TextContent(type="text", text="none"))


def show(round: Round) -> None:
    print(f"round {round.number}: asked {sorted(round.asked)}")


async def call_deploy(target: object) -> t.CallToolResult:  # a URL, a stdio command, or a server object
    async with FlowClient(target, elicit=elicit, sample=sample, on_round=show) as client:
        return await client.call_tool("deploy", {"service": "api"})


# --8<-- [end:client]


async def main() -> None:
    result = await call_deploy(server)
    assert not result.is_error, result
    assert "applied api-staging-1" in str(result.content[0]), result


if __name__ == "__main__":
    asyncio.run(main())
