"""The driver loop both clients of `benchmarks/fastmcp_tasks.py` share (standard library only).

A driver is a process that reads one JSON command per line on stdin and answers one JSON line
on stdout; it runs under fastmcp-tasks' venv (FastMCP's client, `fastmcp_tasks_peer.py drive`) or
ours (mrtr's FlowClient, `fastmcp_tasks.py --drive`), so this module imports neither FastMCP nor mrtr.

  {"op": "lat", "url": U, "tool": T}    one call on this driver's open client for U -> {"s": seconds}
  {"op": "load", "url": U, "tool": T, "clients": C, "warmup": W, "seconds": S}
                                        C loops, each on its own client; after W seconds prints
                                        {"phase": "start"} (the parent reads the server's CPU),
                                        then after S seconds {"done": calls finished in the window, ...}
  {"op": "quit"}
A failed command answers {"error": "..."}.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from contextlib import AsyncExitStack
from typing import Any


async def run_load(make: Any, call: Any, clients: int, warmup: float, seconds: float) -> None:
    """`clients` loops of `call`, each on its own client; counts calls that finish inside the window.

    Prints `{"phase": "start"}` when the window opens (the parent reads the server's CPU then) and
    the result when it closes (the parent reads it again); then each loop finishes the call it is
    in and closes its client (not cancelled mid-call: a client torn down mid-task may wait long).
    """
    done, errors, window, stop = 0, [], [0.0, 0.0], asyncio.Event()

    async def loop() -> None:
        nonlocal done
        try:
            async with make() as client:
                while not stop.is_set():
                    try:
                        await call(client)
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
                        await asyncio.sleep(0.05)
                        continue
                    if window[0] and time.perf_counter() <= window[1]:
                        done += 1
        except Exception as exc:  # the client could not even connect
            errors.append(f"{type(exc).__name__}: {exc}")

    tasks = [asyncio.create_task(loop()) for _ in range(clients)]
    try:
        await asyncio.sleep(warmup)
        window[:] = [time.perf_counter(), time.perf_counter() + seconds]
        emit({"phase": "start"})
        await asyncio.sleep(seconds)
        emit({"done": done, "s": seconds, "errors": len(errors), "first_error": errors[0] if errors else None})
    finally:
        stop.set()
        _, stuck = await asyncio.wait(tasks, timeout=60)
        for task in stuck:
            task.cancel()


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def drive(make_driver: Any) -> None:
    """Line-JSON commands on stdin, one answer line each: lat, load, quit."""
    async with AsyncExitStack() as stack:
        driver = make_driver(stack)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            op = cmd.pop("op")
            if op == "quit":
                return
            try:
                answer = await getattr(driver, op)(**cmd)
                if answer is not None:  # `load` has emitted its own lines
                    emit(answer)
            except Exception as exc:
                emit({"error": f"{type(exc).__name__}: {exc}"})


def serve_app(app: Any) -> None:
    """Serve `app` with uvicorn on a free 127.0.0.1 port (printed first), until the parent is gone.

    Both servers run it, each in its own venv: the one of this file's imports that is not the
    standard library is uvicorn, which both venvs have. IPPROTO_TCP is explicit so asyncio sets
    TCP_NODELAY on accepted sockets (see `benchmarks.benchkit.loopback_socket`).
    """
    import uvicorn

    parent = os.getppid()

    def watch() -> None:  # exit as soon as the benchmark that started us is gone
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
