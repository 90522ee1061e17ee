"""Interop matrix: foreign MCP clients run one mrtr flow to completion, and decline it, for real.

mrtr's claim is that a flow written once works with *any* conforming client, in both
protocol eras. In-process tests with our own client cannot show that: each cell here runs
a real client implementation against `tests/external/interop/server.py` as a separate process,
over loopback HTTP or stdio, and checks the exact final text and every question asked
(`tests/external/interop/scenario.py` is the script all clients answer from).

Clients: the official Python `mcp.Client` (in-process, our venv), the TypeScript SDK client
`@modelcontextprotocol/client` 2.4.0 under Node 22, and FastMCP's client (`fastmcp-slim` 4.1.8,
its own venv). Eras: 2026-07-28 (input_required rounds) and legacy 2025-11-25
(server→client requests inside one call). The foreign clients are installed on first use
(tests/external/interop/peers.py); that can take a minute on a cold machine, later runs reuse them.

A peer bug that blocks a cell is recorded on that cell as
`Cell(..., xfail="<peer> <version>: <precise bug>")` (a strict xfail: the day the peer is
fixed, the cell turns red so the mark gets removed). Without npx the TypeScript cells skip
locally but fail under CI (env `CI` set), so a CI machine without Node cannot pass silently.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import anyio
import mcp_types as t
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client

from tests.external.interop import peers, scenario
from tests.external.interop.peers import NodeRuntime, Report
from tests.support.servers import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

T = TypeVar("T")
Era = Literal["2026-07-28", "legacy"]
Transport = Literal["http", "stdio"]
VERSION_OF: dict[Era, str] = {"2026-07-28": "2026-07-28", "legacy": "2025-11-25"}
RUN_TIMEOUT = 60.0  # one client run, start to finish (a run takes ~1 s; stdio spawns a server too)


@dataclass(frozen=True)
class Cell:
    """Where and in which era one client runs the flow; `xfail` names a peer bug that blocks it."""

    transport: Transport
    era: Era
    xfail: str | None = None

    def params(self) -> Iterator[object]:
        marks = [pytest.mark.xfail(strict=True, reason=self.xfail)] if self.xfail else []
        for which in scenario.SCENARIOS:
            yield pytest.param(self, which, marks=marks, id=f"{self.transport}-{self.era}-{which}")


def matrix(*cells: Cell) -> list[object]:
    return [param for cell in cells for param in cell.params()]


ALL_CELLS = (
    Cell("stdio", "2026-07-28"),
    Cell("http", "2026-07-28"),
    Cell("stdio", "legacy"),
    Cell("http", "legacy"),
)
# Per client, so a peer bug can be pinned on exactly the cells it breaks.
PYTHON_CELLS = ALL_CELLS
TYPESCRIPT_CELLS = ALL_CELLS
FASTMCP_CELLS = ALL_CELLS


def check(report: Report, era: Era, which: scenario.Scenario) -> None:
    """The cell passes only if the client negotiated the era, saw every question once, and got the exact result."""
    assert report.protocol_version == VERSION_OF[era]
    assert scenario.same_asks(report.asked, which), (report.asked, scenario.expected_asks(which))
    assert (report.is_error, report.text) == scenario.expected_result(which)


# -- fixtures: the server, the foreign clients -------------------------------------------------


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One HTTP fixture server for every HTTP cell; it must survive them all without a traceback."""
    with peers.http_server(tmp_path_factory.mktemp("interop")) as server:
        yield server
        assert server.process.poll() is None, f"the interop server died:\n{server.log()}"
        assert "Traceback" not in server.log(), server.log()


def installed(ensure: Callable[[], T], cells: str) -> T:
    """A foreign client, installed on first use; missing its runtime: skipped, or failed under CI."""
    try:
        return ensure()
    except peers.PeerUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (CI is set: {cells} must run)")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def ts_client() -> NodeRuntime:
    """Node 22 + the pinned TS client, installed once per session (npm ci), or skipped/failed without npx."""
    return installed(peers.ensure_ts_client, "the TypeScript interop cells")


