"""`mrtr.fastmcp` on a real fleet: two FastMCP processes sharing a key, rounds landing on both.

`tests/support/fastmcp_server.py` runs as two uvicorn processes (A and B) with the same
`request_state_security` key and server name. Every client here goes through a balancer that
sends each POST to the other instance than the last one, so consecutive rounds of one call are
served by different processes: only the sealed `requestState` carries the flow across. Each
step run appends a line to a shared audit file, so a step that ran twice anywhere shows.

Four clients drive the same calls: the official `mcp.Client` (2026-07-28), `fastmcp.Client`,
`mrtr.client.FlowClient`, and the official client in the legacy era pinned to one instance (a
legacy session is stateful).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
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
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import FileUrl

from mrtr.client import FlowClient
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, new_key, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
TEST_TIMEOUT = 30.0
INSTANCE_HEADER = "x-mrtr-instance"
SCRIPT = SUPPORT / "fastmcp_server.py"
READY_PREFIX = "fastmcp-server ready:"
ROOT_URI = "file:///trips"
CLIENTS = ["official", "fastmcp", "flowclient", "legacy"]


@dataclass
class Fleet:
    servers: dict[str, ServerProcess]
    audit_log: Path

    def ports(self) -> list[int]:
        return [httpx2.URL(self.servers[label].url).port or 0 for label in ("A", "B")]

    @property
    def url(self) -> str:
        return self.servers["A"].url

    def steps(self) -> list[dict[str, str]]:
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fastmcp-fleet")
    key = new_key()
    audit_log = workdir / "audit.log"
    specs = [
        ServerSpec(
            label, {"MRTR_STATE_KEY": key, "MRTR_INSTANCE": label, "MRTR_AUDIT": str(audit_log)}, SCRIPT, READY_PREFIX
        )
        for label in ("A", "B")
    ]
    with spawn_servers(specs, workdir) as servers:
        yield Fleet(servers, audit_log)
        for server in servers.values():  # whatever the tests did, no server may have crashed
            assert server.process.poll() is None, f"server {server.label} died:\n{server.log()}"
            assert "Traceback" not in server.log(), server.log()


class Alternating(httpx2.AsyncBaseTransport):
    """A balancer in the client's HTTP stack: each POST goes to the other instance than the last.

    `served` lists, per request, the instance that answered (its `X-Mrtr-Instance` header).
    """

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.turn = 0
        self.served: list[str] = []
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[0]
        if request.method == "POST":
            port = self.ports[self.turn % len(self.ports)]
            self.turn += 1
        request.url = request.url.copy_with(port=port)
        request.headers["host"] = f"127.0.0.1:{port}"
        response = await self.inner.handle_async_request(request)
        self.served.append(response.headers.get(INSTANCE_HEADER, "?"))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- what the user answers, whichever client asks -------------------------------------------------


def reply(message: str) -> dict[str, Any] | None:
    """The answer to a question by its text; None declines."""
    message = message.split("\n\n")[0]  # a re-ask appends why
    if message.startswith("Go to "):
        return None if message.startswith("Go to Oslo") else {"value": True}
    if message.startswith("Which class to "):
        return None if message.startswith("Which class to Bergen") else {"value": "business"}
    if message.startswith("Pay "):
        return None if message.endswith(" to nobody?") else {"ok": True}
    if message.startswith("Brief about "):
        return {"value": "devs"}
    fixed: dict[str, dict[str, Any]] = {
        "Who travels?": {"name": "Ada", "age": 36},
        "How many bags?": {"value": 2},
        "Extras?": {"value": ["wifi", "meal"]},
        "Preferences?": {"seat": "window", "meal": True},
    }
    return fixed[message]


@dataclass
class Asked:
    """What the server asked through one client, by kind."""

    kinds: Counter[str] = field(default_factory=Counter)


def elicit_result(message: str, asked: Asked) -> t.ElicitResult:
    asked.kinds["elicit"] += 1
    content = reply(message)
    return t.ElicitResult(action="decline") if content is None else t.ElicitResult(action="accept", content=content)


def sample_result(params: t.CreateMessageRequestParams, asked: Asked) -> t.CreateMessageResult:
    asked.kinds["sample"] += 1
    assert params.system_prompt == "be brief" and params.max_tokens == 30, params
    return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="sunny"), model="m")


def roots_result(asked: Asked) -> list[t.Root]:
    asked.kinds["roots"] += 1
    return [t.Root(uri=FileUrl(ROOT_URI))]


# -- one driver per client ---------------------------------------------------------------------


@dataclass
class Driver:
    """Calls through one client, returning text (a tool error as `error: ...`)."""

    tool: Callable[[str, dict[str, Any]], Awaitable[str]]
    prompt: Callable[[str, dict[str, str]], Awaitable[str]]
    protocol_version: str | None
    balancer: Alternating | None


def tool_text(result: t.CallToolResult) -> str:
    assert isinstance(result.content[0], t.TextContent), result
    return ("error: " if result.is_error else "") + result.content[0].text


def prompt_text(result: t.GetPromptResult) -> str:
    [message] = result.messages
    assert isinstance(message.content, t.TextContent), result
    return message.content.text


def balanced_http(balancer: Alternating, **options: Any) -> httpx2.AsyncClient:
    options.setdefault("timeout", httpx2.Timeout(20.0))
    return httpx2.AsyncClient(transport=balancer, trust_env=False, **options)


@asynccontextmanager
async def official(fleet: Fleet, asked: Asked, *, legacy: bool = False) -> AsyncIterator[Driver]:
    async def elicit(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return elicit_result(params.message, asked)

    async def sample(context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return sample_result(params, asked)

    async def roots(context: Any) -> t.ListRootsResult:
        return t.ListRootsResult(roots=roots_result(asked))

    balancer = None if legacy else Alternating(fleet.ports())
    http = httpx2.AsyncClient(trust_env=False, timeout=20.0) if balancer is None else balanced_http(balancer)
    async with http:
        client = Client(
            streamable_http_client(fleet.url, http_client=http),  # legacy: pinned to A (the session lives there)
            mode="legacy" if legacy else "auto",
            elicitation_callback=elicit,
            sampling_callback=sample,
            list_roots_callback=roots,
            input_required_max_rounds=20,  # plan_trip asks eight times, one at a time (the default is 10)
        )
        async with client:

            async def tool(name: str, arguments: dict[str, Any]) -> str:
                return tool_text(await client.call_tool(name, arguments))

            async def prompt(name: str, arguments: dict[str, str]) -> str:
                return prompt_text(await client.get_prompt(name, arguments))

            yield Driver(tool, prompt, client.protocol_version, balancer)


@asynccontextmanager
async def with_fastmcp(fleet: Fleet, asked: Asked) -> AsyncIterator[Driver]:
    async def elicit(message: str, response_type: Any, params: Any, context: Any) -> FastMCPElicitResult[Any]:
        result = elicit_result(message, asked)
        return FastMCPElicitResult(action=result.action, content=result.content)

    async def sample(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> str:
        return sample_result(params, asked).content.text  # type: ignore[union-attr]

    async def roots(context: Any) -> list[t.Root]:
        return roots_result(asked)

    balancer = Alternating(fleet.ports())

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
        follow_redirects: bool = True,
    ) -> httpx2.AsyncClient:
        options: dict[str, Any] = {"headers": headers, "auth": auth} | ({"timeout": timeout} if timeout else {})
        return balanced_http(balancer, follow_redirects=follow_redirects, **options)

    transport = StreamableHttpTransport(fleet.url, httpx_client_factory=factory)
    client = FastMCPClient(
        transport,
        elicitation_handler=elicit,
        sampling_handler=sample,
        roots=roots,
        timeout=20.0,
        input_required_max_rounds=20,
    )
    async with client:

        async def tool(name: str, arguments: dict[str, Any]) -> str:
            return tool_text(await client.call_tool_mcp(name, arguments))

        async def prompt(name: str, arguments: dict[str, str]) -> str:
            return prompt_text(await client.get_prompt(name, arguments))

        yield Driver(tool, prompt, client.protocol_version, balancer)


@asynccontextmanager
async def with_flowclient(fleet: Fleet, asked: Asked) -> AsyncIterator[Driver]:
    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        return elicit_result(params.message, asked)

    async def sample(params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        return sample_result(params, asked)

    async def roots() -> list[t.Root]:
        return roots_result(asked)

    balancer = Alternating(fleet.ports())
    async with (
        balanced_http(balancer) as http,
        FlowClient(fleet.url, elicit=elicit, sample=sample, roots=roots, http_client=http, timeout=20.0) as flows,
    ):

        async def tool(name: str, arguments: dict[str, Any]) -> str:
            return tool_text(await flows.call_tool(name, arguments))

        async def prompt(name: str, arguments: dict[str, str]) -> str:
            return prompt_text(await flows.get_prompt(name, arguments))

        yield Driver(tool, prompt, flows.protocol_version, balancer)


def open_driver(kind: str, fleet: Fleet, asked: Asked) -> Any:
    if kind == "official":
        return official(fleet, asked)
    if kind == "legacy":
        return official(fleet, asked, legacy=True)
    if kind == "fastmcp":
        return with_fastmcp(fleet, asked)
    return with_flowclient(fleet, asked)


# -- the test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CLIENTS)
async def test_fastmcp_flows_cross_instances_and_each_step_runs_once(fleet: Fleet, kind: str) -> None:
    asked = Asked()
    with anyio.fail_after(TEST_TIMEOUT):
        async with open_driver(kind, fleet, asked) as driver:
            trip = await driver.tool("plan_trip", {"city": f"Lisbon-{kind}"})
            at_once = await driver.tool("plan_trip", {"city": f"Oslo-{kind}"})
            midway = await driver.tool("plan_trip", {"city": f"Bergen-{kind}"})
            paid = await driver.tool("pay", {"amount": 7, "payee": kind})
            refused = await driver.tool("pay", {"amount": 8, "payee": "nobody"})
            prompt = await driver.prompt("brief", {"topic": kind})

    assert driver.protocol_version == (LEGACY if kind == "legacy" else MODERN)
    assert trip == (
        f"Lisbon-{kind}: Ada (Traveller 36), business, 2 bags, extras wifi+meal, window seat, meal=True, "
        f"sunny, roots ['{ROOT_URI}']"
    )
    assert at_once == f"Oslo-{kind}: not going (decline)"  # the tool's own decline path, not an error
    assert midway == f"Bergen-{kind}: booked, class decline"
    assert paid == f"{kind}: paid 7"
    # A `FlowContext` flow's decline is a tool error (`Declined` raised in the flow), for every client.
    assert refused == "error: The user declined the request: Pay 8 to nobody?"
    assert prompt == f"Write about {kind} for devs."
    # Lisbon: 6 questions, Oslo: 1, Bergen: 3, pay: 1 + 1, brief: 1; one sample and one roots (Lisbon).
    assert asked.kinds == Counter(elicit=13, sample=1, roots=1)

    tags = {f"Lisbon-{kind}", f"Oslo-{kind}", f"Bergen-{kind}", kind, "nobody"}
    runs = [line for line in fleet.steps() if line["tag"] in tags]
    assert Counter((line["step"], line["tag"]) for line in runs) == Counter(
        {
            ("book", f"Lisbon-{kind}"): 1,
            ("email", f"Lisbon-{kind}"): 1,
            ("book", f"Bergen-{kind}"): 1,
            ("charge", kind): 1,
            ("draft", kind): 1,
        }
    ), runs
    assert len({line["key"] for line in runs}) == len(runs)  # one idempotency key per step of one call

    if driver.balancer is None:  # legacy: one stateful session on A
        assert {line["instance"] for line in runs} == {"A"}
        return
    served = driver.balancer.served
    # Lisbon alone takes nine requests; every one went to the other instance than the one before.
    assert len(served) >= 9 + 1 + 4 + 2 + 2 + 2, served
    assert all(a != b for a, b in pairwise(served)), served
    assert set(served) == {"A", "B"}


async def test_an_answer_that_does_not_fit_is_asked_again_by_the_other_instance(fleet: Fleet) -> None:
    asked: list[str] = []

    async def sloppy(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        asked.append(params.message)
        return t.ElicitResult(action="accept", content={"ok": "maybe" if len(asked) == 1 else True})

    balancer = Alternating(fleet.ports())
    with anyio.fail_after(TEST_TIMEOUT):
        async with (
            balanced_http(balancer) as http,
            Client(streamable_http_client(fleet.url, http_client=http), elicitation_callback=sloppy) as client,
        ):
            result = await client.call_tool("pay", {"amount": 9, "payee": "sloppy"})
    assert tool_text(result) == "sloppy: paid 9"
    assert len(asked) == 2 and asked[0] == "Pay 9 to sloppy?" and "Asked again" in asked[1], asked
    assert [line["step"] for line in fleet.steps() if line["tag"] == "sloppy"] == ["charge"]
    assert all(a != b for a, b in pairwise(balancer.served)) and set(balancer.served) == {"A", "B"}


# -- FastMCP 3.x's sampling loop across the fleet (issue #35) -----------------------------------------


def research_llm(messages: list[t.SamplingMessage], params: t.CreateMessageRequestParams, context: Any) -> Any:
    """The client's LLM, as a FastMCP 3.x user writes a sampling handler: it calls tools, then answers."""
    first = messages[0].content
    assert isinstance(first, t.TextContent)
    topic = first.text.split(" ", 1)[1]
    last = messages[-1].content_as_list
    results = {block.tool_use_id: block for block in last if isinstance(block, t.ToolResultContent)}

    def use(*calls: tuple[str, str, dict[str, Any]]) -> t.CreateMessageResultWithTools:
        blocks = [t.ToolUseContent(type="tool_use", id=i, name=n, input=a) for i, n, a in calls]
        return t.CreateMessageResultWithTools(role="assistant", content=blocks, model="llm", stop_reason="toolUse")

    def text(block: t.ToolResultContent) -> str:
        assert isinstance(block.content[0], t.TextContent)
        return block.content[0].text

    if first.text.startswith("Stepwise"):
        if not results:
            return use(("s1", "lookup", {"topic": topic}))
        return f"stepped on {text(results['s1']).split('@')[0]}"
    assert params.system_prompt == "judge" and params.tool_choice is not None
    if not results:
        return use(
            ("l", "lookup", {"topic": topic}),
            ("r", "rate", {"topic": topic, "points": 3}),
            ("x", "explode", {"topic": topic}),
            ("n", "nope", {}),
        )
    if "l" in results:
        assert text(results["l"]).startswith(f"facts({topic})@lookup@")  # which instance ran it
        assert text(results["r"]) == "6"
        assert text(results["x"]) == f"Error executing tool 'explode': no {topic} today"
        assert text(results["n"]) == "Error: Unknown tool 'nope'" and results["n"].is_error
        return use(("v1", "final_response", {"score": "six", "reason": "typo"}))
    assert text(results["v1"]).startswith("Validation error: ") and results["v1"].is_error
    return use(("v2", "final_response", {"score": 6, "reason": "checked"}))


