"""Task push under load, across a fleet: the driver of issue 40's fleet test and of `benchmarks/fleet_push.py`.

Three real task servers (`task_server.py`) share one store and one fleet bus. Listeners on
instance A watch, with `mrtr/taskKeys` (streams opened before the tasks exist), tasks that
are created and answered on B and C. Each task is the `pipeline` flow: created (`working`),
it asks a question (`input_required`), is answered (`working`) and completes: four state
changes, all committed on B or C, all pushed to A through the bus.

The driver answers each question when A's listener hears it, so a question that never
reaches A stalls its task: every state is either pushed or the run does not finish. A stream
that ends is opened again with the same keys and `mrtr/taskSnapshots` (the client's refetch).

Latency is read from A's bus (`bus_lags`: from `publish` on B or C to delivery to A's
listeners, one host's clock). The tasks' `lastUpdatedAt` will not do: each instance stamps it
by its estimate of the store's clock, a few milliseconds off under load.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from tests.support import buskit
from tests.support.servers import SUPPORT, ServerProcess, ServerSpec, spawn_servers

SERVER = SUPPORT / "task_server.py"
READY = "task-server ready:"
CHANGES_PER_TASK = 4  # working, input_required, working, completed
PER_STREAM = 64  # keys one listen stream on A watches


@contextmanager
def push_fleet(
    workdir: Path, broker: str, options: Mapping[str, Mapping[str, Any]] | None = None
) -> Iterator[tuple[dict[str, ServerProcess], str]]:
    """A, B and C on `broker` (store and bus, one fresh namespace); `options` are bus options per label.

    Yields the servers and the namespace (the caller drops it afterwards).
    """
    namespace = f"mrtr_push_{secrets.token_hex(4)}"
    env = {
        "MRTR_STATE_KEY": secrets.token_hex(32),
        "MRTR_STORE": broker,
        "MRTR_STORE_NAMESPACE": namespace,
        "MRTR_AUDIT": str(workdir / "audit.jsonl"),
        "MRTR_BUS": broker,
        "MRTR_LEASE": "5.0",  # no task is taken over by a busy neighbour in the middle of a run
    }
    # A only listens: its scanner (every 120 s) never takes up a task B or C left runnable for a moment.
    scans = {"A": "120", "B": "0.2", "C": "0.2"}
    specs = [
        ServerSpec(
            label,
            env
            | {
                "MRTR_INSTANCE": label,
                "MRTR_BUS_OPTIONS": json.dumps(dict((options or {}).get(label, {}))),
                "MRTR_SCAN_INTERVAL": scans[label],
            },
            SERVER,
            READY,
        )
        for label in ("A", "B", "C")
    ]
    with spawn_servers(specs, workdir) as servers:
        yield servers, namespace


@dataclass
class Seen:
    """What A's listeners know of one task."""

    creator: str
    version: int = -1
    status: str = ""
    answered: bool = False


@dataclass
class Outcome:
    tasks: dict[str, Seen]
    started: float
    finished: float
    streams_opened: int
    streams_ended: int
    errors: list[str]

    @property
    def seconds(self) -> float:
        return self.finished - self.started


