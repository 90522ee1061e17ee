"""Serve an ASGI app for a test process: 127.0.0.1 only, a ready line once it really accepts.

Test servers run as subprocesses; their spawners wait for one stdout line carrying the URL,
so the port is bound before serving (port 0 picks a free one) and the line is printed only
after uvicorn has started, never before a client could connect.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp


async def serve_http(app: ASGIApp, port: int, ready_prefix: str, *, ready_suffix: str = "", path: str = "/mcp") -> None:
    """Run `app` on 127.0.0.1:`port` until stopped, printing `ready_prefix URL[ ready_suffix]`
    (URL: the endpoint at `path`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    runner = uvicorn.Server(config)
    serving = asyncio.create_task(runner.serve(sockets=[sock]))
    while not runner.started:
        if serving.done():
            await serving
            raise SystemExit("uvicorn did not start")
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}{path}"
    print(f"{ready_prefix} {url}{' ' + ready_suffix if ready_suffix else ''}", flush=True)
    await serving


def serve_main(app: Callable[[], ASGIApp], ready_prefix: str) -> None:
    """`python server.py [--port N]`: build the app, serve it, print the ready line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve_http(app(), args.port, ready_prefix))