@pytest.mark.parametrize("concurrency", [None, 0])
async def test_the_sampling_tool_loop_crosses_instances_and_each_tool_call_runs_once(
    fleet: Fleet, concurrency: int | None
) -> None:
    balancer = Alternating(fleet.ports())

    def factory(**options: Any) -> httpx2.AsyncClient:
        return balanced_http(balancer, **{k: v for k, v in options.items() if v is not None})

    async def confirm(message: str, response_type: Any, params: Any, context: Any) -> FastMCPElicitResult[Any]:
        assert params.requested_schema == {"type": "object", "properties": {}}
        return FastMCPElicitResult(action="accept", content=None)

    tag = f"sampled-{concurrency}"
    client = FastMCPClient(
        StreamableHttpTransport(fleet.url, httpx_client_factory=factory),
        sampling_handler=research_llm,
        sampling_capabilities=t.SamplingCapability(tools=t.SamplingToolsCapability()),
        elicitation_handler=confirm,
        timeout=20.0,
    )
    with anyio.fail_after(TEST_TIMEOUT):
        async with client:
            research = tool_text(await client.call_tool_mcp("research", {"topic": tag, "concurrency": concurrency}))
            stepwise = tool_text(await client.call_tool_mcp("stepwise", {"topic": f"{tag}-step"}))
            bare = tool_text(await client.call_tool_mcp("bare_confirm", {"topic": f"{tag}-bare"}))

    # prompt, tool calls, results, final_response, its error, final_response again, its result (as in 3.x)
    assert research == f"{tag}: 6 checked (7 messages)"
    assert stepwise == f"{tag}-step: stepped on facts({tag}-step)"
    assert bare == f"{tag}-bare: accept None"  # 3.x: a bare confirmation carries no data
    runs = Counter(line["step"] for line in fleet.steps() if line["tag"].startswith(tag))
    assert runs == Counter(lookup=2, rate=1, explode=1, file=1, confirmed=1)  # lookup: research's and stepwise's
    served = balancer.served
    assert all(a != b for a, b in pairwise(served)) and set(served) == {"A", "B"}, served
