"""Single-use rounds across real instances: two uvicorn processes sharing a key and a guard store.

The `deploy` flow of tests/support/task_server.py asks where, applies (a side effect counted in
a shared audit file), then asks to confirm. A replaying client resends round 2 (the state of
round 1 with its answer) to both instances at once; a forking one answers it differently; a
retrying one resends it after the instance serving it was SIGKILLed mid-step.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.fleet.test_task_fleet import _store_url
from tests.support.markers import backends
from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SERVER = SUPPORT / "task_server.py"


async def _refuse(*args: Any) -> Any:
    raise AssertionError("rounds are driven by hand")


def client(url: str) -> Client:
    return Client(url, elicitation_callback=_refuse)


def starts(audit: Path) -> list[tuple[str, str]]:
    lines = audit.read_text().splitlines() if audit.exists() else []
    return [(e["step"], e["instance"]) for e in map(json.loads, lines) if e["phase"] == "start"]


def fleet(tmp_path: Path, guard_kind: str, request: pytest.FixtureRequest | None = None, **extra: str) -> Any:
    guard_url, namespace = _store_url(guard_kind, tmp_path, request)
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": f"sqlite:///{tmp_path / 'tasks.db'}",
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_GUARD": guard_url,
        "MRTR_AUDIT": str(tmp_path / "audit.jsonl"),
    } | extra
    specs = [
        ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=SERVER, ready_prefix="task-server ready:")
        for label in ("A", "B")
    ]
    return spawn_servers(specs, tmp_path)


async def _send(peer: Client, state: str | None, answers: dict[str, Any] | None, slow: float = 0.2) -> Any:
    return await peer.session.call_tool(
        "deploy", {"slow": slow}, input_responses=answers, request_state=state, allow_input_required=True
    )


@pytest.mark.parametrize("guard_kind", backends("redis", "redis-cluster", "postgres", "sqlite"))
async def test_replays_and_forks_across_instances(
    guard_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    audit = tmp_path / "audit.jsonl"
    with fleet(tmp_path, guard_kind, request) as servers:
        async with client(servers["A"].url) as on_a, client(servers["B"].url) as on_b:
            first = await _send(on_a, None, None)
            assert isinstance(first, t.InputRequiredResult)
            answers = {"where": {"action": "accept", "content": {"env": "prod"}}}
            # the same round five times, to both instances at once, then once more afterwards
            replays = await asyncio.gather(*[_send(peer, first.request_state, answers) for peer in [on_a, on_b] * 3])
            replays.append(await _send(on_b, first.request_state, answers))
            assert all(isinstance(r, t.InputRequiredResult) and list(r.input_requests) == ["keep"] for r in replays)
            assert Counter(step for step, _ in starts(audit)) == {"apply@prod": 1}
            # a fork of the same round, on either instance, is refused before any flow code runs
            for peer in (on_a, on_b):
                with pytest.raises(MCPError) as forked:
                    await _send(peer, first.request_state, {"where": {"action": "accept", "content": {"env": "stg"}}})
                assert forked.value.error.code == -32602
                assert forked.value.error.data == {"reason": "request_state_forked", "flow": "deploy"}
            assert [step for step, _ in starts(audit)] == ["apply@prod"]
            # the flow itself carries on normally from any copy of the outcome
            keep = {"keep": {"action": "accept", "content": {"publish": True}}}
            final = await _send(on_b, replays[2].request_state, keep)
            assert isinstance(final, t.CallToolResult) and "apply@prod done at prod" in final.content[0].text


@pytest.mark.needs_redis
async def test_a_resent_round_is_taken_over_after_its_instance_dies(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    with fleet(tmp_path, "redis", MRTR_GUARD_LEASE="1.0") as servers:
        async with client(servers["B"].url) as on_b:
            first = await _send(on_b, None, None, slow=3.0)  # the state is bound to the arguments
            answers = {"where": {"action": "accept", "content": {"env": "prod"}}}

            async def round_two_on_a() -> None:
                async with client(servers["A"].url) as on_a:
                    await _send(on_a, first.request_state, answers, slow=3.0)

            doomed = asyncio.create_task(round_two_on_a())
            for _ in range(200):
                if ("apply@prod", "A") in starts(audit):
                    break
                await asyncio.sleep(0.02)
            servers["A"].process.kill()  # SIGKILL mid-step: the claim is neither finished nor renewed
            servers["A"].process.wait()
            (lost,) = await asyncio.gather(doomed, return_exceptions=True)  # the connection drops
            assert isinstance(lost, Exception)
            # B waits for A's lease (1 s) to lapse, takes the round over and runs it.
            resent = await _send(on_b, first.request_state, answers, slow=3.0)
            assert isinstance(resent, t.InputRequiredResult) and list(resent.input_requests) == ["keep"]
    assert starts(audit) == [("apply@prod", "A"), ("apply@prod", "B")], "only the interrupted step ran again"
