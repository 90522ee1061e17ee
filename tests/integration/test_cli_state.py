"""`mrtr inspect-state`: unseal a real requestState with the server's key and show its journal."""

from __future__ import annotations

import asyncio
import json
import os

from pydantic import BaseModel
from typer.testing import CliRunner

import mrtr
from mrtr.cli._app import app
from tests.support.flowkit import Driver, accept, manual_client, new_server


class Target(BaseModel):
    env: str


class Confirm(BaseModel):
    yes: bool


async def sealed_state(key: bytes) -> str:
    """The requestState of round 2 of a real flow: one answer, one step, one pending ask."""
    server = new_server("inspected", key=key)
    flows = mrtr.Flows(server)

    @flows.tool()
    async def ship(ctx: mrtr.FlowContext) -> str:
        target = await ctx.elicit("Where?", Target, key="target")
        plan = await ctx.step("plan", lambda: f"plan-{target.env}")
        await ctx.elicit(f"Apply {plan}?", Confirm, key="confirm")
        return "shipped"

    async with manual_client(server) as client:
        call = Driver(client, "ship")
        await call.send()
        await call.send({"target": accept(env="prod")})
        assert call.state is not None
        return call.state


def invoke(*args: str, key: str | None) -> tuple[int, str, str]:
    env = {"COLUMNS": "160", "MRTR_STATE_KEY": key or ""}
    result = CliRunner().invoke(app, ["inspect-state", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_inspect_state_shows_journal_pending_asks_and_envelope() -> None:
    key = os.urandom(32)
    token = asyncio.run(sealed_state(key))
    code, out, _ = invoke(token, key=key.hex())
    assert code == 0, out
    shown = ("tools/call ship", "audience inspected", "2 round(s)", "target", '"env": "prod"', ":plan", "confirm")
    for expected in shown:
        assert expected in out, f"{expected!r} not in:\n{out}"

    code, out, _ = invoke(token, "--json", key=f"{os.urandom(32).hex()},{key.hex()}")  # a ring: any key opens
    assert code == 0
    doc = json.loads(out)
    journal = doc["journal"]
    assert doc["method"] == "tools/call" and doc["target"] == "ship" and doc["expired"] is False
    assert journal["answers"]["target"]["answer"]["content"] == {"env": "prod"}
    assert journal["steps"]["plan"] == {
        "idempotencyKey": f"{journal['flowId']}:plan",
        "arguments": journal["steps"]["plan"]["arguments"],
        "result": "plan-prod",
    }
    assert list(journal["pending"]) == ["confirm"]
    assert 0 <= journal["ageSeconds"] < 60


def test_wrong_key_missing_key_and_garbage_are_one_line_errors() -> None:
    token = asyncio.run(sealed_state(os.urandom(32)))
    for args, key, fragment in (
        ((token,), os.urandom(32).hex(), "cannot unseal this requestState (unknown key)"),
        ((token,), None, "set MRTR_STATE_KEY"),
        ((token,), "zz", "must hold hex keys"),
        ((token,), "00" * 8, "must hold hex keys of at least 32 bytes"),
        (("v1.garbage",), os.urandom(32).hex(), "cannot unseal this requestState (malformed)"),
    ):
        code, out, err = invoke(*args, key=key)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and fragment in lines[0], (args, err, out)
