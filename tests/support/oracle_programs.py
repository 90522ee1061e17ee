"""Random flow programs for the replay oracle: a tiny AST, its hypothesis strategy, and one interpreter.

The same interpreter runs a program twice: once straight through against `ReferenceContext`
(ask answers at once, step runs its function: plain Python, no mrtr) and once as an mrtr flow,
round by round. The engine's promise is that both give the same value and run every step's
function exactly once, so the program's value is built from every answer and step value it
saw (in program order), and every step function counts its runs under a label that is unique
per *execution* of that step (its position in the tree plus the loop iterations around it).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from mcp_types import CreateMessageResult, ListRootsResult, Root
from pydantic import BaseModel

import mrtr
from mrtr._engine.spec import TaskSupport

# -- the program AST ------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """`ctx.step(name, fn, *args)`; `args` is "none", "label" (unique) or "same" (equal everywhere)."""

    name: str
    args: str
    sync: bool
    slow: bool = False
    """The function takes a moment (a thread sleep or an `asyncio.sleep`) while other branches move."""


@dataclass(frozen=True)
class Ask:
    """`ctx.elicit(message, Reply)`; `shared` asks all use one message (so only their keys differ)."""

    shared: bool
    explicit_key: bool = False
    """Pass `key=` (unique per execution) instead of letting mrtr derive the key."""
    kind: str = "elicit"
    """Or "sample" (`ctx.sample`) or "roots" (`ctx.list_roots`: every such ask is the same question)."""


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Wait:
    """A durable wait (task programs only): `ctx.sleep` ("timer"), `ctx.wait_for_event` for an event
    the driver delivers ("event"), or one it never sends, which times out ("event_timeout")."""

    kind: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Loop:
    """`for i in range(n)`; `rename` gives steps inside `f"{name}_{i}"`, else mrtr numbers them `name#2`."""

    n: int
    rename: bool
    body: Node
    until: bool = False
    """After each iteration ask whether to go on (a data-dependent `break`)."""


@dataclass(frozen=True)
class If:
    """Asks a question of its own, then takes `then` or `orelse` on the answer's parity."""

    then: Node
    orelse: Node


@dataclass(frozen=True)
class Gather:
    """Concurrent sub-programs via `style`: see `GATHER_STYLES`."""

    style: str
    branches: tuple[Node, ...]


@dataclass(frozen=True)
class TryFinally:
    body: Node
    final: Node


@dataclass(frozen=True)
class Patched:
    """`if ctx.patched(id): then else: orelse`; a new run (all of ours) always takes `then`."""

    then: Node
    orelse: Node


@dataclass(frozen=True)
class Pipe:
    """Two concurrent tasks joined by an `asyncio.Queue`: `consumer` starts once `producer` hands over."""

    producer: Node
    consumer: Node


@dataclass(frozen=True)
class Background:
    """`task = asyncio.create_task(background)`, then `foreground` in the parent, then `await task`."""

    background: Node
    foreground: Node


@dataclass(frozen=True)
class Guarded:
    """`body` under `asyncio.timeout(60)` ("timeout") or `asyncio.shield(...)` ("shield")."""

    how: str
    body: Node


@dataclass(frozen=True)
class Stream:
    """`async for` over an async generator yielding `body` up to `n` times; `stop_after` breaks early."""

    n: int
    stop_after: int
    body: Node


Node = (
    Step | Ask | Sleep | Wait | Seq | Loop | If | Gather | TryFinally | Pipe | Patched | Background | Guarded | Stream
)

GATHER_STYLES = ("ctx.gather", "asyncio.gather", "TaskGroup", "create_task", "create_task_reversed")
STEP_NAMES = ("fetch", "save", "load")  # few names: the same name recurs across branches and loops


# -- strategies -----------------------------------------------------------------------------

_steps = st.builds(
    Step,
    st.sampled_from(STEP_NAMES),
    st.sampled_from(("none", "label", "same")),
    st.booleans(),
    st.sampled_from((False, False, False, True)),
)
_leaves: st.SearchStrategy[Node] = st.one_of(
    _steps,
    st.builds(Ask, st.booleans(), st.booleans(), st.sampled_from(("elicit", "elicit", "sample", "roots"))),
    _steps,
    st.builds(Ask, st.just(False)),
    st.builds(Sleep, st.sampled_from((0.0, 0.001))),
)


