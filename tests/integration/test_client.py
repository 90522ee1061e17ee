"""`mrtr.client.FlowClient`: explicit round driving with the MRTR client rules."""

from __future__ import annotations

from collections import Counter

import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError

from mrtr.client import FlowClient, RetryPolicy, Round, RoundLimitExceeded
from tests.integration.test_flows import deploy_server
from tests.support.flowkit import accept, sampled

pytestmark = pytest.mark.anyio


async def answer_elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
    return accept(env="prod") if "where" in params.message else accept(yes=True)


async def answer_sample(params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
    return sampled("low")


async def answer_roots() -> list[t.Root]:
    return [t.Root(uri="file:///srv")]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_flow_client_drives_every_round_and_reports_them(mode: str) -> None:
    runs: Counter[str] = Counter()
    rounds: list[Round] = []
    server = deploy_server(runs, [])
    async with FlowClient(
        server, elicit=answer_elicit, sample=answer_sample, roots=answer_roots, mode=mode, on_round=rounds.append
    ) as flows:
        result = await flows.call_tool("deploy", {"service": "api"})
    assert not result.is_error
    assert result.content[0].text == "applied api-prod; risk: low; roots: ['file:///srv']"
    assert runs == Counter(plan=1, apply=1)
    if mode == "auto":
        assert [sorted(r.method for r in rnd.asked.values()) for rnd in rounds] == [
            ["elicitation/create"],
            ["elicitation/create", "sampling/createMessage"],
            ["roots/list"],
        ]
        assert all(rnd.had_state for rnd in rounds)
    else:
        assert rounds == []  # legacy servers ask through server->client requests instead


async def test_without_a_handler_the_capability_is_not_declared() -> None:
    server = deploy_server(Counter(), [])
    async with FlowClient(server, elicit=answer_elicit, sample=answer_sample) as flows:
        # No roots handler: roots are not declared, so the server refuses with -32021 rather than asking.
        with pytest.raises(MCPError) as caught:
            await flows.call_tool("deploy", {"service": "api"})
    assert caught.value.error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_round_limit() -> None:
    server = deploy_server(Counter(), [])
    async with FlowClient(
        server, elicit=answer_elicit, sample=answer_sample, roots=answer_roots, max_rounds=2
    ) as flows:
        with pytest.raises(RoundLimitExceeded, match=r"max_rounds"):
            await flows.call_tool("deploy", {"service": "api"})


def test_the_default_round_limit_is_at_least_the_servers() -> None:
    assert FlowClient("http://127.0.0.1:1/mcp").max_rounds >= 25  # mrtr.Flows' own default


def test_backoff_is_jittered_doubling_and_capped() -> None:
    policy = RetryPolicy(attempts=8, initial_delay=0.1, max_delay=2.0)
    for resend, ceiling in enumerate([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]):
        delays = {policy.delay(resend) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jittered: clients that failed together do not come back together
