"""One request of a flow, as every host runs it: read, gated, run by the engine, ended in a typed outcome.

Both `Flows` call `HostCore.call` (`run_request` here) from the function they register and
only translate what it returns to their framework (the SDK lets `MCPError`s through its tool
wrapper; FastMCP masks what a tool raises, so it wants quiet `ToolError`s and a `ToolResult`
for a new task). What can come back is written here once:

- `Value`: the flow returned (the framework converts the value as it would any function's);
- `InputRequiredResult`: the flow is waiting for the client (MRTR's next round);
- `TaskStarted`: the call became a durable task;
- `Refused`: the user declined or cancelled an ask;
- `Unavailable`: the store stopped answering (retryable, logged once per burst by the store);
- `Rejected`: a protocol error for the client (-32602 for its own mistakes: a malformed answer,
  stale or foreign state, a refused or capped round; -32021, -32603, ...).

A -32602 is the client's doing: one INFO line (logger `mrtr.engine`) says why, and each host
sends the error without a traceback (see `mrtr.fastmcp._client_errors` for FastMCP).

Anything else a flow raises is the server's bug and propagates as it is, traceback and all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
    InputRequiredResult,
)
from mcp_types.version import LATEST_MODERN_VERSION

from mrtr._engine.asks import supports
from mrtr._engine.context import FlowContext
from mrtr._engine.drivers import LiveDriver, missing_capability
from mrtr._engine.inline import load_journal, round_body, start_task, stateless
from mrtr._engine.journal import Journal
from mrtr._engine.round import Round, Services, chain
from mrtr._engine.run import as_protocol_error, call_flow
from mrtr._engine.spec import FlowSpec, TaskStarted
from mrtr._errors import FlowError, InputRefused, StoreUnavailable
from mrtr._wire import SEED_DIALECT, TASKS_EXTENSION, declares_tasks

E = TypeVar("E", bound=Exception)

logger = logging.getLogger("mrtr.engine")


@dataclass(slots=True)
class Value:
    """The flow's return value, for the framework to convert.

    Not frozen, unlike the failures: one is made on every round that returns, and a frozen
    dataclass's `__init__` sets its field through `object.__setattr__` (twice the time).
    """

    value: Any


@dataclass(frozen=True, slots=True)
class Failure(Generic[E]):
    """A request that ended in an error for the client: `error`, to reach it in the framework's way."""

    error: E


class Refused(Failure[InputRefused]):
    """The user declined or cancelled an ask: nothing went wrong on the server."""

    __slots__ = ()


class Unavailable(Failure[StoreUnavailable]):
    """The store did not answer: a retryable error the store has already logged."""

    __slots__ = ()


class Rejected(Failure[MCPError]):
    """A JSON-RPC error for the client, to reach the wire with its code, message and data."""

    __slots__ = ()


Outcome = Value | InputRequiredResult | TaskStarted | Refused | Unavailable | Rejected
"""What one request of a flow ends in (see the module docstring)."""


