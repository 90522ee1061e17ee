"""One instance of the migrated fleet: both servers in one process, at /talks/mcp and /research/mcp.

`python tests/external/migrated/serve.py --port 0` prints `migrated ready: http://127.0.0.1:PORT/talks/mcp`
once it listens (the research server is the same URL with /research/). Each response carries
`X-Mrtr-Instance` (MRTR_INSTANCE).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from mrtr._host.instance import InstanceHeader  # noqa: E402
from tests.external.migrated import research_server, talks_server  # noqa: E402

READY = "migrated ready:"


def build() -> Starlette:
    talks, research = talks_server.mcp.http_app(), research_server.mcp.http_app()

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with talks.router.lifespan_context(talks), research.router.lifespan_context(research):
            yield

    app = Starlette(routes=[Mount("/talks", talks), Mount("/research", research)], lifespan=lifespan)
    app.add_middleware(InstanceHeader, name=os.environ.get("MRTR_INSTANCE", "?"))
    return app


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(build(), log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    runner = uvicorn.Server(config)
    serving = asyncio.create_task(runner.serve(sockets=[sock]))
    while not runner.started:
        if serving.done():
            await serving
            raise SystemExit("uvicorn did not start")
        await asyncio.sleep(0.01)
    print(READY, f"http://127.0.0.1:{sock.getsockname()[1]}/talks/mcp", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(main())
