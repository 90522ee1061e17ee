"""`examples/fastmcp_talks.py` on two instances: FastMCP 3.x's `ctx.sample(tools=..., result_type=...)` and a
confirmation loop batched with `mrtr.gather`, every round served by the other instance than the last.

The client is `fastmcp.Client` with a sampling handler written as a FastMCP 3.x user writes
one (it plays the LLM: it calls the server's tools, then answers through `final_response`)
and an elicitation handler confirming some matches. The example's ledger file counts its side
effect across both processes; the handler counts what it was asked.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as t
import pytest
from fastmcp import Client as FastMCPClient
from fastmcp.client.elicitation import ElicitResult as FastMCPElicitResult
from fastmcp.client.transports import StreamableHttpTransport

from tests.fleet.test_fastmcp_fleet import Alternating, balanced_http
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, new_key, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


@pytest.fixture(scope="module")
def talks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ServerProcess], Path]]:
    workdir = tmp_path_factory.mktemp("talks-fleet")
    key, ledger = new_key(), workdir / "ledger.jsonl"
    env = {"MRTR_STATE_KEY": key, "MRTR_EXAMPLE": "examples/fastmcp_talks.py", "TALKS_LEDGER": str(ledger)}
    specs = [
        ServerSpec(label, env | {"MRTR_INSTANCE": label}, SUPPORT / "example_server.py", "example-server ready:")
        for label in ("A", "B")
    ]
    with spawn_servers(specs, workdir) as servers:
        yield servers, ledger
        for server in servers.values():
            assert server.process.poll() is None, server.log()
            assert "Traceback" not in server.log(), server.log()


async def test_the_talks_example_samples_with_tools_and_confirms_in_one_round_across_instances(
    talks: tuple[dict[str, ServerProcess], Path],
) -> None:
    servers, ledger = talks
    balancer = Alternating([httpx2.URL(servers[label].url).port or 0 for label in ("A", "B")])
    asked: Counter[str] = Counter()

    def llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
        asked["sample"] += 1
        assert {tool.name for tool in params.tools or []} == {"read_talk", "reviewer_topics", "final_response"}
        results = [b for b in messages[-1].content_as_list if isinstance(b, t.ToolResultContent)]

        def use(*calls: tuple[str, str, dict[str, Any]]) -> t.CreateMessageResultWithTools:
            blocks = [t.ToolUseContent(type="tool_use", id=i, name=n, input=a) for i, n, a in calls]
            return t.CreateMessageResultWithTools(role="assistant", content=blocks, model="llm", stop_reason="toolUse")

        if not results:  # first turn: read everything at once
            return use(
                ("talk", "read_talk", {"talk_id": "t1"}),
                *[(name, "reviewer_topics", {"reviewer": name}) for name in ("ada", "grace", "linus")],
            )
        texts = {r.tool_use_id: r.content[0].text for r in results}  # type: ignore[union-attr]
        assert texts["talk"].startswith("Replaying flows") and texts["ada"] == "distributed systems, protocols"
        scores = {"ada": 9, "grace": 6, "linus": 2}
        return use(("final", "final_response", {"matches": [{"reviewer": r, "score": s} for r, s in scores.items()]}))

    async def user(message: str, response_type: Any, params: Any, context: Any) -> FastMCPElicitResult[Any]:
        asked["confirm"] += 1
        return FastMCPElicitResult(action="accept", content={"value": message.startswith("Assign ada")})

    methods: list[str] = []

    async def record(request: httpx2.Request) -> None:
        if request.method == "POST":
            methods.append(json.loads(request.content).get("method", ""))

    def factory(**options: Any) -> httpx2.AsyncClient:
        http = balanced_http(balancer, **{k: v for k, v in options.items() if v is not None})
        http.event_hooks["request"].append(record)
        return http

    client = FastMCPClient(
        StreamableHttpTransport(servers["A"].url, httpx_client_factory=factory),
        sampling_handler=llm,
        sampling_capabilities=t.SamplingCapability(tools=t.SamplingToolsCapability()),
        elicitation_handler=user,
        timeout=20.0,
    )
    with anyio.fail_after(30):
        async with client:
            result = await client.call_tool("match_reviewers", {"talk_id": "t1"})

    assert result.data == "t1: ada->t1"
    assert asked == Counter(sample=2, confirm=2)  # two model turns; both confirmations asked, once each
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(line["talk"], line["reviewer"]) for line in lines] == [("t1", "ada")]  # the side effect, once
    # four rounds: turn 1, turn 2, both confirmations together, the end; each on the other instance
    assert methods.count("tools/call") == 4, methods
    served = balancer.served
    assert all(a != b for a, b in pairwise(served)) and set(served) == {"A", "B"}, served
