"""A talk-submission helper in the shape of bnau/prez-mcp: one sampling call, then a loop of confirmations.

FastMCP 3.x code. What moving it to mrtr changed, and nothing else:
- imports: `mrtr`, `mrtr.fastmcp`, `open_store`, `RequestStateSecurity`;
- `FastMCP(..., request_state_security=...)`: one key for every instance, so any instance serves any round;
- `flows = mrtr.fastmcp.Flows(mcp, store=...)`, and `@flows.tool(task="optional")` for `@mcp.tool`.

The confirmations are 3.x's bare `ctx.elicit(message, response_type=None)`: accepted, declined or cancelled.
Reads MRTR_STATE_KEY (hex), MRTR_STORE and MRTR_STORE_NAMESPACE.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from fastmcp import Context, FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.server.request_state import RequestStateSecurity  # migration: the fleet's key
from pydantic import Field

import mrtr.fastmcp  # migration
from mrtr.stores import open_store  # migration

CONFERENCES = [
    {"name": "PyCon FR", "city": "Lyon", "tags": ["python", "data"]},
    {"name": "DevFest Nantes", "city": "Nantes", "tags": ["web", "cloud", "ai"]},
    {"name": "BreizhCamp", "city": "Rennes", "tags": ["java", "devops"]},
]

mcp: FastMCP[Any] = FastMCP(
    "talks", request_state_security=RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])])
)
flows = mrtr.fastmcp.Flows(  # migration
    mcp,
    store=open_store(os.environ["MRTR_STORE"], namespace=os.environ["MRTR_STORE_NAMESPACE"] + "_talks"),
    task_lease=1.0,
    task_scan_interval=0.2,
    task_poll_interval=0.1,
)


@flows.tool(task="optional")  # was: @mcp.tool(name="match_talks", description=...)
async def match_talks(
    ctx: Context,
    topic: Annotated[str, Field(description="The talk's subject")],
    min_score: Annotated[int, Field(description="Keep matches scoring at least this", ge=0, le=100)] = 30,
) -> dict[str, Any]:
    """Score the conferences for a talk with the client's LLM, then ask about each match."""
    prompt = (
        f"Which conferences fit the talk {topic!r}? Reply with JSON only: "
        '{"matches": [{"conference_name": ..., "score": 0-100}]}\n'
        f"Conferences: {json.dumps(CONFERENCES)}"
    )
    result = await ctx.sample(messages=prompt, temperature=0.3, max_tokens=800)
    analysis = json.loads(result.text or "{}")
    matches = [m for m in analysis.get("matches", []) if m.get("score", 0) >= min_score]
    matches.sort(key=lambda m: m["score"], reverse=True)
    decided = []
    for match in matches:
        name = match["conference_name"]
        answer = await ctx.elicit(f"Submit {topic!r} to {name} (score {match['score']}/100)?", response_type=None)
        status = {"accept": "submitting", "decline": "skipped"}.get(answer.action, "cancelled")
        data = answer.data if isinstance(answer, AcceptedElicitation) else None  # None: a bare confirmation
        decided.append({"name": name, "score": match["score"], "status": status, "data": data})
    return {"topic": topic, "matches": decided}