def _extend(inner: st.SearchStrategy[Node], known_bugs: bool = True) -> st.SearchStrategy[Node]:
    # Deferred only for its short repr: the nested strategies' full repr grows exponentially
    # with depth and hypothesis renders it when it reports.
    children = st.deferred(lambda: inner)
    return st.one_of(
        st.builds(Seq, st.lists(children, min_size=1, max_size=4).map(tuple)),
        st.builds(Loop, st.integers(1, 3), st.booleans(), children, st.booleans()),
        st.builds(If, children, children),
        st.builds(Gather, st.sampled_from(GATHER_STYLES), st.lists(children, min_size=2, max_size=3).map(tuple)),
        st.builds(TryFinally, children, children),
        st.builds(Pipe, children, children),
        st.builds(Background, children, children),
        st.builds(Guarded, st.sampled_from(("timeout", "shield")), children),
        st.builds(Stream, st.integers(1, 3), st.integers(1, 3), children).map(
            lambda stream: stream if known_bugs else Stream(stream.n, stream.n + 1, stream.body)
        ),
        *([st.builds(Patched, children, children)] if known_bugs else []),
    )


_waits = st.builds(Wait, st.sampled_from(("timer", "event", "event", "event_timeout")))


def programs(max_leaves: int = 16, *, known_bugs: bool = True, waits: bool = False) -> st.SearchStrategy[Node]:
    """Random programs of at most `max_leaves` leaves (loops multiply what actually runs).

    `known_bugs=False` leaves out the constructs of open findings (`ctx.patched`, async
    generators left early; see tests/integration/test_oracle_findings.py) to look for other bugs.
    `waits=True` adds durable waits (`Wait`): for programs that run as durable tasks.
    """
    extend = functools.partial(_extend, known_bugs=known_bugs)
    leaves = st.one_of(_leaves, _waits, _waits) if waits else _leaves
    parts = st.lists(st.recursive(leaves, extend, max_leaves=max_leaves), min_size=1, max_size=3)
    return st.builds(Seq, parts.map(tuple))


# -- the user and the side effects ---------------------------------------------------------


class Reply(BaseModel):
    word: str
    n: int


def user_answer(message: str) -> dict[str, Any]:
    """What the simulated user answers to `message` (deterministic, different per message).

    Plain questions are sometimes declined or cancelled (the flow catches that); the
    questions `If` and `Loop(until=True)` branch on are always answered.
    """
    digest = hashlib.sha256(message.encode()).digest()
    if message.startswith("Q<") and digest[1] % 8 == 0:
        return {"action": "decline"}
    if message.startswith("Q<") and digest[1] % 8 == 1:
        return {"action": "cancel"}
    return {"action": "accept", "content": {"word": f"a<{message}>", "n": digest[0] % 4}}


def user_reply(request: dict[str, Any]) -> dict[str, Any]:
    """The user's answer to a wire input request (elicitation, sampling or roots), as wire JSON."""
    params = request.get("params") or {}
    if request["method"] == "elicitation/create":
        # A re-asked form carries the reason after the question; the user answers the question.
        return user_answer(params["message"].split("\n\n(Asked again: ")[0])
    if request["method"] == "sampling/createMessage":
        prompt = params["messages"][0]["content"]["text"]
        return {"role": "assistant", "content": {"type": "text", "text": f"m<{prompt}>"}, "model": "oracle"}
    assert request["method"] == "roots/list", request
    return ROOTS


ROOTS = {"roots": [{"uri": "file:///oracle/a", "name": "a"}, {"uri": "file:///oracle/b", "name": "b"}]}


def step_function(runs: Counter[str], label: str, sync: bool, slow: bool) -> Callable[..., Any]:
    """A step's function: counts its runs under `label` and returns a value only it returns."""
    if sync:

        def run_sync(*args: Any) -> str:
            runs[label] += 1
            if slow:
                time.sleep(0.002)
            return f"s<{label}|{len(args)}>"

        return run_sync

    async def run_async(*args: Any) -> str:
        runs[label] += 1
        if slow:  # tasks a step starts are the step's own, not branches of the flow
            await asyncio.gather(asyncio.sleep(0.002), asyncio.sleep(0))
        return f"s<{label}|{len(args)}>"

    return run_async


