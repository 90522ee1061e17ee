"""Client under test for the official MCP conformance suite (client mode), built on `mrtr.client.FlowClient`.

Usage (the harness appends the mock server's URL as the last argument and sets the scenario in
`MCP_CONFORMANCE_SCENARIO`, the protocol version in `MCP_CONFORMANCE_PROTOCOL_VERSION`):

    npx -y -p node@22.23.3 -p @modelcontextprotocol/conformance@0.2.0-alpha.11 conformance client \\
        --command ".venv/bin/python tests/external/conformance/client.py" --scenario sep-2322-client-request-state

Why this exists: scenario `sep-2322-client-request-state` grades a client's MRTR manners —
`requestState` echoed byte for byte and only when one was given, a new JSON-RPC id per retry,
nothing leaking into other calls, a missing `resultType` taken as complete. Those are exactly the
rules `FlowClient` promises, so this script drives the mock's four tools through it and adds
nothing of its own beyond answering the question and calling the unrelated tool *between* two
rounds (via the `on_round` hook). It also checks every tool's final text, so a client that
completes the wrong way exits non-zero even if the harness's own checks would not notice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

import mcp_types as t
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mrtr.client import FlowClient, Round

SCENARIO_ENV = "MCP_CONFORMANCE_SCENARIO"
VERSION_ENV = "MCP_CONFORMANCE_PROTOCOL_VERSION"


class ScenarioFailed(Exception):
    """The client saw something the scenario says it must not (reported, exit code 1)."""


def connect_mode() -> str:
    """Pin the era the harness asks for (2026-07-28 adopts directly, no discover probe needed)."""
    version = os.environ.get(VERSION_ENV, "")
    return version if version in MODERN_PROTOCOL_VERSIONS else "auto"


async def confirm_everything(params: t.ElicitRequestParams) -> t.ElicitResult:
    """The mock's only question is `confirm` ({confirmed: boolean}); the user says yes."""
    return t.ElicitResult(action="accept", content={"confirmed": True})


def text_of(result: t.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, t.TextContent))


def expect(result: t.CallToolResult, tool: str, text: str) -> None:
    if result.is_error or text_of(result) != text:
        raise ScenarioFailed(f"{tool}: expected {text!r}, got {result.model_dump(mode='json', exclude_none=True)}")


async def sep_2322_client_request_state(url: str) -> None:
    """Echo state across an unrelated call, omit absent state, treat a bare result as complete."""
    rounds: list[Round] = []

    async def between_rounds(round_: Round) -> None:
        rounds.append(round_)
        if round_.target == "test_mrtr_echo_state":
            # A parallel call in the middle of a flow: a fresh request, carrying neither the
            # flow's inputResponses nor its requestState.
            expect(await flows.call_tool("test_mrtr_unrelated", {}), "test_mrtr_unrelated", "unrelated-ok")

    flows = FlowClient(url, elicit=confirm_everything, mode=connect_mode(), on_round=between_rounds)
    async with flows:
        expect(await flows.call_tool("test_mrtr_echo_state", {}), "test_mrtr_echo_state", "echo-state-ok")
        expect(await flows.call_tool("test_mrtr_no_state", {}), "test_mrtr_no_state", "no-state-ok")
        expect(
            await flows.call_tool("test_mrtr_no_result_type", {}), "test_mrtr_no_result_type", "no-result-type-test-ok"
        )
    seen = [(r.target, r.had_state) for r in rounds]
    if seen != [("test_mrtr_echo_state", True), ("test_mrtr_no_state", False)]:
        raise ScenarioFailed(f"expected one round per MRTR tool (echo with state, no_state without), saw {seen}")


def leaves(exc: BaseException) -> list[BaseException]:
    """The real errors inside (possibly nested) exception groups: the SDK client's task group wraps them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


SCENARIOS: dict[str, Callable[[str], Awaitable[None]]] = {
    "sep-2322-client-request-state": sep_2322_client_request_state,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the scenario's mock server, e.g. http://localhost:PORT/mcp")
    args = parser.parse_args(argv)
    scenario = os.environ.get(SCENARIO_ENV, "")
    run = SCENARIOS.get(scenario)
    if run is None:
        print(f"unsupported scenario {scenario!r} (supported: {', '.join(SCENARIOS)})", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(args.url))
    except Exception as exc:  # any failure or crash fails the scenario; say exactly what it was
        for leaf in leaves(exc):
            print(f"{scenario}: FAILED: {type(leaf).__name__}: {leaf}", file=sys.stderr)
        return 1
    print(f"{scenario}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
