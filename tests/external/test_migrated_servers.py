"""Two FastMCP 3.x servers moved to mrtr by their decorators and imports, on a two-instance fleet.

`tests/external/migrated/` holds servers of our own, written in the shapes of two public
FastMCP 3.x servers: `talks_server.py` (bnau/prez-mcp: one `ctx.sample`, then a loop of bare
`ctx.elicit(..., response_type=None)` confirmations) and `research_server.py`
(machinemates-ai/gemini-research-mcp: `ctx: Context | None = Depends(OptionalContext)`, a
`Progress` dependency, and a sampling tool that asks the user inside
`ctx.sample(tools=..., result_type=...)`, as a `task="optional"` tool). Their module docstrings
list what moving them changed.

One fleet for the module: two uvicorn processes (A, B) serving both servers, one key, one
Redis store (so one fleet bus: a task client listening on one instance hears the other's
tasks). Every client goes through a balancer that sends each POST to the other
instance than the last, so a call's rounds (and a task's requests) land on both. The clients:
`fastmcp.Client` (inline rounds), `mrtr.client.FlowClient` (as durable tasks, answering
sampling with tools), and `mrtr call` as a script (tasks, `--sampling json:...`, an answers
file with `:decline`). The last test SIGKILLs the instance running a research task mid-call;
the other adopts it and the client gets the report.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx2
import mcp_types as t
import pytest
import yaml  # type: ignore[import-untyped]
from fastmcp import Client as FastMCPClient
from fastmcp.client.elicitation import ElicitResult as FastMCPElicitResult
from fastmcp.client.transports import StreamableHttpTransport

from mrtr.client import FlowClient, TaskSnapshot
from tests.external.migrated import llm
from tests.fleet.test_fastmcp_fleet import Alternating, balanced_http
from tests.fleet.test_task_fleet import _store_url
from tests.support.servers import ROOT, ServerProcess, ServerSpec, new_key, spawn_servers

pytestmark = [pytest.mark.anyio, pytest.mark.spawns, pytest.mark.needs_redis]

SERVE = ROOT / "tests" / "external" / "migrated" / "serve.py"
LLM = ROOT / "tests" / "external" / "migrated" / "llm.py"
TIMEOUT = 30.0

TALKS_RESULT = {
    "topic": "Typed Python",
    "matches": [
        {"name": "PyCon FR", "score": 90, "status": "submitting", "data": None},
        {"name": "DevFest Nantes", "score": 60, "status": "skipped", "data": None},
    ],
}
REPORT = "## Report\nfindings on cars (Which years?: 2020s / Which region?: EU)"


@dataclass
class Fleet:
    servers: dict[str, ServerProcess]
    audit: Path
    killed: set[str] = field(default_factory=set)

    def url(self, server: str, label: str = "A") -> str:
        return self.servers[label].url.replace("/talks/", f"/{server}/")

    def ports(self) -> list[int]:
        return [httpx2.URL(self.servers[label].url).port or 0 for label in ("A", "B")]

    def research_runs(self) -> list[dict[str, str]]:
        lines = self.audit.read_text().splitlines() if self.audit.exists() else []
        return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("migrated-fleet")
    store, namespace = _store_url("redis", workdir)  # skips without Redis (fails under CI)
    env = {
        "MRTR_STATE_KEY": new_key(),
        "MRTR_STORE": store,
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(workdir / "research.jsonl"),
    }
    specs = [ServerSpec(label, env | {"MRTR_INSTANCE": label}, SERVE, "migrated ready:") for label in "AB"]
    with spawn_servers(specs, workdir) as servers:
        fleet = Fleet(servers, workdir / "research.jsonl")
        yield fleet
        for label, server in servers.items():  # whatever the tests did, no server may have crashed
            if label not in fleet.killed:
                assert server.process.poll() is None, f"server {label} died:\n{server.log()}"
                assert "Traceback" not in server.log(), server.log()


# -- the client's side: the scripted LLM and user of `migrated/llm.py` ------------------------------


def model_answer(params: t.CreateMessageRequestParams) -> t.CreateMessageResult | t.CreateMessageResultWithTools:
    wire = llm.answer(params.model_dump(mode="json", by_alias=True, exclude_none=True))
    if isinstance(wire["content"], list):
        return t.CreateMessageResultWithTools.model_validate(wire)
    return t.CreateMessageResult.model_validate(wire)


def user_answer(params: t.ElicitRequestParams) -> t.ElicitResult:
    assert isinstance(params, t.ElicitRequestFormParams)
    schema = params.requested_schema
    content = llm.user(params.message, schema if isinstance(schema, dict) else schema.model_dump(by_alias=True))
    return t.ElicitResult(action="decline") if content is None else t.ElicitResult(action="accept", content=content)


def text_of(result: t.CallToolResult) -> str:
    assert not result.is_error, result
    return cast(t.TextContent, result.content[0]).text


# -- fastmcp.Client: inline rounds across both instances ------------------------------------------


async def test_fastmcp_client_runs_both_servers_inline_across_instances(fleet: Fleet) -> None:
    balancer = Alternating(fleet.ports())

    def factory(**options: Any) -> httpx2.AsyncClient:
        return balanced_http(balancer, **{k: v for k, v in options.items() if v is not None})

    async def sample(messages: Any, params: t.CreateMessageRequestParams, context: Any) -> Any:
        return model_answer(params)

    async def elicit(message: str, response_type: Any, params: Any, context: Any) -> FastMCPElicitResult[Any]:
        answer = user_answer(params)
        return FastMCPElicitResult(action=answer.action, content=answer.content)

    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    handlers: dict[str, Any] = {"sampling_handler": sample, "elicitation_handler": elicit}
    capabilities = t.SamplingCapability(tools=t.SamplingToolsCapability())
    async with asyncio.timeout(TIMEOUT):
        talks = StreamableHttpTransport(fleet.url("talks"), httpx_client_factory=factory)
        async with FastMCPClient(talks, timeout=20.0, **handlers) as client:
            matched = await client.call_tool("match_talks", {"topic": "Typed Python"})
        research = StreamableHttpTransport(fleet.url("research"), httpx_client_factory=factory)
        client = FastMCPClient(
            research, timeout=20.0, sampling_capabilities=capabilities, progress_handler=on_progress, **handlers
        )
        async with client:
            report = await client.call_tool("research_deep", {"query": "cars"})
    assert matched.structured_content == TALKS_RESULT
    assert report.content[0].text == REPORT  # type: ignore[union-attr]
    assert "researching" in progress  # Progress.set_message, reported through the flow's context
    assert {"A", "B"} <= set(balancer.served), balancer.served


# -- FlowClient: durable tasks, sampling with tools ------------------------------------------------


async def test_flowclient_runs_both_servers_as_tasks_answering_sampling_with_tools(fleet: Fleet) -> None:
    balancer = Alternating(fleet.ports())
    statuses: list[str] = []

    async def sample(params: t.CreateMessageRequestParams) -> Any:
        return model_answer(params)

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        return user_answer(params)

    def on_task(snapshot: TaskSnapshot) -> None:
        statuses.append(snapshot.status)

    options: dict[str, Any] = {"elicit": elicit, "sample": sample, "tasks": True, "on_task": on_task}
    async with asyncio.timeout(TIMEOUT), balanced_http(balancer) as http:
        async with FlowClient(fleet.url("talks"), http_client=http, **options) as flows:
            matched = await flows.call_tool("match_talks", {"topic": "Typed Python"})
        async with FlowClient(fleet.url("research"), http_client=http, sampling_tools=True, **options) as flows:
            report = await flows.call_tool("research_deep", {"query": "cars"})
    assert matched.structured_content == TALKS_RESULT
    assert text_of(report) == REPORT
    assert "input_required" in statuses and statuses[-1] == "completed"  # durable tasks, asking
    assert {"A", "B"} <= set(balancer.served), balancer.served


# -- mrtr call, as a script -------------------------------------------------------------------------


def test_mrtr_call_runs_both_servers_with_a_sampling_command_and_an_answers_file(fleet: Fleet, tmp_path: Path) -> None:
    answers = tmp_path / "answers.yaml"
    answers.write_text(
        yaml.safe_dump(
            {
                "Submit 'Typed Python' to PyCon FR (score 90/100)?": "accept",
                "Submit 'Typed Python' to DevFest Nantes (score 60/100)?": ":decline",
                "To sharpen the research on 'cars', please answer:": {"answer_1": "2020s", "answer_2": "EU"},
            }
        )
    )
    common = ["--answers", str(answers), "--sampling", f"json:{sys.executable} {LLM}", "--output", "json"]
    talks = run_mrtr("call", fleet.url("talks", "A"), "match_talks", "--arg", "topic=Typed Python", *common)
    research = run_mrtr("call", fleet.url("research", "B"), "research_deep", "--arg", "query=cars", *common)
    assert json.loads(talks.stdout)["structuredContent"] == TALKS_RESULT, talks.stderr
    assert json.loads(research.stdout)["content"][0]["text"] == REPORT, research.stderr
    assert "sampling (json) → tool_use ask_clarifying_questions" in research.stderr


def run_mrtr(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "mrtr.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


# -- a kill mid-task (last: it leaves one instance) ------------------------------------------------


async def test_a_research_task_survives_the_death_of_its_instance(fleet: Fleet) -> None:
    balancer = Alternating(fleet.ports())

    async def sample(params: t.CreateMessageRequestParams) -> Any:
        return model_answer(params)

    async def elicit(params: t.ElicitRequestParams) -> t.ElicitResult:
        return user_answer(params)

    before = len(fleet.research_runs())
    options: dict[str, Any] = {"elicit": elicit, "sample": sample, "tasks": True, "sampling_tools": True}
    async with (
        asyncio.timeout(TIMEOUT),
        balanced_http(balancer) as http,
        FlowClient(fleet.url("research"), http_client=http, **options) as flows,
    ):
        call = asyncio.create_task(flows.call_tool("research_deep", {"query": "trucks", "seconds": 30.0}))
        while not fleet.research_runs()[before:]:
            assert not call.done(), call.result()
            await asyncio.sleep(0.05)
        victim = fleet.research_runs()[before]["instance"]
        fleet.killed.add(victim)
        fleet.servers[victim].process.kill()  # SIGKILL, mid-research
        fleet.servers[victim].process.wait()
        report = await call
    survivor = "B" if victim == "A" else "A"
    runs = [(run["phase"], run["instance"]) for run in fleet.research_runs()[before:]]
    assert runs == [("start", victim), ("start", survivor), ("end", survivor)]  # adopted, and run again there
    assert text_of(report) == "## Report\nfindings on trucks (Which years?: 2020s / Which region?: EU)"