# -- the interpreter ------------------------------------------------------------------------


class Interpreter:
    """Runs a program against a ctx (mrtr's `FlowContext` or `ReferenceContext`)."""

    def __init__(self, runs: Counter[str]) -> None:
        self.runs = runs

    async def run(self, node: Node, ctx: Any, where: str = "r", suffix: str = "") -> Any:
        if isinstance(node, Step):
            args: tuple[Any, ...] = {"none": (), "label": (where,), "same": ("same",)}[node.args]
            return await ctx.step(node.name + suffix, step_function(self.runs, where, node.sync, node.slow), *args)
        if isinstance(node, Ask):
            message = "Q<shared>?" if node.shared else f"Q<{where}>?"
            key = f"k{where}" if node.explicit_key else None
            if node.kind == "sample":
                sampled = await ctx.sample(message, max_tokens=5, key=key)
                return ["sampled", sampled.content.text]
            if node.kind == "roots":
                return ["roots", [str(root.uri) for root in await ctx.list_roots(key=key)]]
            try:
                reply = await ctx.elicit(message, Reply, key=key)
            except mrtr.InputRefused as refused:
                return ["refused", type(refused).__name__]
            return [reply.word, reply.n]
        if isinstance(node, Sleep):
            await asyncio.sleep(node.seconds)
            return "z"
        if isinstance(node, Wait):
            if node.kind == "timer":
                await ctx.sleep(0.02)
                return "t"
            name = event_name(where, delivered=node.kind == "event")
            try:
                return ["ev", await ctx.wait_for_event(name, timeout=None if node.kind == "event" else 0.05)]
            except mrtr.EventTimeout:
                return ["ev", "timeout"]
        if isinstance(node, Seq):
            return [await self.run(item, ctx, f"{where}.{i}", suffix) for i, item in enumerate(node.items)]
        if isinstance(node, Loop):
            values = []
            for i in range(node.n):
                renamed = f"{suffix}_{i}" if node.rename else suffix
                values.append(await self.run(node.body, ctx, f"{where}[{i}]", renamed))
                if node.until and (await ctx.elicit(f"More<{where}[{i}]>?", Reply)).n % 2 == 0:
                    break
            return values
        if isinstance(node, If):
            condition = await ctx.elicit(f"C<{where}>?", Reply)
            if condition.n % 2:
                return ["then", await self.run(node.then, ctx, f"{where}.t", suffix)]
            return ["else", await self.run(node.orelse, ctx, f"{where}.e", suffix)]
        if isinstance(node, Gather):
            coros = [self.run(b, ctx, f"{where}.g{i}", suffix) for i, b in enumerate(node.branches)]
            return ["g", await _gather(node.style, ctx, coros)]
        if isinstance(node, TryFinally):
            body: Any = None
            try:
                body = await self.run(node.body, ctx, f"{where}.try", suffix)
            finally:
                final = await self.run(node.final, ctx, f"{where}.fin", suffix)
            return ["tf", body, final]
        if isinstance(node, Patched):
            if ctx.patched(f"p{where}"):
                return ["new", await self.run(node.then, ctx, f"{where}.n", suffix)]
            return ["old", await self.run(node.orelse, ctx, f"{where}.o", suffix)]
        if isinstance(node, Background):
            task = asyncio.create_task(self.run(node.background, ctx, f"{where}.bg", suffix))
            foreground = await self.run(node.foreground, ctx, f"{where}.fg", suffix)
            return ["bg", await task, foreground]
        if isinstance(node, Guarded):
            if node.how == "timeout":
                async with asyncio.timeout(60):
                    return ["timeout", await self.run(node.body, ctx, f"{where}.to", suffix)]
            return ["shield", await asyncio.shield(self.run(node.body, ctx, f"{where}.sh", suffix))]
        if isinstance(node, Stream):

            async def produce_items() -> AsyncIterator[Any]:
                for i in range(node.n):
                    yield await self.run(node.body, ctx, f"{where}<{i}>", f"{suffix}_s{i}")

            items = []
            async for item in produce_items():
                items.append(item)
                if len(items) >= node.stop_after:
                    break
            return ["stream", items]
        if isinstance(node, Pipe):
            queue: asyncio.Queue[Any] = asyncio.Queue()

            async def produce() -> Any:
                value = await self.run(node.producer, ctx, f"{where}.p", suffix)
                queue.put_nowait(value)
                return value

            async def consume() -> Any:
                handed = await queue.get()
                return [handed, await self.run(node.consumer, ctx, f"{where}.c", suffix)]

            return ["pipe", list(await asyncio.gather(produce(), consume()))]
        raise TypeError(node)


