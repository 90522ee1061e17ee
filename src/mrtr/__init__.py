"""mrtr: await-style multi round-trip flows for MCP servers that run on a stateless fleet.

    from mcp.server.mcpserver import MCPServer
    import mrtr

    server = MCPServer("expenses", request_state_security=...)
    flows = mrtr.Flows(server)

    @flows.tool()
    async def submit(ctx: mrtr.FlowContext, amount: float) -> str:
        approval = await ctx.elicit(f"Approve {amount}?", Approval)
        ...

The server API is this module; the rest of the public surface is `mrtr.client` (everything
a client needs), `mrtr.tasks` (the tasks extension and its runtime), `mrtr.stores` and
`mrtr.buses` (where tasks and listen events live on a fleet), `mrtr.temporal`,
`mrtr.fastmcp` (the same flows on a FastMCP server), `mrtr.testing`, `mrtr.tracing` and
`mrtr.cli`. Modules whose names start with `_` are
private. Names load on first use: `import mrtr` imports no engine and changes nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mrtr._engine.asks import Capability
    from mrtr._engine.context import FlowContext, gather, step
    from mrtr._engine.steps import StepInfo, current_step
    from mrtr._errors import (
        Cancelled,
        Declined,
        EventNotDelivered,
        EventTimeout,
        FlowDefinitionError,
        FlowError,
        FlowExpired,
        FlowSuspended,
        InputRefused,
        NondeterminismError,
        StateTooLarge,
        StepResultError,
        StoreUnavailable,
        TooManyRounds,
    )
    from mrtr._flows import Flows
    from mrtr._guard import ReplayGuard, open_guard
    from mrtr._host.options import FlowOptions, FlowsOptions, ToolOptions
    from mrtr._shedding import LoadShedder
    from mrtr.buses import BrokerBus, open_bus
    from mrtr.stores import PostgresStore, RedisStore, SQLiteStore, TaskRecord, TaskStore, open_store

_EXPORTS = {
    "BrokerBus": "mrtr.buses",
    "Cancelled": "mrtr._errors",
    "Capability": "mrtr._engine.asks",
    "Declined": "mrtr._errors",
    "EventNotDelivered": "mrtr._errors",
    "EventTimeout": "mrtr._errors",
    "FlowContext": "mrtr._engine.context",
    "FlowDefinitionError": "mrtr._errors",
    "FlowError": "mrtr._errors",
    "FlowExpired": "mrtr._errors",
    "FlowSuspended": "mrtr._errors",
    "FlowOptions": "mrtr._host.options",
    "Flows": "mrtr._flows",
    "FlowsOptions": "mrtr._host.options",
    "InputRefused": "mrtr._errors",
    "LoadShedder": "mrtr._shedding",
    "NondeterminismError": "mrtr._errors",
    "PostgresStore": "mrtr.stores",
    "RedisStore": "mrtr.stores",
    "ReplayGuard": "mrtr._guard",
    "SQLiteStore": "mrtr.stores",
    "StateTooLarge": "mrtr._errors",
    "StepInfo": "mrtr._engine.steps",
    "StepResultError": "mrtr._errors",
    "StoreUnavailable": "mrtr._errors",
    "TaskRecord": "mrtr.stores",
    "TaskStore": "mrtr.stores",
    "ToolOptions": "mrtr._host.options",
    "TooManyRounds": "mrtr._errors",
    "current_step": "mrtr._engine.steps",
    "gather": "mrtr._engine.context",
    "step": "mrtr._engine.context",
    "open_bus": "mrtr.buses",
    "open_guard": "mrtr._guard",
    "open_store": "mrtr.stores",
}

__all__ = [
    "BrokerBus",
    "Cancelled",
    "Capability",
    "Declined",
    "EventNotDelivered",
    "EventTimeout",
    "FlowContext",
    "FlowDefinitionError",
    "FlowError",
    "FlowExpired",
    "FlowOptions",
    "FlowSuspended",
    "Flows",
    "FlowsOptions",
    "InputRefused",
    "LoadShedder",
    "NondeterminismError",
    "PostgresStore",
    "RedisStore",
    "ReplayGuard",
    "SQLiteStore",
    "StoreUnavailable",
    "StateTooLarge",
    "StepInfo",
    "StepResultError",
    "TaskRecord",
    "TaskStore",
    "ToolOptions",
    "TooManyRounds",
    "current_step",
    "gather",
    "open_bus",
    "open_guard",
    "open_store",
    "step",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mrtr' has no attribute {name!r}")
    if name == "Flows":
        from mrtr._sdk import track_default_keys

        track_default_keys()  # before the user's server is built: see `mrtr._sdk.uses_process_local_key`
    value = getattr(import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    """The public names, once each: not this module's own imports (`Any`, `import_module`, ...),
    and not a name twice once it has been resolved into the module's globals."""
    return sorted({*__all__, "__version__"})
