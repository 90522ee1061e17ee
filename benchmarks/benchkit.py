"""What every benchmark here shares: statistics, server-side samples, loopback server processes.

Benchmarks run as scripts (`python benchmarks/rounds.py`), so this module is imported by
its plain name from the scripts' own directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import statistics
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.shared.inbound import encode_header_value

# -- statistics --------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def median_or_zero(values: Sequence[float] | None) -> float:
    return statistics.median(values) if values else 0.0


def ratio_ci(num: Sequence[float], den: Sequence[float], rng: random.Random, reps: int = 300) -> tuple[float, float]:
    """Bootstrap 95% interval of median(num)/median(den), resampling whole cycles (pairs)."""
    idx = range(len(num))
    ratios = []
    for _ in range(reps):
        sample = rng.choices(idx, k=len(num))
        ratios.append(statistics.median([num[i] for i in sample]) / statistics.median([den[i] for i in sample]))
    ratios.sort()
    return ratios[int(0.025 * reps)], ratios[int(0.975 * reps) - 1]


def drain(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    """Hand over a server's collected samples (seconds by label) and start afresh."""
    out = {key: list(values) for key, values in samples.items()}
    samples.clear()
    return out


# -- servers -----------------------------------------------------------------------------------


def loopback_socket(backlog: int = 128) -> socket.socket:
    """A listening socket on a free 127.0.0.1 port, for a benchmark server to serve on.

    IPPROTO_TCP is passed explicitly: asyncio sets TCP_NODELAY only on accepted sockets whose
    proto is TCP, and without it every keep-alive response stalls ~40 ms (Nagle + delayed ACK).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)  # connections queue in the backlog until uvicorn starts accepting
    return sock


@dataclass
class ServerProc:
    url: str
    pid: int


@contextlib.asynccontextmanager
async def server_processes(
    script: Path, args: Sequence[str], count: int, *, env: Mapping[str, str] | None = None, logdir: Path | None = None
) -> AsyncIterator[list[ServerProc]]:
    """Start `count` copies of `script --serve ARGS`; each prints its port first. Always killed.

    A server's stderr goes to `logdir/server-N.log` when given (shown if it fails to start).
    """
    argv = [sys.executable, str(script), "--serve", *args]
    procs: list[asyncio.subprocess.Process] = []
    drains: list[asyncio.Task[bytes]] = []
    logs: list[Path | None] = []
    try:
        for i in range(count):
            log = logdir / f"server-{i}.log" if logdir is not None else None
            logs.append(log)
            with log.open("wb") if log is not None else contextlib.nullcontext() as err:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *argv,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=err,
                        stdin=asyncio.subprocess.DEVNULL,
                        env=dict(env) if env is not None else None,
                    )
                )
        servers = []
        for proc, log in zip(procs, logs, strict=True):
            assert proc.stdout is not None
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            except TimeoutError:
                line = b""
            if not line.strip().isdigit():
                tail = log.read_text()[-3000:] if log is not None else ""
                raise RuntimeError(f"server did not report a port (got {line!r}); its log:\n{tail}")
            drains.append(asyncio.create_task(proc.stdout.read()))  # a full pipe must never block a server
            servers.append(ServerProc(f"http://127.0.0.1:{int(line)}/mcp", proc.pid))
        yield servers
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        for proc in procs:
            await asyncio.wait_for(proc.wait(), timeout=10)
        for task in drains:
            await asyncio.wait_for(task, timeout=10)


def mcp_post(
    host: str, port: int, path: str, request_id: int, method: str, params: dict[str, Any], name: str | None
) -> bytes:
    """One 2026-07-28 JSON-RPC request as raw HTTP/1.1 bytes (keep-alive; `Mcp-Name` when given)."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, separators=(",", ":")
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\n"
        "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
        f"mcp-protocol-version: 2026-07-28\r\nmcp-method: {method}\r\n"
        + (f"mcp-name: {encode_header_value(name)}\r\n" if name is not None else "")
        + f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body