class Driver:
    """Creates `count` pipeline tasks on B and C (alternately) and follows them from A."""

    def __init__(
        self,
        a: str,
        creators: list[str],
        count: int,
        *,
        rate: float | None,
        concurrency: int = 24,
    ) -> None:
        self.a, self.creators, self.count = a, creators, count
        self.rate = rate  # tasks per second; None: as fast as `concurrency` allows
        self.concurrency = concurrency
        self.keys = [f"push-{i}-{secrets.token_hex(6)}" for i in range(count)]
        self.ids: dict[str, str] = {}  # key -> task id (from the acknowledgement)
        self.seen: dict[str, Seen] = {}
        self.errors: list[str] = []
        self.opened = self.ended = 0
        self.progress = asyncio.Event()
        self.answering: set[asyncio.Task[None]] = set()
        self.http = httpx2.AsyncClient(
            trust_env=False, timeout=httpx2.Timeout(30.0), limits=httpx2.Limits(max_connections=64)
        )

    async def run(self, deadline: float) -> Outcome:
        chunks = [self.keys[i : i + PER_STREAM] for i in range(0, self.count, PER_STREAM)]
        acked = [asyncio.Event() for _ in chunks]
        async with asyncio.TaskGroup() as group:
            listeners = [
                group.create_task(self._listen(chunk, ready)) for chunk, ready in zip(chunks, acked, strict=True)
            ]
            for ready in acked:
                await asyncio.wait_for(ready.wait(), 30)
            started = time.time()
            try:
                await self._create_all()
                async with asyncio.timeout(max(deadline - time.monotonic(), 1.0)):
                    while not self._all_completed():
                        self.progress.clear()
                        await self.progress.wait()
            except TimeoutError:
                self.errors.append(f"not every task completed in time: {self._summary()}")
            finished = time.time()
            for listener in [*listeners, *self.answering]:
                listener.cancel()
        await self.http.aclose()
        return Outcome(self.seen, started, finished, self.opened, self.ended, self.errors)

    def _all_completed(self) -> bool:
        return len(self.seen) == self.count and all(s.status == "completed" for s in self.seen.values())

    def _summary(self) -> str:
        statuses: dict[str, int] = {}
        for seen in self.seen.values():
            statuses[seen.status] = statuses.get(seen.status, 0) + 1
        return f"{len(self.seen)}/{self.count} created, last states heard on A: {statuses}"

    async def _create_all(self) -> None:
        gate = asyncio.Semaphore(self.concurrency)
        start = time.monotonic()

        async def create(index: int) -> None:
            try:
                key = self.keys[index]
                creator = self.creators[index % len(self.creators)]
                self.seen.setdefault(self.ids[key], Seen(creator))
                params = {"name": "pipeline", "arguments": {"job": f"p{index}", "slow": 0}, "_meta": {}}
                params["_meta"]["mrtr/idempotencyKey"] = key  # so a retried call is the same task
                reply = await self._call(creator, "tools/call", params)
                if reply.get("result", {}).get("taskId") != self.ids[key]:
                    self.errors.append(f"tools/call for {key} answered {reply}")
            finally:
                gate.release()

        async with asyncio.TaskGroup() as group:
            for index in range(self.count):
                if self.rate is not None:
                    delay = start + index / self.rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await gate.acquire()
                group.create_task(create(index))

    async def _listen(self, keys: list[str], acked: asyncio.Event) -> None:
        """One stream on A for `keys`, opened again (with snapshots: a refetch) whenever it ends."""
        notifications = {"mrtr/taskKeys": [{"tool": "pipeline", "key": k} for k in keys], "mrtr/taskSnapshots": True}
        body = {
            "jsonrpc": "2.0",
            "id": f"listen-{keys[0]}",
            "method": "subscriptions/listen",
            "params": {"notifications": notifications, "_meta": buskit.envelope()},
        }
        headers = buskit.headers("subscriptions/listen")
        while True:
            self.opened += 1
            try:
                async with self.http.stream(
                    "POST", self.a, json=body, headers=headers, timeout=httpx2.Timeout(30.0, read=None)
                ) as response:
                    async for event in httpx2.EventSource(response):
                        if not event.data:
                            continue
                        frame = json.loads(event.data)
                        if frame.get("method") == "notifications/subscriptions/acknowledged":
                            for pair in frame["params"]["notifications"]["mrtr/taskKeys"]:
                                self.ids[pair["key"]] = pair["taskId"]
                            acked.set()
                        elif frame.get("method") == "notifications/tasks":
                            self._heard(frame["params"])
                        elif "error" in frame:
                            break  # the server ended the stream: listen again (and refetch)
            except httpx2.HTTPError as exc:
                if len(self.errors) < 20:
                    self.errors.append(f"listen stream failed: {exc!r}")
            self.ended += 1
            await asyncio.sleep(0.05)

    def _heard(self, task: dict[str, Any]) -> None:
        seen = self.seen.get(task["taskId"])
        if seen is None:
            return
        version = int(task["_meta"]["mrtr/taskVersion"])
        if version > seen.version:
            seen.version, seen.status = version, task["status"]
        if task["status"] == "input_required" and not seen.answered:
            seen.answered = True
            answering = asyncio.get_running_loop().create_task(self._answer(seen.creator, task))
            self.answering.add(answering)
            answering.add_done_callback(self.answering.discard)
        self.progress.set()

    async def _answer(self, creator: str, task: dict[str, Any]) -> None:
        try:
            await self._answer_once(creator, task)
        except Exception as exc:  # a background task: its failure is the run's
            self.errors.append(f"answering {task['taskId']} failed: {exc!r}")
            self.progress.set()

    async def _answer_once(self, creator: str, task: dict[str, Any]) -> None:
        (key,) = task["inputRequests"]
        answers = {key: {"action": "accept", "content": {"publish": True}}}
        params = {"taskId": task["taskId"], "inputResponses": answers}
        for _ in range(20):
            reply = await self._call(creator, "tasks/update", params)
            if "error" not in reply:
                return
            await asyncio.sleep(0.05)  # "task is busy": retry
        self.errors.append(f"tasks/update {task['taskId']} failed: {reply}")

    async def _call(self, url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """`buskit.call`, again after a connection the server closed under us (both calls here are idempotent)."""
        for attempt in range(5):
            try:
                return await buskit.call(self.http, url, method, params)
            except httpx2.TransportError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")


async def bus_stats(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    reply = await buskit.call(http, url, "tools/call", {"name": "bus_stats", "arguments": {}}, name="bus_stats")
    return reply["result"]["structuredContent"]  # type: ignore[no-any-return]


async def bus_lags(http: httpx2.AsyncClient, url: str) -> list[float]:
    """The lags `url`'s bus measured since the last call (seconds)."""
    reply = await buskit.call(http, url, "tools/call", {"name": "bus_lags", "arguments": {}}, name="bus_lags")
    content = reply["result"]["structuredContent"]
    return list(content["result"] if isinstance(content, dict) else content)


async def final_states(http: httpx2.AsyncClient, url: str, task_ids: list[str]) -> dict[str, str]:
    """The status of each task as `tasks/get` on `url` shows it now."""
    gate = asyncio.Semaphore(16)

    async def get(task_id: str) -> tuple[str, str]:
        async with gate:
            reply = await buskit.call(http, url, "tasks/get", {"taskId": task_id})
        return task_id, str(reply["result"]["status"])

    return dict(await asyncio.gather(*(get(task_id) for task_id in task_ids)))


__all__ = ["CHANGES_PER_TASK", "Driver", "Outcome", "Seen", "bus_lags", "bus_stats", "final_states", "push_fleet"]
