"""FastMCP's client as a cell of the mrtr interop matrix (runs in its own venv, see tests/external/test_interop.py).

Usage: .venv-fastmcp/bin/python fastmcp_client.py TARGET SCENARIO [MODE] [-- SERVER COMMAND...]
    TARGET: an http(s) URL (streamable HTTP), or "stdio" to spawn the server command after "--"
    SCENARIO: complete | decline      MODE: auto (default, the 2026-07-28 era) | legacy

Prints one JSON line, `{protocolVersion, isError, text, asked}` (or `{error}`, exit 1).

How FastMCP 4.1 drives MRTR (read from its installed source, `fastmcp/client/client.py`):
`call_tool`/`get_prompt`/`read_resource` send with `allow_input_required=True` and hand any
`InputRequiredResult` to the official SDK's `run_input_required_driver`
(`mcp.client._input_required`), dispatching each embedded request through the same
callbacks that serve legacy server→client requests. Those callbacks are FastMCP's
adapters around the handlers given to `Client(...)`:

- `elicitation_handler(message, response_type, params, context)`: `response_type` is a
  type built from the requested JSON schema; returning plain data means *accept*, returning
  an `ElicitResult` chooses the action (that is how a decline is said);
- `sampling_handler(messages, params, context)`: may return a bare string;
- `roots=`: a list of URIs (or a handler).

A handler that raises becomes an `ErrorData` and the SDK driver aborts the call with
`MCPError` instead of retrying. The rounds cap is `input_required_max_rounds` (default 10).

Only the standard library, FastMCP and `scenario.py` (imported by path) are used here: this
script must not depend on anything in the project's own venv.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import mcp_types
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp.client.transports import StdioTransport

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenario  # the shared answers, plain Python


async def run(target: str, which: scenario.Scenario, mode: str, server_command: list[str]) -> dict[str, Any]:
    """Run the flow once with FastMCP's public API and report what happened."""
    asked: list[str] = []

    async def elicit(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        answer = scenario.elicit_answer(which, message)
        if answer["action"] != "accept":
            return ElicitResult(action=answer["action"])
        # FastMCP's idiom: build the type it made from mrtr's requested schema (plain data means "accept").
        return response_type(**answer["content"])

    async def sample(messages: list[mcp_types.SamplingMessage], params: Any, context: Any) -> str:
        asked.append(scenario.SAMPLE)
        content = messages[0].content
        prompt = content.text if isinstance(content, mcp_types.TextContent) else repr(content)
        return scenario.sample_answer(prompt)

    async def roots(context: Any) -> list[mcp_types.Root]:
        asked.append(scenario.ROOTS)
        return [mcp_types.Root(uri=scenario.ROOT_URI, name=scenario.ROOT_NAME)]  # type: ignore[arg-type]

    transport: Any = target
    if target == "stdio":
        transport = StdioTransport(command=server_command[0], args=server_command[1:], keep_alive=False)
    client = Client(transport, elicitation_handler=elicit, sampling_handler=sample, roots=roots, mode=mode)  # type: ignore[arg-type]
    async with client:
        result = await client.call_tool(scenario.TOOL, {"store": scenario.STORE}, raise_on_error=False)
        version = client.session.protocol_version if hasattr(client.session, "protocol_version") else None
    text = "".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent))
    return {"protocolVersion": version, "isError": result.is_error, "text": text, "asked": asked}


def main() -> None:
    argv = sys.argv[1:]
    dashes = argv.index("--") if "--" in argv else len(argv)
    target, which, *rest = argv[:dashes]
    mode = rest[0] if rest else "auto"
    server_command = argv[dashes + 1 :]
    if which not in scenario.SCENARIOS or (target == "stdio" and not server_command):
        sys.exit(__doc__)
    try:
        report = asyncio.run(run(target, which, mode, server_command))  # type: ignore[arg-type]
    except BaseException as exc:  # report everything (ExceptionGroups too) as JSON for the test
        print(json.dumps({"error": f"{type(exc).__name__}: {exc!r}"}), flush=True)
        sys.exit(1)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
