"""One instance of the migrated fleet: both servers in one process, at /talks/mcp and /research/mcp.

`python tests/external/migrated/serve.py --port 0` prints `migrated ready: http://127.0.0.1:PORT/talks/mcp`
once it listens (the research server is the same URL with /research/). Each response carries
`X-Mrtr-Instance` (MRTR_INSTANCE).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from mrtr._host.instance import InstanceHeader  # noqa: E402
from tests.external.migrated import research_server, talks_server  # noqa: E402
from tests.support.serving import serve_http  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve_http(build(), parser.parse_args().port, READY, path="/talks/mcp"))


if __name__ == "__main__":
    main()