async def _gather(style: str, ctx: Any, coros: list[Awaitable[Any]]) -> list[Any]:
    if style == "ctx.gather":
        return list(await ctx.gather(*coros))
    if style == "asyncio.gather":
        return list(await asyncio.gather(*coros))
    if style == "TaskGroup":
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]  # type: ignore[arg-type]
        return [task.result() for task in tasks]
    tasks = [asyncio.create_task(c) for c in coros]  # type: ignore[arg-type]
    order = reversed(tasks) if style == "create_task_reversed" else iter(tasks)
    values = {id(task): await task for task in order}
    return [values[id(task)] for task in tasks]


def event_name(where: str, *, delivered: bool) -> str:
    """The event a wait at `where` waits for (unique per execution); `e...` are sent, `x...` never."""
    return ("e" if delivered else "x") + hashlib.sha256(where.encode()).hexdigest()[:12]


def event_payload(name: str) -> str:
    return f"payload<{name}>"


class ReferenceContext:
    """A ctx that runs the program straight through: answers at once, runs every step."""

    def __init__(self) -> None:
        self.asks = 0
        self.events: list[str] = []
        """The events the program waited for that the driver sends (`e...`), in order."""

    async def sleep(self, delay: float) -> None:
        return None

    async def wait_for_event(self, name: str, timeout: float | None = None) -> Any:
        if name.startswith("x"):
            raise mrtr.EventTimeout(name, timeout or 0.0)
        self.events.append(name)
        return event_payload(name)

    async def elicit(self, message: str, schema: type[BaseModel], key: str | None = None) -> Any:
        self.asks += 1
        answer = user_answer(message)
        if answer["action"] == "decline":
            raise mrtr.Declined(message, key="reference")
        if answer["action"] == "cancel":
            raise mrtr.Cancelled(message, key="reference")
        return schema.model_validate(answer["content"])

    async def sample(self, prompt: str, *, max_tokens: int, key: str | None = None) -> CreateMessageResult:
        self.asks += 1
        wire = {"method": "sampling/createMessage", "params": {"messages": [{"content": {"text": prompt}}]}}
        return CreateMessageResult.model_validate(user_reply(wire))

    async def list_roots(self, *, key: str | None = None) -> list[Root]:
        self.asks += 1
        return ListRootsResult.model_validate(ROOTS).roots

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        return json.loads(json.dumps(value))  # what a journal round trip gives back

    async def gather(self, *aws: Awaitable[Any]) -> list[Any]:
        return list(await asyncio.gather(*aws))

    def patched(self, patch_id: str) -> bool:
        return True  # every run here is a new run under the current code


@dataclass
class Reference:
    value: str
    runs: Counter[str]
    asks: int
    events: list[str] = field(default_factory=list)


async def reference_run(program: Node) -> Reference:
    runs: Counter[str] = Counter()
    ctx = ReferenceContext()
    value = await Interpreter(runs).run(program, ctx)
    return Reference(json.dumps(value), runs, ctx.asks, ctx.events)


def register(
    flows: mrtr.Flows, program: Node, runs: Counter[str], name: str = "program", task: TaskSupport = "never"
) -> None:
    """Register `program` as the tool `name`; its step functions count into `runs`."""
    interpreter = Interpreter(runs)

    async def program_flow(ctx: mrtr.FlowContext) -> str:
        return json.dumps(await interpreter.run(program, ctx))

    flows.tool(name=name, task=task)(program_flow)
