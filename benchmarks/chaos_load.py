"""The chaos benchmark's load: flows and task flows through shared clients, checked end to end.

`Load` runs `clients` workers; each opens ONE client (per `mode`) and runs its share of
the `concurrency` lanes on it, every lane taking the next job until the quota is done
(and, if fewer than `min_kills` kills happened by then, more flows until they have).
A job is lost when its call raises, is cancelled or times out, and wrong when its value
differs from what the answers imply. A client that breaks (its `async with` raises) is
counted and replaced, so one breakage does not end the worker.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as t
from benchmarks.chaos_fleet import Killer
from mcp import Client
from mcp.client.session import ClientRequestContext

from mrtr.client import NO_RETRY, CreatedTask, FlowClient, TasksClient, TaskSnapshot

MODES = ("sdk", "mrtr")
FLOW_TIMEOUT = 30.0
TASK_TIMEOUT = 60.0
REOPEN_PAUSE = 0.2
_MULTIPLIERS = {"x": 7, "y": 13, "z": 11}
_QUESTION = re.compile(r"^([FT])(\d+) ([xyz])\?$")


@dataclass(frozen=True)
class Job:
    """One flow (`trip`) or task flow (`job`); its label carries what the answers derive from."""

    kind: str
    number: int

    @property
    def label(self) -> str:
        return f"{'F' if self.kind == 'flow' else 'T'}{self.number:05d}"

    @property
    def base(self) -> int:
        return self.number * 3 + 1

    def expected(self) -> int:
        if self.kind == "flow":
            return (self.base + answer(self.number, "x")) * 2 + answer(self.number, "y")
        return self.base * 3 + answer(self.number, "z")


def answer(number: int, letter: str) -> int:
    return number * _MULTIPLIERS[letter] % 100


def answer_question(message: str) -> t.ElicitResult:
    """The user: answers `F00012 x?` with the number that flow expects."""
    match = _QUESTION.match(message)
    if match is None:
        return t.ElicitResult(action="decline")
    return t.ElicitResult(action="accept", content={"value": answer(int(match[2]), match[3])})


@dataclass
class LoadResult:
    flows_started: int = 0
    flows_ok: int = 0
    flows_lost: int = 0
    flows_wrong: int = 0
    tasks_started: int = 0
    tasks_ok: int = 0
    tasks_lost: int = 0
    tasks_wrong: int = 0
    client_breaks: int = 0
    break_reasons: dict[str, int] = field(default_factory=dict)
    lost_reasons: dict[str, int] = field(default_factory=dict)
    wrong_examples: list[str] = field(default_factory=list)
    task_durations: list[float] = field(default_factory=list)
    """Seconds from `tools/call` to the right value, per task flow that completed."""
    seconds: float = 0.0

    def task_median(self) -> float | None:
        return statistics.median(self.task_durations) if self.task_durations else None

    @property
    def lost(self) -> int:
        return self.flows_lost + self.tasks_lost

    @property
    def wrong(self) -> int:
        return self.flows_wrong + self.tasks_wrong


_CURRENT_JOB: contextvars.ContextVar[Job | None] = contextvars.ContextVar("chaos_job", default=None)


def tally(counts: dict[str, int], reason: str) -> None:
    counts[reason] = counts.get(reason, 0) + 1


def describe(exc: BaseException) -> str:
    """A short, countable reason: the first leaf of a group, its type and message start."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = re.sub(r"[0-9a-f]{16,}", "…", str(exc))[:90]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Load:
    mode: str
    url: str
    flows: int
    tasks: int
    concurrency: int
    clients: int
    task_seconds: float = 0.3
    result: LoadResult = field(default_factory=LoadResult)
    task_ids: dict[str, str] = field(default_factory=dict)
    _queue: list[Job] = field(default_factory=list)
    _extra: int = 0

    async def run(self, killer: Killer, min_kills: int, duration_cap: float) -> LoadResult:
        """Drive the whole quota through the clients while `killer` works; bounded by `duration_cap`."""
        self._queue = interleave(self.flows, self.tasks)
        self._queue.reverse()  # pop() from the end: first job first
        lanes = [self.concurrency // self.clients + (i < self.concurrency % self.clients) for i in range(self.clients)]
        max_kills = int(duration_cap / max(killer.interval[0], 0.1)) + 1
        stop = anyio.Event()
        started = time.monotonic()
        async with anyio.create_task_group() as group:
            group.start_soon(killer.run, stop, max_kills)
            with anyio.move_on_after(duration_cap):
                async with anyio.create_task_group() as workers:
                    for count in lanes:
                        workers.start_soon(self._worker, count, killer, min_kills)
            self.result.seconds = time.monotonic() - started
            stop.set()
        return self.result

    def _next(self, killer: Killer, min_kills: int) -> Job | None:
        if self._queue:
            return self._queue.pop()
        if len(killer.kills) < min_kills:  # quota done before enough kills: keep the pressure on
            self._extra += 1
            return Job("flow", self.flows + self._extra)
        return None

    async def _worker(self, lanes: int, killer: Killer, min_kills: int) -> None:
        while self._queue or len(killer.kills) < min_kills:
            try:
                async with self._open() as client, anyio.create_task_group() as group:
                    for _ in range(lanes):
                        group.start_soon(self._lane, client, killer, min_kills)
                return
            except Exception as exc:  # the shared client broke: count it, open a new one
                self.result.client_breaks += 1
                tally(self.result.break_reasons, describe(exc))
                await anyio.sleep(REOPEN_PAUSE)

    async def _lane(self, client: Any, killer: Killer, min_kills: int) -> None:
        while (job := self._next(killer, min_kills)) is not None:
            await self._run_job(client, job)

    async def _run_job(self, client: Any, job: Job) -> None:
        r = self.result
        if job.kind == "flow":
            r.flows_started += 1
        else:
            r.tasks_started += 1
        token = _CURRENT_JOB.set(job)
        started = time.monotonic()
        try:
            with anyio.fail_after(FLOW_TIMEOUT if job.kind == "flow" else TASK_TIMEOUT):
                value = await self._call(client, job)
        except BaseException as exc:  # lost: raised, timed out, or cancelled with its client
            if job.kind == "flow":
                r.flows_lost += 1
            else:
                r.tasks_lost += 1
            tally(r.lost_reasons, describe(exc) if isinstance(exc, Exception) else "cancelled (client broke)")
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            _CURRENT_JOB.reset(token)
        if value == job.expected():
            if job.kind == "flow":
                r.flows_ok += 1
            else:
                r.tasks_ok += 1
                r.task_durations.append(time.monotonic() - started)
            return
        if job.kind == "flow":
            r.flows_wrong += 1
        else:
            r.tasks_wrong += 1
        if len(r.wrong_examples) < 5:
            r.wrong_examples.append(f"{job.label}: got {value!r}, expected {job.expected()}")

    async def _call(self, client: Any, job: Job) -> Any:
        if job.kind == "flow":
            result = await client.call_tool("trip", {"flow": job.label, "base": job.base})
        else:
            arguments = {"flow": job.label, "base": job.base, "slow": self.task_seconds}
            result = await client.call_tool("job", arguments)
        if result.is_error:
            text = " ".join(c.text for c in result.content if isinstance(c, t.TextContent))
            raise RuntimeError(f"tool error: {text[:120]}")
        structured = result.structured_content or {}
        return structured.get("result")

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[Any]:
        if self.mode == "sdk":
            # The baseline: nothing of mrtr's resends, for task polls either.
            tasks = TasksClient(self._answer, on_created=self._created, retry=NO_RETRY)
            async with Client(self.url, elicitation_callback=self._sdk_elicit, extensions=[tasks]) as client:
                yield client
        elif self.mode == "mrtr":
            async with FlowClient(self.url, elicit=self._elicit, tasks=True, on_task=self._seen_task) as client:
                yield client
        else:
            raise ValueError(f"unknown client mode {self.mode!r}")

    async def _elicit(self, params: t.ElicitRequestParams) -> t.ElicitResult:
        return answer_question(params.message)

    async def _sdk_elicit(self, context: ClientRequestContext, params: t.ElicitRequestParams) -> t.ElicitResult:
        return answer_question(params.message)

    async def _answer(self, request: t.InputRequest) -> t.ElicitResult:
        if isinstance(request, t.ElicitRequest):
            return answer_question(request.params.message)
        raise RuntimeError(f"unexpected input request {type(request).__name__}")

    def _created(self, created: CreatedTask) -> None:
        if (job := _CURRENT_JOB.get()) is not None:
            self.task_ids[job.label] = created.task_id

    def _seen_task(self, snapshot: TaskSnapshot) -> None:
        if (job := _CURRENT_JOB.get()) is not None:
            self.task_ids.setdefault(job.label, snapshot.task_id)


def interleave(flows: int, tasks: int) -> list[Job]:
    """All jobs, task flows spread evenly among the flows (so tasks see kills all along)."""
    jobs: list[Job] = []
    every = (flows + tasks) / tasks if tasks else 0.0
    next_task, task_number, flow_number = every / 2, 0, 0
    for index in range(flows + tasks):
        if task_number < tasks and (index >= next_task or flow_number >= flows):
            task_number += 1
            jobs.append(Job("task", task_number))
            next_task += every
        else:
            flow_number += 1
            jobs.append(Job("flow", flow_number))
    return jobs
