"""mrtr: await-style multi round-trip flows for MCP servers that run on a stateless fleet.

Read top-down: `flows` (registration) -> `engine` (one request, or one run of a task) ->
`drivers` + `replay` (one run against the journal) -> `journal` (what is remembered).
`context` is what a flow awaits, `asks` how questions look on the wire, `errors` what can
go wrong. Durable tasks: `tasks` (the extension's wire methods) -> `worker` (leases,
resumption) -> `stores` (SQLite, Redis, PostgreSQL). Clients: `client`, `task_client`.
Under load and attack: `guard` (single-use rounds), `shedding` (state-only results when overloaded).
"""

from mrtr.asks import Capability
from mrtr.context import FlowContext, StepInfo, current_step
from mrtr.errors import (
    Cancelled,
    Declined,
    FlowDefinitionError,
    FlowError,
    FlowExpired,
    InputRefused,
    NondeterminismError,
    StateTooLarge,
    TooManyRounds,
)
from mrtr.flows import Flows
from mrtr.guard import ReplayGuard, open_guard
from mrtr.shedding import LoadShedder
from mrtr.stores import TaskRecord, TaskStore, open_store

__all__ = [
    "Cancelled",
    "Capability",
    "Declined",
    "FlowContext",
    "FlowDefinitionError",
    "FlowError",
    "FlowExpired",
    "Flows",
    "InputRefused",
    "LoadShedder",
    "ReplayGuard",
    "PostgresStore",
    "RedisStore",
    "SQLiteStore",
    "TaskRecord",
    "TaskStore",
    "NondeterminismError",
    "StateTooLarge",
    "StepInfo",
    "TooManyRounds",
    "current_step",
    "open_guard",
    "open_store",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # Store backends load their drivers (redis, psycopg) only when asked for.
    if name in ("SQLiteStore", "RedisStore", "PostgresStore"):
        from mrtr import stores

        return getattr(stores, name)
    raise AttributeError(f"module 'mrtr' has no attribute {name!r}")
