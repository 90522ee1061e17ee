"""Registration-time checks: mistakes a flow's author can make that are visible before any call.

A newcomer's mistakes used to surface at call time (or never): an unannotated `ctx`
published as a required string argument, the SDK's `Context` in place of
`FlowContext`, a form schema that cannot be rendered. Each is checked when the flow is
registered, at import, with an error that names the fix.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel

from mrtr._engine.asks import not_a_model, render_form_schema
from mrtr._engine.context import FlowContext
from mrtr._errors import FlowDefinitionError

_UNKNOWN = object()


def context_param(
    fn: Callable[..., Any], flow: str, *, host_context: type | None = None, task: bool = False
) -> str | None:
    """The name of the flow's context parameter, or None for a flow that takes none.

    A flow takes `mrtr.FlowContext`, or the host's own context (`host_context`: FastMCP's
    `Context`, for 3.x-style code). One without a context parameter is a flow only if it still
    does flow things: it calls `mrtr.step` or `mrtr.gather`, or it is a durable task (which
    runs it as one step); anything else is a plain tool, registered with the server's own
    decorator. The same rules, and the same messages, on both hosts.

    Raises:
        FlowDefinitionError: The SDK's `Context` in place of `FlowContext`, an unannotated
            `ctx`, or a plain function; the message names the fix.
    """
    hints = typing.get_type_hints(fn)
    signature = inspect.signature(fn)
    accepted = [FlowContext] if host_context is None else [FlowContext, host_context]
    found = [
        name
        for name, annotation in hints.items()
        if name != "return" and context_class(annotation, tuple(accepted), flow, name) is not None
    ]
    if len(found) > 1:
        raise FlowDefinitionError(
            f"flow {flow!r}: parameters {found[0]!r} and {found[1]!r} are both contexts; a flow takes one context "
            "parameter (the same object serves every use)"
        )
    if found:
        return found[0]
    for param in signature.parameters.values():
        annotation = hints.get(param.name)
        if inspect.isclass(annotation) and issubclass(annotation, Context):
            raise FlowDefinitionError(
                f"flow {flow!r}: parameter {param.name!r} is annotated with the SDK's Context; a flow takes "
                f"`{param.name}: mrtr.FlowContext` (the SDK's Context is still there, as `{param.name}.request`)"
            )
    annotations = " or ".join(f"`{{name}}: {_spelled(kind)}`" for kind in accepted)
    for param in signature.parameters.values():
        if param.name in ("ctx", "context") and param.annotation is inspect.Parameter.empty:
            raise FlowDefinitionError(
                f"flow {flow!r}: parameter {param.name!r} has no annotation, so it would be published as a "
                f"required argument of the tool; annotate it {annotations.format(name=param.name)}"
            )
    if task or calls_flow_api(fn):
        return None
    raise FlowDefinitionError(
        f"flow {flow!r} has no FlowContext parameter; add `ctx: mrtr.FlowContext` to its signature "
        "(a function that never asks or steps is a plain tool: register it with the server's own decorator)"
    )


def context_class(annotation: Any, accepted: tuple[type, ...], flow: str, param: str) -> type | None:
    """The context class `annotation` names, in every spelling FastMCP 3.x served: `Context`,
    `Context | None`, `Optional[Context]` (each maybe in `Annotated[...]`). None: not a context.

    A context is always given, so the `None` of an Optional never happens: every spelling gets
    the same object (FastMCP 3.x's `Depends(OptionalContext)` or `CurrentContext()` default included).

    Raises:
        FlowDefinitionError: The annotation mentions a context in a shape mrtr cannot serve
            (`Context | str`, `list[Context]`...), named in the message.
    """
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if inspect.isclass(annotation) and not typing.get_args(annotation):
        return annotation if issubclass(annotation, accepted) else None
    if not _mentions(annotation, accepted):
        return None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1 and inspect.isclass(members[0]) and issubclass(members[0], accepted):
            return members[0]
    raise FlowDefinitionError(
        f"flow {flow!r}: parameter {param!r} is annotated {_shown(annotation)}, a context shape mrtr cannot serve; "
        "annotate it with the context class alone, or Optional (`Context`, `Context | None`, `Optional[Context]`)"
    )


def _mentions(annotation: Any, accepted: tuple[type, ...]) -> bool:
    if inspect.isclass(annotation) and not typing.get_args(annotation):
        return issubclass(annotation, accepted)
    return any(_mentions(arg, accepted) for arg in typing.get_args(annotation))


def _shown(annotation: Any) -> str:
    text = repr(annotation).replace("typing.", "")
    return re.sub(r"[\w.]+\.(\w+)", r"\1", text) if "<class" not in text else getattr(annotation, "__name__", text)


def _spelled(kind: type) -> str:
    return "mrtr.FlowContext" if kind is FlowContext else f"{kind.__module__.partition('.')[0]}.{kind.__name__}"


_FLOW_API = frozenset({"step", "gather"})


def calls_flow_api(fn: Callable[..., Any]) -> bool:
    """Whether the function (or one nested in it) names `mrtr.step` or `mrtr.gather` (unknown: True)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code is None or _names_flow_api(code)


def _names_flow_api(code: types.CodeType) -> bool:
    if _FLOW_API & set(code.co_names):
        return True
    return any(isinstance(const, types.CodeType) and _names_flow_api(const) for const in code.co_consts)


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


def elicit_schemas(fn: Callable[..., Any], ctx_param: str, keyword: str = "schema") -> Iterator[tuple[int, object]]:
    """`(line, value)` of each `ctx.elicit(message, X)` (or `keyword=X`) whose `X` is known at registration."""
    return _elicit_schemas(fn, ctx_param, keyword)


def _elicit_schemas(fn: Callable[..., Any], ctx_param: str, keyword: str = "schema") -> Iterator[tuple[int, object]]:
    fn = inspect.unwrap(fn)  # a host's wrapper (FastMCP's dependencies resolved per run): the flow's own source
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
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == keyword), None)
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


__all__ = ["calls_flow_api", "check_elicit_schemas", "context_class", "context_param", "elicit_schemas"]
