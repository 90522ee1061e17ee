"""Steps: the side effects a flow journals, and how each one runs.

A step runs its function at most once per flow; replays return the journaled value. This
module owns what every driver shares: the step's identity (`StepInfo`, readable inside
the function through `current_step()`), the fingerprint of its arguments, turning its
value into journal JSON, and the typed value a replay gives back.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
import logging
import typing
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from mrtr._errors import FlowDefinitionError, StepResultError

logger = logging.getLogger("mrtr.steps")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """Identity of the step now running; `idempotency_key` is the same on every replay and instance."""

    name: str
    flow_id: str
    idempotency_key: str


_current_step: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar("mrtr_current_step", default=None)


def current_step() -> StepInfo:
    """The step the caller runs inside (pass `.idempotency_key` to payment APIs and the like)."""
    info = _current_step.get()
    if info is None:
        raise RuntimeError("mrtr.current_step() called outside ctx.step(...)")
    return info


def arg_digest(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """Fingerprint of a step's arguments, to catch replays that diverge from the first run."""
    if not args and not kwargs:  # the digest of `[[],{}]`, computed once
        return _NO_ARGS
    try:
        raw = pydantic_core.to_json([args, kwargs], fallback=_opaque)
    except Exception:
        return ""
    return hashlib.sha256(raw).hexdigest()[:12]


_NO_ARGS = hashlib.sha256(b"[[],{}]").hexdigest()[:12]


def _opaque(value: Any) -> str:
    # Objects without a JSON form are compared by type only: their repr may hold an address.
    return f"<{type(value).__qualname__}>"


def to_journal(name: str, value: Any, fn: Callable[..., Any] | None = None) -> Any:
    try:
        journaled = pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise FlowDefinitionError(
            f"step {name!r} returned a {type(value).__name__}, which cannot be journaled as JSON "
            "(return plain data or a pydantic model)"
        ) from exc
    if fn is not None and return_adapter(fn) is None and _reshaped(value, journaled):
        # Every round (the first too) gets the JSON form back; without an annotation to
        # validate against, a model comes back as a dict and a datetime as a string.
        logger.warning(
            "step %r returned %s %.60r, but the flow gets its JSON form back (%.60r), on every round; annotate the "
            "step function's return type (e.g. `-> %s`) to get the same type back",
            name,
            type(value).__name__,
            value,
            journaled,
            type(value).__name__,
        )
    return journaled


def _reshaped(value: Any, journaled: Any) -> bool:
    if value is None or type(value) in (str, int, float, bool):
        return False
    try:
        return type(value) is not type(journaled) or bool(value != journaled)
    except Exception:
        return True


async def call_step(info: StepInfo, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    token = _current_step.set(info)
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        result = await asyncio.to_thread(fn, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    finally:
        _current_step.reset(token)


_adapters: weakref.WeakKeyDictionary[Callable[..., Any], TypeAdapter[Any] | None] = weakref.WeakKeyDictionary()


def return_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any] | None:
    """The validator of `fn`'s return annotation, so a step's value comes back typed.

    Cached per function object, held weakly: a closure made per request is dropped with it.
    """
    target = getattr(fn, "__func__", fn)  # a bound method: cache on its function
    try:
        return _adapters[target]
    except (KeyError, TypeError):
        pass
    adapter = _build_adapter(fn)
    with contextlib.suppress(TypeError):  # not weakly referenceable (a builtin): rebuilt each time
        _adapters[target] = adapter
    return adapter


def typed_result(name: str, fn: Callable[..., Any], value: Any) -> Any:
    """`value` (a step's journaled JSON form) validated against `fn`'s return annotation, if it has one.

    A mismatch is a bug in the step (or its annotation): `StepResultError` names the step,
    the value and the annotation, first run and replay alike.
    """
    adapter = return_adapter(fn)
    if adapter is None:
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}" if error["loc"] else error["msg"]
            for error in exc.errors()[:3]
        )
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        raise StepResultError(
            f"step {name!r} returned {type(value).__name__} {_summary(value)}, which does not match its return "
            f"annotation {_type_name(fn)}: {problems}{more}",
            step=name,
        ) from None


def _summary(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(fn: Callable[..., Any]) -> str:
    annotation = typing.get_type_hints(fn).get("return")  # resolved before, by `return_adapter`
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _build_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any] | None:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    annotation = hints.get("return")
    if annotation is None or annotation is type(None) or annotation is Any:
        return None
    try:
        return TypeAdapter(annotation)
    except Exception:
        return None


__all__ = [
    "StepInfo",
    "arg_digest",
    "call_step",
    "current_step",
    "return_adapter",
    "to_journal",
    "typed_result",
]
