"""Listening vs polling for durable tasks, over HTTP, two instances sharing a store and a fleet bus.

Used by `benchmarks/tasks.py` (section 4). A task is created on instance A and followed on
instance B, so every pushed state crosses the bus (Redis pub/sub or PostgreSQL NOTIFY):

- poll: `tasks/get` on B every POLL seconds (the server's `pollIntervalMs`) until the state shows;
- listen after create: once `tools/call` has answered, `subscriptions/listen` on B with
  `notifications.taskIds` and mrtr's snapshot opt-in, read until the state arrives (what
  `mrtr.client._watch.TaskFeed` does for a task whose key it did not pick);
- listen ahead: one stream on B opened before the tasks exist, with mrtr's `mrtr/taskKeys` for a
  batch of BATCH idempotency keys; each task is created with the next key and its states come on
  that stream (what `FlowClient` does: `mrtr.client._ahead`). The next batch's stream is opened
  untimed when one runs out (the client opens it in the background before that).

Timed from sending `tools/call` to seeing the state (and, ahead, to the `tools/call` answer too,
as a client returns only then): `completed` (a one-step task) and `input_required` (a task
that asks after one step). Requests per task count every HTTP request the client sent for it:
a stream of its own counts as one, a batch stream as one shared by the BATCH tasks it watched
(all the run's tasks, warm-up included, divide the streams). Both clients speak raw HTTP/1.1
on keep-alive sockets (each listen on a socket of its own), so the numbers are server and
network.
Bus delivery latency is measured between two bus objects in this process on the same broker:
publish on A -> listener on B.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from benchkit import mcp_post
from mcp.shared.subscriptions import ResourceUpdated

import mrtr

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "mrtr-bench-listen", "version": "0.1.0"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}, "extensions": {TASKS_EXTENSION: {}}},
}
TIMEOUT = 30.0
BATCH = 64  # keys per listen-ahead stream (mrtr.client._ahead.BATCH)


class Conn:
    """One keep-alive HTTP/1.1 connection: JSON requests, or one SSE listen stream."""

    def __init__(self, url: str) -> None:
        hostport, _, path = url.removeprefix("http://").partition("/")
        host, _, port = hostport.partition(":")
        self.host, self.port, self.path = host, int(port or 80), "/" + path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.sent = 0

    async def open(self) -> Conn:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def _send(self, method: str, params: dict[str, Any], name: str | None) -> None:
        assert self.writer is not None
        self.sent += 1
        params = {**params, "_meta": {**params.get("_meta", {}), **META}}
        self.writer.write(mcp_post(self.host, self.port, self.path, self.sent, method, params, name))

    async def _head(self) -> dict[str, str]:
        assert self.reader is not None
        status = await self.reader.readline()
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected response {status!r}")
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        return headers

    async def request(self, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        assert self.reader is not None
        self._send(method, params, name)
        async with asyncio.timeout(TIMEOUT):
            headers = await self._head()
            message = json.loads(await self.reader.readexactly(int(headers["content-length"])))
        if "error" in message:
            raise RuntimeError(f"{method} failed: {message['error']}")
        return message["result"]  # type: ignore[no-any-return]

    async def listen(self, notifications: dict[str, Any]) -> Callable[[], Awaitable[dict[str, Any]]]:
        """Open a listen stream on this connection; returns `next_frame()` (JSON-RPC messages in order)."""
        assert self.reader is not None
        reader = self.reader
        self._send("subscriptions/listen", {"notifications": notifications}, None)
        headers = await self._head()
        if "event-stream" not in headers.get("content-type", ""):
            raise RuntimeError(f"listen answered {headers}")
        chunked = headers.get("transfer-encoding") == "chunked"
        buffer = b""

        async def next_frame() -> dict[str, Any]:
            nonlocal buffer
            while True:
                event, sep, rest = buffer.partition(b"\r\n\r\n" if b"\r\n\r\n" in buffer else b"\n\n")
                if sep:
                    buffer = rest
                    data = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
                    if data:
                        return json.loads(data)  # type: ignore[no-any-return]
                    continue
                if chunked:
                    size = int((await reader.readline()).strip() or b"0", 16)
                    if size == 0:
                        raise RuntimeError("the listen stream ended")
                    buffer += (await reader.readexactly(size + 2))[:-2]  # the chunk, without its CRLF
                else:
                    buffer += await reader.read(65536)

        return next_frame


@dataclass
class Variant:
    times: list[float] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)


async def _create(a: Conn, tool: str, key: str | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    params: dict[str, Any] = {"name": tool, "arguments": {"item": "x"}}
    if key is not None:
        params["_meta"] = {"mrtr/idempotencyKey": key}
    created = await a.request("tools/call", params, name=tool)
    return start, created["taskId"]


async def _poll(a: Conn, b: Conn, tool: str, status: str, poll: float) -> tuple[float, int, str]:
    start, task_id = await _create(a, tool)
    for polls in range(1, 2000):
        await asyncio.sleep(poll)
        task = await b.request("tasks/get", {"taskId": task_id}, name=task_id)
        if task["status"] == status:
            return time.perf_counter() - start, 1 + polls, task_id
    raise RuntimeError(f"task {task_id} never reached {status}")


async def _listen(a: Conn, b_url: str, tool: str, status: str) -> tuple[float, int, str]:
    start, task_id = await _create(a, tool)
    stream = await Conn(b_url).open()
    try:
        next_frame = await stream.listen({"taskIds": [task_id], "mrtr/taskSnapshots": True})
        async with asyncio.timeout(TIMEOUT):
            while True:
                frame = await next_frame()
                if frame.get("method") == "notifications/tasks" and frame["params"]["status"] == status:
                    return time.perf_counter() - start, 2, task_id
                if "error" in frame:
                    raise RuntimeError(f"listen failed: {frame['error']}")
    finally:
        stream.close()


class Ahead:
    """A listen stream on B watching the tasks a batch of keys will create (`mrtr/taskKeys`)."""

    def __init__(self, url: str, tool: str) -> None:
        self.url, self.tool = url, tool
        self.unused: list[tuple[str, str]] = []
        self.seen: dict[tuple[str, str], float] = {}  # (task id, status) -> when it arrived
        self.arrived = asyncio.Event()
        self.streams: list[tuple[Conn, asyncio.Task[None]]] = []
        self.tasks = 0

    async def refill(self) -> None:
        """Open the next batch's stream (untimed) when this one has no key left."""
        if self.unused:
            return
        keys = [secrets.token_urlsafe(16) for _ in range(BATCH)]
        conn = await Conn(self.url).open()
        notifications = {"mrtr/taskKeys": [{"tool": self.tool, "key": k} for k in keys], "mrtr/taskSnapshots": True}
        next_frame = await conn.listen(notifications)
        ack = await next_frame()
        pairs = ack.get("params", {}).get("notifications", {}).get("mrtr/taskKeys")
        if not isinstance(pairs, list) or len(pairs) != BATCH:
            raise RuntimeError(f"the server did not watch the keys ahead: {ack}")
        self.unused = [(p["key"], p["taskId"]) for p in reversed(pairs)]
        self.streams.append((conn, asyncio.get_running_loop().create_task(self._read(next_frame))))

    async def _read(self, next_frame: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        while True:
            frame = await next_frame()
            if frame.get("method") == "notifications/tasks":
                self.seen.setdefault((frame["params"]["taskId"], frame["params"]["status"]), time.perf_counter())
                self.arrived.set()
            elif "error" in frame:
                raise RuntimeError(f"listen failed: {frame['error']}")

    async def run(self, a: Conn, status: str) -> tuple[float, int, str]:
        await self.refill()
        key, task_id = self.unused.pop()
        self.tasks += 1
        start, created = await _create(a, self.tool, key)
        if created != task_id:
            raise RuntimeError(f"created {created}, the acknowledgement promised {task_id}")
        async with asyncio.timeout(TIMEOUT):
            while (task_id, status) not in self.seen:
                if any(reader.done() for _, reader in self.streams):
                    raise RuntimeError("a listen-ahead stream ended")
                self.arrived.clear()
                await self.arrived.wait()
        return max(self.seen[task_id, status], time.perf_counter()) - start, 1, task_id

    def close(self) -> None:
        for conn, reader in self.streams:
            reader.cancel()
            conn.close()

    @property
    def stream_share(self) -> float:
        """The batch streams' requests, shared by every task created on them."""
        return len(self.streams) / max(self.tasks, 1)


async def _answer(conn: Conn, task_id: str) -> None:
    """Answer the task's question and wait until it has completed, so no variant is timed while it runs."""
    task = await conn.request("tasks/get", {"taskId": task_id}, name=task_id)
    answers = {key: {"action": "accept", "content": {"go": True}} for key in task.get("inputRequests") or {}}
    await conn.request("tasks/update", {"taskId": task_id, "inputResponses": answers}, name=task_id)
    async with asyncio.timeout(TIMEOUT):
        while (await conn.request("tasks/get", {"taskId": task_id}, name=task_id))["status"] != "completed":
            await asyncio.sleep(0.002)


async def measure(
    a_url: str, b_url: str, *, tool: str, ask_tool: str, poll: float, n: int, warmup: int
) -> dict[str, Variant]:
    """Interleave the six variants round-robin (order rotating each cycle); `warmup` cycles untimed."""
    a, b, admin = await Conn(a_url).open(), await Conn(b_url).open(), await Conn(a_url).open()
    ahead = {"completed": Ahead(b_url, tool), "input_required": Ahead(b_url, ask_tool)}
    variants: dict[str, Callable[[], Awaitable[tuple[float, int, str]]]] = {
        "poll completed": lambda: _poll(a, b, tool, "completed", poll),
        "listen completed": lambda: ahead["completed"].run(a, "completed"),
        "listen after create completed": lambda: _listen(a, b_url, tool, "completed"),
        "poll input_required": lambda: _poll(a, b, ask_tool, "input_required", poll),
        "listen input_required": lambda: ahead["input_required"].run(a, "input_required"),
        "listen after create input_required": lambda: _listen(a, b_url, ask_tool, "input_required"),
    }
    results = {name: Variant() for name in variants}
    names = list(variants)
    try:
        for cycle in range(warmup + n):
            turn = cycle % len(names)
            for name in names[turn:] + names[:turn]:
                elapsed, requests, task_id = await variants[name]()
                if "input_required" in name:
                    await _answer(admin, task_id)  # untimed: let it finish
                if cycle >= warmup:
                    results[name].times.append(elapsed)
                    results[name].requests.append(requests)
        for status, watcher in ahead.items():  # the batch streams' own requests, shared out
            shared = results[f"listen {status}"]
            shared.requests = [r + watcher.stream_share for r in shared.requests]
    finally:
        for conn in (a, b, admin):
            conn.close()
        for watcher in ahead.values():
            watcher.close()
    return results


async def bus_latency(url: str, n: int) -> list[float]:
    """Publish on bus A, time until a listener on bus B (same broker, same namespace) has it."""
    namespace = f"mrtr_bench_bus_{secrets.token_hex(4)}"
    a, b = mrtr.open_bus(url, namespace=namespace), mrtr.open_bus(url, namespace=namespace)
    arrived: dict[str, float] = {}
    b.subscribe(lambda event: arrived.setdefault(event.uri, time.perf_counter()))
    samples = []
    async with a, b:
        for i in range(n + 10):
            uri = f"res://{i}"
            start = time.perf_counter()
            await a.publish(ResourceUpdated(uri=uri))
            async with asyncio.timeout(5):
                while uri not in arrived:
                    await asyncio.sleep(0)
            if i >= 10:
                samples.append(arrived[uri] - start)
        drop = getattr(a, "drop", None)
        if drop is not None:
            with contextlib.suppress(Exception):
                await drop()
    return samples


def report(kind: str, results: dict[str, Variant], bus: list[float], poll: float) -> dict[str, float]:
    """Print section (4); returns the p50s (ms) and requests per task for the summary."""

    def p(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q) - 1] * 1e3 if len(values) > 1 else values[0] * 1e3

    print(
        f"  (4) Listening vs polling: create on instance A, follow on instance B ({kind} store and {kind} bus),"
        f" poll interval {poll * 1e3:g} ms"
    )
    print(f"      {'variant':<34} {'p50 ms':>8} {'p90 ms':>8} {'requests/task':>14}")
    summary: dict[str, float] = {}
    for name, variant in results.items():
        median = statistics.median(variant.times) * 1e3
        requests = statistics.mean(variant.requests)
        summary[name] = median
        summary[f"{name} requests"] = requests
        print(f"      {name:<34} {median:>8.2f} {p(variant.times, 90):>8.2f} {requests:>14.2f}")
    summary["bus"] = statistics.median(bus) * 1e3
    print(f"      bus delivery A -> listener on B: p50 {summary['bus']:.2f} ms, p90 {p(bus, 90):.2f} ms (n={len(bus)})")
    return summary


__all__ = ["Ahead", "Conn", "Variant", "bus_latency", "measure", "report"]
