"""What every host's `Flows` does to register a flow: the same checks and the same entry point.

`mrtr.Flows` (the SDK's `MCPServer`) and `mrtr.fastmcp.Flows` (FastMCP) differ only in how a
request reaches the engine; the flow's checks, its limits and the function the framework
registers (the flow's own signature, without its context parameter, so the framework derives
the same schema) are built here once.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mrtr._engine.asks import Capability
from mrtr._engine.context import step
from mrtr._engine.spec import FlowSpec, Limits
from mrtr._errors import InputRefused


def reject_bare_use(first: object, what: str) -> None:
    """`@flows.tool` without parentheses would register the decorator itself."""
    if callable(first):
        raise TypeError(f"use @flows.{what}(...) with parentheses")


def checked_capabilities(flow: str, requires: Sequence[Capability]) -> tuple[Capability, ...]:
    known = typing.get_args(Capability)
    for capability in requires:
        if capability not in known:
            raise ValueError(f"flow {flow!r}: requires={capability!r} is not a capability; use one of {known}")
    return tuple(requires)


def flow_limits(
    fn: Callable[..., Any],
    name: str,
    defaults: Limits,
    max_rounds: int | None,
    deadline: float | None,
    max_state_bytes: int | None,
    task_max_rounds: int | None = None,
) -> Limits:
    """The flow's limits (the decorator's, else the `Flows` defaults); an async function only."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"flow {name!r} must be an async function (it awaits the client)")
    return Limits(
        max_rounds=max_rounds if max_rounds is not None else defaults.max_rounds,
        deadline=deadline if deadline is not None else defaults.deadline,
        max_state_bytes=max_state_bytes if max_state_bytes is not None else defaults.max_state_bytes,
        task_max_rounds=task_max_rounds if task_max_rounds is not None else defaults.task_max_rounds,
    )


def refused_as_client_error(spec: FlowSpec) -> Callable[[InputRefused], Exception]:
    """Prompts and resources have no error result: the user's refusal is a -32602 the client can show.

    Not a crash (-32603, logged with a traceback): nothing went wrong on the server.
    """

    def refused(exc: InputRefused) -> Exception:
        data = {"reason": f"input_{exc.action}", "flow": spec.name, "key": exc.key}
        return MCPError(code=INVALID_PARAMS, message=str(exc), data=data)

    return refused


def one_step(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A plain function as a flow body: one step named `run`, so a task that never asks runs to
    completion on some worker, and again (under the same `mrtr.current_step().idempotency_key`)
    if that worker dies first: at least once."""

    async def body(**arguments: Any) -> Any:
        return await step("run", fn, **arguments)

    functools.update_wrapper(body, fn)
    return body


def entry_point(
    fn: Callable[..., Any],
    spec: FlowSpec,
    run: Callable[[dict[str, Any]], Awaitable[Any]],
    *,
    extra: Sequence[inspect.Parameter] = (),
) -> Callable[..., Any]:
    """A framework-registrable function with the flow's signature (minus its context parameter,
    plus `extra`, e.g. the SDK `Context` to inject); calling it awaits `run(arguments)`."""
    hints = typing.get_type_hints(fn, include_extras=True)
    signature = inspect.signature(fn)
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"flow {spec.name!r}: *args/**kwargs cannot become a schema")
        if param.name == spec.ctx_param:
            continue
        annotation = hints.get(param.name, param.annotation)
        params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
    params.extend(extra)
    returns = hints.get("return", signature.return_annotation)

    async def entry(**kwargs: Any) -> Any:
        return await run(kwargs)

    functools.update_wrapper(entry, fn, updated=())
    del entry.__wrapped__  # type: ignore[attr-defined]  # set by update_wrapper; the framework must see our signature
    entry.__signature__ = signature.replace(parameters=params, return_annotation=returns)  # type: ignore[attr-defined]
    entry.__annotations__ = {p.name: p.annotation for p in params} | {"return": returns}
    return entry


__all__ = [
    "checked_capabilities",
    "entry_point",
    "one_step",
    "flow_limits",
    "refused_as_client_error",
    "reject_bare_use",
]
