"""FastMCP's dependency parameters on a flow: resolved on every run, never stored as arguments.

A FastMCP 3.x tool declares injected values as parameters: `progress: Progress = Progress()`,
`db = Depends(open_db)`, `headers = CurrentHeaders()`, `token = CurrentAccessToken()`... FastMCP
resolves them when it calls the function. A flow is called again on every round and, as a
durable task, on a worker with no request at all; a resolved value (a `Progress`, a database
handle) is not an argument: it cannot be sealed into `requestState` or stored with a task
("Object of type Progress is not JSON serializable"), and it would be stale on the next round.

So a flow's dependency parameters are taken out of the signature FastMCP sees (it neither
publishes nor resolves them) and resolved by mrtr each time the flow function runs: each
round, each replay, each task run, with FastMCP's own resolver (`Depends`, `CurrentHeaders`,
`TokenClaim`, ... mean what they mean in FastMCP). Two are mrtr's own:

- the context parameter, however spelled (`ctx: Context = CurrentContext()`,
  `ctx: Context | None = Depends(OptionalContext)`): it is the flow's context
  (`mrtr.fastmcp.FlowsContext`), in a task as inline;
- `Progress()`: `set_total`, `increment` and `set_message` report through the flow's context
  (`ctx.report_progress`): progress notifications inline, the task's status message in a
  durable task.

A durable task run by a worker that adopted it has no HTTP request: there `CurrentHeaders()` is
`{}` and `CurrentRequest()` fails, as in a 3.x background task.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Protocol

from fastmcp import Context, FastMCP
from fastmcp.server.dependencies import Progress, resolve_dependencies
from uncalled_for import get_dependency_parameters

from mrtr._engine.context import FlowContext, current_flow
from mrtr.fastmcp import _internals as internals


class _Reports(Protocol):
    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """FastMCP `Context.report_progress`'s signature (`mrtr.fastmcp.FlowsContext` has it)."""
        ...


class FlowProgress(Progress):
    """FastMCP's `Progress` for a flow: every change is reported through the flow's context at once.

    In-memory on each run: a replayed flow counts again from zero (and reports again), as the
    flow code before its next ask runs again.
    """

    def __init__(self, ctx: _Reports) -> None:
        self._ctx = ctx
        self._current: int | None = None
        self._total = 1
        self._message: str | None = None

    @property
    def current(self) -> int | None:
        return self._current

    @property
    def total(self) -> int:
        return self._total

    @property
    def message(self) -> str | None:
        return self._message

    async def set_total(self, total: int) -> None:
        if total < 1:
            raise ValueError("Total must be at least 1")
        self._total = total
        await self._report()

    async def increment(self, amount: int = 1) -> None:
        if amount < 1:
            raise ValueError("Amount must be at least 1")
        self._current = amount if self._current is None else self._current + amount
        await self._report()

    async def set_message(self, message: str | None) -> None:
        self._message = message
        await self._report()

    async def _report(self) -> None:
        await self._ctx.report_progress(self._current or 0, self._total, self._message)


def with_dependencies(
    fn: Callable[..., Any], ctx_param: str | None, mcp: FastMCP[Any], context_for: Callable[[FlowContext], Any]
) -> Callable[..., Any]:
    """`fn` without its dependency parameters, resolving them on each call (`fn` itself when it has none).

    `ctx_param` is the flow's context parameter (not a dependency, whatever its default);
    `context_for(flow)` makes the FastMCP context `Progress` reports through when the flow
    takes none, or takes `mrtr.FlowContext`.
    """
    declared = {name: dep for name, dep in get_dependency_parameters(fn).items() if name != ctx_param}
    if not declared:
        return fn
    hints = typing.get_type_hints(fn, include_extras=True)
    signature = inspect.signature(fn)
    progress = [name for name, dep in declared.items() if isinstance(dep, Progress)]
    others = [name for name in declared if name not in progress]
    kept = [p for name, p in signature.parameters.items() if name not in declared]
    resolver = _resolver(fn, signature, hints, set(progress), ctx_param) if others else None

    async def flow(**kwargs: Any) -> Any:
        values: dict[str, Any] = {}
        if progress:
            reporter = _reporter(kwargs.get(ctx_param) if ctx_param else None, context_for)
            values |= {name: FlowProgress(reporter) for name in progress}
        if resolver is None:
            return await fn(**kwargs, **values)
        arguments = {k: v for k, v in kwargs.items() if k != ctx_param}
        async with AsyncExitStack() as stack:
            stack.enter_context(internals.serving(mcp))  # a task's run has no request
            resolved = await stack.enter_async_context(resolve_dependencies(resolver, arguments))
            values |= {name: resolved[name] for name in others}
            return await fn(**kwargs, **values)

    functools.update_wrapper(flow, fn, updated=())
    flow.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    flow.__annotations__ = {name: hint for name, hint in hints.items() if name not in declared}
    return flow


def _resolver(
    fn: Callable[..., Any],
    signature: inspect.Signature,
    hints: Mapping[str, Any],
    skip: set[str],
    ctx_param: str | None,
) -> Callable[..., Any]:
    """A function FastMCP's resolver reads: `fn`'s parameters but the context and `Progress` ones.

    Never called: `resolve_dependencies` reads its signature (cached per function object, so it
    is made once per flow) and resolves its dependencies against the call's arguments.
    """
    params = [p for name, p in signature.parameters.items() if name not in skip and name != ctx_param]

    def resolver(**_: Any) -> None:
        raise AssertionError("only read for its signature")

    resolver.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    resolver.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints}
    resolver.__qualname__ = getattr(fn, "__qualname__", resolver.__qualname__)
    return resolver


def _reporter(given: Any, context_for: Callable[[FlowContext], Any]) -> _Reports:
    """The flow's own FastMCP context; one made for it when the flow takes `FlowContext` or none."""
    if isinstance(given, Context):  # `mrtr.fastmcp.FlowsContext`: the flow's own
        return given
    made: _Reports = context_for(given if isinstance(given, FlowContext) else current_flow())
    return made


__all__ = ["FlowProgress", "with_dependencies"]