@pytest.fixture(scope="session")
def fastmcp_python() -> Path:
    """FastMCP's own venv: its dependency tree must never touch ours (install errors fail the cells)."""
    return peers.ensure_fastmcp()


def target_args(cell: Cell, http_server: ServerProcess) -> list[str]:
    """A client script's first argument: the server URL, or `stdio` (the command follows `--`, see `stdio_tail`)."""
    return [http_server.url] if cell.transport == "http" else ["stdio"]


def stdio_tail(cell: Cell) -> list[str]:
    """For stdio cells, `-- <command>`: the foreign client spawns our interpreter running the fixture server."""
    return ["--", *peers.stdio_command()] if cell.transport == "stdio" else []


async def run_foreign(argv: list[str]) -> Report:
    """Run a client script (bounded, killed on timeout) and read its JSON report."""
    with anyio.fail_after(RUN_TIMEOUT):
        done = await anyio.run_process(argv, check=False, env=peers.foreign_env(), stdin=subprocess.DEVNULL)
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    report = peers.parse_report(stdout, stderr, done.returncode)
    assert "Traceback" not in stderr, stderr  # a stdio server's stderr reaches us through the client
    return report


# -- the official Python client (in-process) ---------------------------------------------------


@dataclass
class OfficialAnswers:
    """`mcp.Client` callbacks answering from the scenario; they serve both eras unchanged."""

    which: scenario.Scenario
    asked: list[str]

    async def elicit(self, context: ClientRequestContext, params: t.ElicitRequestParams) -> t.ElicitResult:
        self.asked.append(params.message)
        return t.ElicitResult.model_validate(scenario.elicit_answer(self.which, params.message))

    async def sample(
        self, context: ClientRequestContext, params: t.CreateMessageRequestParams
    ) -> t.CreateMessageResult:
        self.asked.append(scenario.SAMPLE)
        content = params.messages[0].content
        prompt = content.text if isinstance(content, t.TextContent) else repr(content)
        text = t.TextContent(type="text", text=scenario.sample_answer(prompt))
        return t.CreateMessageResult(role="assistant", content=text, model="interop-model")

    async def roots(self, context: ClientRequestContext) -> t.ListRootsResult:
        self.asked.append(scenario.ROOTS)
        return t.ListRootsResult(roots=[t.Root(uri=scenario.ROOT_URI, name=scenario.ROOT_NAME)])


@pytest.mark.parametrize(("cell", "which"), matrix(*PYTHON_CELLS))
async def test_official_python_client(
    cell: Cell, which: scenario.Scenario, http_server: ServerProcess, tmp_path: Path
) -> None:
    answers = OfficialAnswers(which, [])
    with anyio.fail_after(RUN_TIMEOUT):
        async with AsyncExitStack() as stack:
            if cell.transport == "http":
                target: object = http_server.url
            else:
                errlog = stack.enter_context((tmp_path / "stdio-server.log").open("w"))
                command, *args = peers.stdio_command()
                target = stdio_client(StdioServerParameters(command=command, args=args), errlog=errlog)
            client = await stack.enter_async_context(
                Client(
                    target,  # type: ignore[arg-type]
                    mode="legacy" if cell.era == "legacy" else "auto",
                    elicitation_callback=answers.elicit,
                    sampling_callback=answers.sample,
                    list_roots_callback=answers.roots,
                )
            )
            result = await client.call_tool(scenario.TOOL, {"store": scenario.STORE})
            version = client.protocol_version
    text = "".join(block.text for block in result.content if isinstance(block, t.TextContent))
    check(Report(version, bool(result.is_error), text, answers.asked), cell.era, which)
    if cell.transport == "stdio":
        assert "Traceback" not in (log := (tmp_path / "stdio-server.log").read_text()), log


# -- the TypeScript SDK client (Node 22, npm-installed) ----------------------------------------


