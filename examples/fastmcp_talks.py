"""A FastMCP 3.x server that samples with tools and asks for confirmations, on FastMCP 4 through mrtr.

`python examples/fastmcp_talks.py` serves it on :8000. Give every instance the same key
(`MRTR_STATE_KEY`, hex) and run as many as you like behind any load balancer.

`match_reviewers` is 3.x code: the client's LLM reads a talk and scores reviewers with the
server's tools (`ctx.sample(tools=..., result_type=...)`), then the user confirms each match.
What changed for the 2026-07-28 wire (see the FastMCP guide's migration checklist):

- each model turn is a round, so the flow's round cap (`max_rounds`) and the client's allow
  for the tool loop; the confirmations go out together (`mrtr.gather`), one round for all of
  them instead of one round each;
- the side effect (`assign`) is a step, so it runs once per match, on whichever instance,
  however many rounds replay the flow; the model's tool calls are steps too.

`TALKS_LEDGER` (a file path) stands in for the database `assign` writes to.
"""

from __future__ import annotations

import json
import os

from fastmcp import FastMCP
from fastmcp.server.elicitation import AcceptedElicitation
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel, Field

import mrtr
import mrtr.fastmcp
from mrtr.fastmcp import FlowsContext

# Without MRTR_STATE_KEY, FastMCP seals with a key only this process holds: fine for one instance.
KEY = os.environ.get("MRTR_STATE_KEY")
SECURITY = RequestStateSecurity(keys=[bytes.fromhex(KEY)]) if KEY else None

mcp: FastMCP[None] = FastMCP("talks", request_state_security=SECURITY)
# A sampling loop takes one round per model turn: read, score, answer, and a retry or two.
flows = mrtr.fastmcp.Flows(mcp, max_rounds=20)

TALKS = {
    "t1": "Replaying flows on a stateless fleet: journals, steps and sealed requestState.",
    "t2": "Pricing GPUs by the minute: what the spot market taught us.",
}
REVIEWERS = {"ada": "distributed systems, protocols", "grace": "compilers, tooling", "linus": "kernels, storage"}


class Match(BaseModel):
    reviewer: str
    score: int = Field(ge=0, le=10)


class Scores(BaseModel):
    matches: list[Match]


def read_talk(talk_id: str) -> str:
    """The talk's abstract."""
    return TALKS.get(talk_id, "no such talk")


def reviewer_topics(reviewer: str) -> str:
    """What a reviewer knows about."""
    return REVIEWERS.get(reviewer, "unknown reviewer")


def assign(talk_id: str, reviewer: str) -> str:
    """The side effect: record the assignment (once per match, whatever the rounds)."""
    key = mrtr.current_step().idempotency_key  # stable across rounds and instances
    ledger = os.environ.get("TALKS_LEDGER")
    if ledger:
        with open(ledger, "a") as out:
            out.write(json.dumps({"talk": talk_id, "reviewer": reviewer, "key": key}) + "\n")
    return f"{reviewer}->{talk_id}"


@flows.tool(description="Match reviewers to a talk: the LLM scores them, the user confirms each match")
async def match_reviewers(talk_id: str, ctx: FlowsContext) -> str:
    # --8<-- [start:sample]
    scored = await ctx.sample(
        f"Read talk {talk_id} and score each of these reviewers from 0 to 10: {', '.join(REVIEWERS)}.",
        system_prompt="You match conference talks to reviewers.",
        tools=[read_talk, reviewer_topics],
        tool_concurrency=0,  # the model's tool calls of one turn run at once
        result_type=Scores,
    )
    # --8<-- [end:sample]
    good = [match for match in scored.result.matches if match.score >= 5]
    # --8<-- [start:confirm]
    # 3.x asked in a loop, one round each; gathered, all confirmations go out in one round.
    answers = await mrtr.gather(
        *[ctx.elicit(f"Assign {m.reviewer} (score {m.score}) to {talk_id}?", response_type=bool) for m in good]
    )
    done = [
        await mrtr.step("assign", assign, talk_id, match.reviewer)  # the side effect: once per match
        for match, answer in zip(good, answers, strict=True)
        if isinstance(answer, AcceptedElicitation) and answer.data
    ]
    # --8<-- [end:confirm]
    return f"{talk_id}: " + (", ".join(done) or "nobody assigned")


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=8000)
