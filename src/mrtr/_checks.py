"""Registration-time checks: mistakes a flow's author can make that are visible before any call.

A newcomer's mistakes used to surface at call time (or never): an unannotated `ctx`
published as a required string argument, the SDK's `Context` in place of
`FlowContext`, a form schema that cannot be rendered. Each is checked when the flow is
registered, at import, with an error that names the fix.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterator
from typing import Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel

from mrtr._engine.asks import not_a_model, render_form_schema
from mrtr._engine.context import FlowContext
from mrtr._errors import FlowDefinitionError

_UNKNOWN = object()


def plain_function(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes no context at all (neither a `FlowContext` nor anything named like one).

    Such a function can still be a durable task (`task=...`): it runs as one step.
    """
    hints = typing.get_type_hints(fn)
    for name, annotation in hints.items():
        if name != "return" and inspect.isclass(annotation) and issubclass(annotation, FlowContext | Context):
            return False
    return not any(name in ("ctx", "context") for name in inspect.signature(fn).parameters)


def flow_context_param(fn: Callable[..., Any], flow: str) -> str:
    """The name of the flow's `FlowContext` parameter; a flow without one is refused.

    Raises:
        FlowDefinitionError: No parameter is annotated `FlowContext`; the message says
            which parameter was probably meant and how to fix it.
    """
    hints = typing.get_type_hints(fn)
    signature = inspect.signature(fn)
    for name, annotation in hints.items():
        if name != "return" and inspect.isclass(annotation) and issubclass(annotation, FlowContext):
            return name
    for param in signature.parameters.values():
        annotation = hints.get(param.name)
        if inspect.isclass(annotation) and issubclass(annotation, Context):
            raise FlowDefinitionError(
                f"flow {flow!r}: parameter {param.name!r} is annotated with the SDK's Context; a flow takes "
                f"`{param.name}: mrtr.FlowContext` (the SDK's Context is still there, as `{param.name}.request`)"
            )
    for param in signature.parameters.values():
        if param.name in ("ctx", "context") and param.annotation is inspect.Parameter.empty:
            raise FlowDefinitionError(
                f"flow {flow!r}: parameter {param.name!r} has no annotation, so it would be published as a "
                f"required argument of the tool; annotate it `{param.name}: mrtr.FlowContext`"
            )
    raise FlowDefinitionError(
        f"flow {flow!r} has no FlowContext parameter; add `ctx: mrtr.FlowContext` to its signature "
        "(a function that never asks or steps is a plain tool: register it with @server.tool())"
    )


def check_elicit_schemas(fn: Callable[..., Any], flow: str, ctx_param: str) -> None:
    """Render every `ctx.elicit(..., Model)` schema the source names, so a bad one fails at import.

    Only schemas named by a module-level or enclosing name can be checked; the rest are
    checked when first asked (with the same message).

    Raises:
        FlowDefinitionError: A schema is not a model class, or has a field no form can show.
    """
    for line, schema in _elicit_schemas(fn, ctx_param):
        where = f"flow {flow!r}, line {line}"
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise FlowDefinitionError(f"{where}: {not_a_model(schema)}")
        try:
            render_form_schema(schema)
        except TypeError as exc:
            raise FlowDefinitionError(f"{where}: {exc}") from None


def _elicit_schemas(fn: Callable[..., Any], ctx_param: str) -> Iterator[tuple[int, object]]:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, SystemError, RecursionError):
        # No source (a lambda in a REPL, generated code) or CPython's parser refusing at depth
        # (3.11's "AST constructor recursion depth mismatch"): the check is best-effort; the
        # schema is still checked when the ask first runs.
        return
    first = fn.__code__.co_firstlineno
    names = _visible_names(fn)
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "elicit"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == ctx_param
        ):
            continue
        argument = (
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "schema"), None)
        )
        schema = _UNKNOWN if argument is None else _evaluate(argument, names)
        if schema is not _UNKNOWN:
            yield first + node.lineno - 1, schema


def _visible_names(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        closure = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return dict(getattr(fn, "__globals__", {}))
    return {**closure.builtins, **closure.globals, **getattr(fn, "__globals__", {}), **closure.nonlocals}


def _evaluate(node: ast.expr, names: dict[str, Any]) -> object:
    """A name, a dotted name or a literal dict/list, as it is at registration; anything else is unknown."""
    if isinstance(node, ast.Name):
        return names.get(node.id, _UNKNOWN)
    if isinstance(node, ast.Attribute):
        base = _evaluate(node.value, names)
        return _UNKNOWN if base is _UNKNOWN else getattr(base, node.attr, _UNKNOWN)
    if isinstance(node, ast.Dict | ast.List | ast.Constant):
        try:
            return ast.literal_eval(node)
        except ValueError:
            return {} if isinstance(node, ast.Dict) else _UNKNOWN
    return _UNKNOWN


__all__ = [
    "plain_function",
    "check_elicit_schemas",
    "flow_context_param",
]
