"""Branches: a scheduling-independent identity for every task a flow starts.

A flow that runs concurrent branches (`ctx.gather`, `asyncio.gather`, `asyncio.TaskGroup`,
`asyncio.create_task`) cannot name its steps and asks by the order in which they happen:
on a replay an answered ask returns at once, so branches interleave differently every
round. Instead each task is named by *where it was created*: the n-th task its parent
created, recursively (`"0"`, `"1"`, `"1.0"`, ...). Creation order within one task is as
deterministic as the flow's own code, so the name is the same on every replay.

asyncio offers exactly one place that sees every task being created, with the creator's
context still current: the event loop's task factory. mrtr installs one (chaining any
factory already set); outside a flow it is a single context-variable read.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine, Iterator
from typing import Any, Protocol


class FlowRun(Protocol):
    """What a branch needs of the run it belongs to (`mrtr._engine.replay.Replay`)."""

    suspended: bool

    def adopt(self, task: asyncio.Task[Any], branch: Branch) -> None: ...


class Branch:
    """One task of one flow run: its path and the counters that name what it does."""

    __slots__ = ("ask_counts", "children", "detached", "path", "replay", "step_counts", "task")

    def __init__(self, replay: FlowRun, path: str, *, detached: bool = False) -> None:
        self.replay = replay
        self.path = path
        self.detached = detached
        """Not numbered (made while unwinding, or by a loop callback): the flow's, but no identity."""
        self.task: asyncio.Task[Any] | None = None
        """The task running this branch: only its own code numbers new branches."""
        self.children = 0
        self.step_counts: dict[str, int] = {}
        self.ask_counts: dict[str, int] = {}

    def child(self) -> Branch:
        index = self.children
        self.children += 1
        return Branch(self.replay, f"{self.path}.{index}" if self.path else str(index))


current_branch: contextvars.ContextVar[Branch | None] = contextvars.ContextVar("mrtr_branch", default=None)

asking_branch: contextvars.ContextVar[Branch | None] = contextvars.ContextVar("mrtr_asking_branch", default=None)
"""The branch an inline step's function asks from (`FlowContext.inline_step`): it runs outside the
flow's branches, as a step's does (the tasks it starts are not the flow's), yet may ask."""


@contextlib.contextmanager
def outside_branch() -> Iterator[None]:
    """Run mrtr's own awaits (a step's function, a checkpoint write) outside the branch.

    Tasks they create (a driver's internals, a thread pool) are not the flow's: they must
    neither consume the branch's child numbering nor be counted when the round settles.
    """
    token = current_branch.set(None)
    asking = asking_branch.set(None)
    try:
        yield
    finally:
        asking_branch.reset(asking)
        current_branch.reset(token)


@contextlib.contextmanager
def asking_from(branch: Branch) -> Iterator[None]:
    """Run an inline step's function outside the branch (as a step's), its asks made from `branch`."""
    token = current_branch.set(None)
    asking = asking_branch.set(branch)
    try:
        yield
    finally:
        asking_branch.reset(asking)
        current_branch.reset(token)


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Make `loop` name the tasks flows create (idempotent; keeps a factory already set)."""
    if not getattr(loop.get_task_factory(), "mrtr_branches", False):
        loop.set_task_factory(_factory_over(loop.get_task_factory()))


def _factory_over(previous: Any) -> Any:
    create = previous or _plain

    def factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
        parent = current_branch.get()
        if parent is None:  # not a flow's: the loop's every other task pays one context read
            return create(loop, coro, **kwargs)
        return _flow_task(create, loop, coro, parent, kwargs)

    factory.mrtr_branches = True  # type: ignore[attr-defined]
    return factory


def _plain(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
    return asyncio.Task(coro, loop=loop, **kwargs)


def _flow_task(
    create: Any, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], parent: Branch, kwargs: dict[str, Any]
) -> Any:
    if parent.detached or parent.replay.suspended or asyncio.current_task() is not parent.task:
        # Made by unwinding code, or by a callback that merely carries the flow's context
        # (asyncio finalising an abandoned async generator): not numbered — when it runs
        # is up to the loop — but still the flow's, cancelled and awaited with its round,
        # and so is everything it starts.
        child = Branch(parent.replay, parent.path, detached=True)
    else:
        child = parent.child()
    context = kwargs.pop("context", None)
    context = context.copy() if context is not None else contextvars.copy_context()
    context.run(current_branch.set, child)
    task = create(loop, coro, context=context, **kwargs)
    child.task = task
    parent.replay.adopt(task, child)
    return task


__all__ = [
    "Branch",
    "FlowRun",
    "asking_branch",
    "asking_from",
    "current_branch",
    "install",
    "outside_branch",
]
