"""The MRTR fixtures of the official MCP conformance suite, served by FastMCP through `mrtr.fastmcp`.

Usage:
    python tests/external/conformance/fastmcp_server.py --port PORT   # http://127.0.0.1:PORT/mcp (0: any free port)

Why this exists: tests/external/conformance/server.py proves the 14 `input-required-result-*`
(MRTR) scenarios against mrtr flows on the SDK's `MCPServer`. This file registers the very
same flows (`add_mrtr_fixtures`, imported, not copied: same code, same wire keys, same
`allow_preanswer`) with `mrtr.fastmcp.Flows` on a `fastmcp.FastMCP` app served by uvicorn
(`mcp.http_app()`), so a passing run is evidence that mrtr's FastMCP host speaks MRTR as the
suite defines it. Only the MRTR fixtures are here: the other scenarios (content types, tasks,
SEP-2575 diagnostics...) are about the SDK fixture server, not about mrtr on FastMCP, and
durable tasks are not available on FastMCP yet.

Once listening, the process prints one line `READY_PREFIX URL` on stdout, as server.py does
(tests/external/conformance/harness.py spawns either the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from fastmcp import FastMCP  # noqa: E402
from mcp.server.request_state import RequestStateSecurity  # noqa: E402

import mrtr  # noqa: E402
import mrtr.fastmcp  # noqa: E402
from tests.external.conformance.server import add_mrtr_fixtures  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

SERVER_NAME = "mrtr-fastmcp-conformance-fixtures"
SERVER_VERSION = mrtr.__version__
READY_PREFIX = "mrtr fastmcp conformance fixtures ready:"
"""First stdout line once uvicorn listens, followed by the URL (see tests/external/conformance/harness.py)."""


def build_server() -> FastMCP[Any]:
    """A FastMCP app with the MRTR fixtures; a fresh process-local key seals each `requestState`."""
    mcp: FastMCP[Any] = FastMCP(
        SERVER_NAME, version=SERVER_VERSION, request_state_security=RequestStateSecurity.ephemeral()
    )
    add_mrtr_fixtures(mrtr.fastmcp.Flows(mcp))
    return mcp


async def serve(mcp: FastMCP[Any], port: int) -> None:
    """Serve on 127.0.0.1:`port` (0 = any free port), print the ready line, run until killed.

    `stateless_http=True`, as for server.py: the suite speaks 2026-07-28 only, whose requests
    are self-contained POSTs; every round's state rides in the sealed `requestState`.
    """
    await serve_http(mcp.http_app(stateless_http=True), port, READY_PREFIX)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    # Nothing to close on the way out (no store, no task runtime): SIGTERM's default is fine.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(build_server(), args.port))


if __name__ == "__main__":
    main()