@pytest.mark.parametrize(("cell", "which"), matrix(*TYPESCRIPT_CELLS))
@pytest.mark.needs_node
async def test_typescript_sdk_client(
    cell: Cell, which: scenario.Scenario, http_server: ServerProcess, ts_client: NodeRuntime
) -> None:
    argv = ts_client.command(*target_args(cell, http_server), which, cell.era, *stdio_tail(cell))
    check(await run_foreign(argv), cell.era, which)


# -- FastMCP's client (its own venv) -----------------------------------------------------------


@pytest.mark.parametrize(("cell", "which"), matrix(*FASTMCP_CELLS))
async def test_fastmcp_client(
    cell: Cell, which: scenario.Scenario, http_server: ServerProcess, fastmcp_python: Path
) -> None:
    mode = "legacy" if cell.era == "legacy" else "auto"
    argv = [str(fastmcp_python), str(peers.FASTMCP_SCRIPT), *target_args(cell, http_server), which, mode]
    check(await run_foreign([*argv, *stdio_tail(cell)]), cell.era, which)


# -- fast-agent, a host answering without a person (its own Python 3.12 venv) --------------------


@pytest.fixture(scope="session")
def fastagent_python() -> Path:
    """fast-agent's venv, or skipped (failed under CI) when no Python 3.12 is installed."""
    return installed(peers.ensure_fastagent, "the fast-agent interop cells")


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])
async def test_fast_agent_samples_and_cancels_without_a_person(
    era: Era, http_server: ServerProcess, fastagent_python: Path
) -> None:
    """Its `passthrough` model answers the sampling (the reply is the prompt); its `auto-cancel`
    elicitation mode cancels the form, which the flow catches and names."""
    mode = "modern" if era == "2026-07-28" else "legacy"
    report = await run_foreign([str(fastagent_python), str(peers.FASTAGENT_SCRIPT), http_server.url, mode])
    assert report.protocol_version == VERSION_OF[era]
    said = scenario.echo_prompt("ping")  # passthrough: the model's reply is the prompt it was sent
    expected = scenario.echo_text(said, "not kept: the user cancelled the question")
    assert (report.is_error, report.text) == (False, expected)


# -- a Node client on the Vercel AI SDK's `@ai-sdk/mcp` -----------------------------------------


@pytest.fixture(scope="session")
def aisdk_client() -> tuple[Path, str]:
    """Node 22 + the pinned `@ai-sdk/mcp`, or skipped (failed under CI) without npx."""
    return installed(peers.ensure_aisdk, "the @ai-sdk/mcp interop cells")


async def run_aisdk(aisdk_client: tuple[Path, str], http_server: ServerProcess) -> Report:
    node, _ = aisdk_client
    return await run_foreign([str(node), str(peers.AISDK_CLIENT), http_server.url])


@pytest.mark.needs_node
async def test_ai_sdk_client_answers_a_form_on_the_legacy_era(
    aisdk_client: tuple[Path, str], http_server: ServerProcess
) -> None:
    """It speaks 2025-11-25 only, so the form reaches it as a server-to-client request: answered."""
    report = await run_aisdk(aisdk_client, http_server)
    assert report.protocol_version == VERSION_OF["legacy"]
    assert report.asked == [scenario.keep_question("ping")], "the one question, asked once"
    assert (report.is_error, report.text) == (False, scenario.keep_text("ping", "kept"))


@pytest.mark.xfail(
    strict=True,
    reason="@ai-sdk/mcp 1.0.102 speaks only 2025-11-25 (LATEST_PROTOCOL_VERSION, the initialize handshake): "
    "it never sends a 2026-07-28 request, so it never meets an input_required result",
)
@pytest.mark.needs_node
async def test_ai_sdk_client_on_2026_07_28(aisdk_client: tuple[Path, str], http_server: ServerProcess) -> None:
    report = await run_aisdk(aisdk_client, http_server)
    assert report.protocol_version == VERSION_OF["2026-07-28"]
