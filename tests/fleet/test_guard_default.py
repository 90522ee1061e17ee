"""The README's fleet recipe guards rounds with no option set, on both hosts.

Two real uvicorn instances built as the README builds a fleet (a shared key, a Redis or
PostgreSQL store, nothing else): `tests/support/task_server.py` on the SDK's `MCPServer` (no
`MRTR_GUARD`), `tests/support/fastmcp_task_server.py` on FastMCP. A client resends round 2 of
`deploy` (round 1's state with its answer) to both instances at once, then once more: the
side effect in between runs once, and every resend gets the first run's outcome. Without the
default guard each resend would run it again (state is authentic, not single-use).
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

from tests.fleet.test_task_fleet import _store_url
from tests.support.markers import backends
from tests.support.servers import SUPPORT, ServerSpec, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

HOSTS = {
    "mcpserver": (SUPPORT / "task_server.py", "task-server ready:", {"env": "prod"}),
    "fastmcp": (SUPPORT / "fastmcp_task_server.py", "fastmcp-task-server ready:", {"value": "prod"}),
}


async def _refuse(*args: Any) -> Any:
    raise AssertionError("rounds are driven by hand")


@pytest.mark.parametrize("store_kind", backends("redis", "postgres"))
@pytest.mark.parametrize("host", sorted(HOSTS))
async def test_a_resent_round_runs_its_step_once_with_no_option_set(host: str, store_kind: str, tmp_path: Path) -> None:
    script, ready, where = HOSTS[host]
    store_url, namespace = _store_url(store_kind, tmp_path)
    audit = tmp_path / "audit.jsonl"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": store_url,
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(audit),
    }
    specs = [ServerSpec(label, env | {"MRTR_INSTANCE": label}, script=script, ready_prefix=ready) for label in "AB"]
    with spawn_servers(specs, tmp_path) as servers:
        async with (
            Client(servers["A"].url, elicitation_callback=_refuse) as on_a,
            Client(servers["B"].url, elicitation_callback=_refuse) as on_b,
        ):

            async def send(peer: Client, state: str | None, answers: dict[str, Any] | None) -> Any:
                return await peer.session.call_tool(
                    "deploy", {"slow": 0.2}, input_responses=answers, request_state=state, allow_input_required=True
                )

            first = await send(on_a, None, None)
            assert isinstance(first, t.InputRequiredResult)
            (key,) = first.input_requests
            answers = {key: {"action": "accept", "content": where}}
            resent = await asyncio.gather(*[send(peer, first.request_state, answers) for peer in [on_a, on_b] * 3])
            resent.append(await send(on_b, first.request_state, answers))
    assert all(isinstance(r, t.InputRequiredResult) for r in resent), resent
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    started = Counter(e["step"] for e in lines if e["phase"] == "start")
    assert started == {"apply@prod": 1}, f"one run of the step for seven sends of its round: {started}"