async def run_request(
    services: Services,
    spec: FlowSpec,
    request: Any,
    arguments: Mapping[str, Any],
    wire: Any = None,
    state_security: Callable[[], RequestStateSecurity | None] | None = None,
) -> Outcome:
    """Run one request of `spec` with an instance's `services` and say how it ended.

    The request is read once into a `Round`; a capability the flow requires, or a task the
    client cannot hold, is refused in round 1, before the user answers anything; a call that
    is a task from the start becomes one (`start_task`); a client before 2026-07-28 runs the
    flow live; any other round loads its journal and runs the engine's round body
    (`mrtr._engine.inline.round_body`) behind the instance's round policies (`services`:
    replay guard, load shedding). `wire` is the SDK's `ServerRequestContext`, read from
    `request` (an `MCPServer` `Context`) when not given.
    """
    try:
        round = Round.read(spec, request, arguments, wire, state_security)
        version, capabilities = round.protocol_version, round.capabilities
        modern = version is not None and stateless(version)
        for capability in spec.requires:  # in round 1, before the user answers anything
            if not supports(capabilities, capability):
                raise missing_capability(capability)
        probe = False
        if spec.task != "never":
            declared = modern and declares_tasks(capabilities)
            if spec.task == "required" and not declared:
                raise task_only(spec.name, version if not modern else None)
            if declared and not spec.mrtr_first:
                return await start_task(spec, services, round, Journal.start())
            probe = declared
            if not declared and not round.state and logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "flow %s: task=%r runs inline: the client did not declare the %s extension (%s)",
                    spec.name,
                    spec.task,
                    TASKS_EXTENSION,
                    "protocol " + str(version) if not modern else "no tasks capability",
                )
        if not modern:
            result = await call_flow(spec, FlowContext(LiveDriver(round.wire, spec.name), request), arguments)
        else:
            round.probe = probe
            # `params` already passed the SDK's validation (malformed inputResponses are -32602
            # before we run) and the boundary's unsealing (requestState is our plaintext).
            handler = services.handler
            if handler is None:
                handler = services.handler = chain(services.policies, lambda round: round_body(services, round))
            try:
                round.journal = load_journal(spec, round.state)
                result = await handler(round)
            except FlowError as exc:
                raise as_protocol_error(spec, exc) from exc
    except InputRefused as exc:
        return Refused(exc)
    except MCPError as exc:
        if exc.error.code == INVALID_PARAMS:
            logger.info("flow %s: refused the client's request: %s", spec.name, exc.error.message)
        return Unavailable(exc) if isinstance(exc, StoreUnavailable) else Rejected(exc)
    if isinstance(result, (InputRequiredResult, TaskStarted)):  # the engine's own answers; a C-level check
        return result
    return Value(result)


TASK_DIALECTS = frozenset({"draft"})
"""Seed dialects that carry tasks (seed 001's `params.task`); the others cannot hold one."""


def task_only(name: str, legacy_version: str | None) -> MCPError:
    """The refusal of a `task="required"` tool to a caller that did not ask for a task, worded for what it can do.

    - A 2026-07-28 client that did not declare the tasks extension can declare it: -32021
      with `requiredCapabilities`, as for any capability.
    - A session on an older protocol (`legacy_version`, e.g. 2025-11-25) cannot declare an
      extension, and a seed dialect other than seed 001's (`sketch`, `incomplete`, `saga`)
      cannot carry a task at all: it needs protocol 2026-07-28, that is, a newer client.
      -32022 (UnsupportedProtocolVersion), its `data` as the spec shapes it: `supported`
      (what this tool needs) and `requested` (what the caller speaks: its version, or its
      dialect's name).
    - Seed 001's draft wire carries tasks: it is told to send the call as one (`params.task`).
    """
    dialect = SEED_DIALECT.get()
    if dialect in TASK_DIALECTS:
        return MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message=f"{name!r} runs only as a task; send the call as a task (params.task)",
            data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        )
    requested = f"{dialect} (a seed dialect)" if dialect is not None else legacy_version
    if requested is None:
        return MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message=f"{name!r} runs only as a task; declare the {TASKS_EXTENSION} extension",
            data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        )
    speaks = f"the {dialect!r} seed dialect" if dialect is not None else f"protocol {legacy_version}"
    return MCPError(
        code=UNSUPPORTED_PROTOCOL_VERSION,
        message=(
            f"{name!r} runs only as a durable task, which needs protocol {LATEST_MODERN_VERSION} (its tasks "
            f"extension); this session speaks {speaks}, which cannot carry tasks: use a client that speaks "
            f"{LATEST_MODERN_VERSION}"
        ),
        data={"supported": [LATEST_MODERN_VERSION], "requested": requested},
    )


__all__ = [
    "TASK_DIALECTS",
    "Failure",
    "Outcome",
    "Refused",
    "Rejected",
    "Unavailable",
    "Value",
    "run_request",
    "task_only",
]
