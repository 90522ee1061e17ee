"""mrtr: await-style multi round-trip flows for MCP servers that run on a stateless fleet.

Read top-down (the data path request -> engine -> journal -> result):

- `flows`: `Flows` registers flow functions as the SDK's tools, prompts and resources.
- `spec`: what a flow is (`FlowSpec`, `Limits`) and the shapes of the services it may use.
- `engine`: one request (or one run of a task): load the journal, run, answer.
- `replay` + `drivers`: one run against the journal; `branches` names concurrent tasks,
  `quiescence` tells when a round is over, `steps` runs and journals side effects.
- `journal`: what a flow remembers, and its compact encoding.
- `context` (what a flow awaits), `asks` (questions on the wire), `errors`.
- Under load and attack: `guard` (single-use rounds), `shedding` (state-only results).
- `tasks/`: durable tasks — `wire`, `extension`, `engine` (the task-engine seam), `runtime` +
  `lease_ops` + `checkpoints` (the lease runtime), `outcome`, `events` + `listen` + `watch` +
  `ahead` (task notifications, served and followed), `seed_dialect`, `client`; `stores/`: where they live
  (SQLite, Redis, PostgreSQL); `temporal/`: or on Temporal (`mrtr[temporal]`); `buses/`: listen
  events across a fleet, over Redis or PostgreSQL (`open_bus`).
- Clients: `client` (`FlowClient`), `client_transport`, `client_connect`; `backoff` (retry waits,
  shared with the buses).
- `sdk`: the one place mrtr touches the official SDK's internals. `tracing`, `testing`, `cli/`.
"""

from mrtr.asks import Capability
from mrtr.buses import BrokerBus, open_bus
from mrtr.context import FlowContext
from mrtr.errors import (
    Cancelled,
    Declined,
    FlowDefinitionError,
    FlowError,
    FlowExpired,
    FlowSuspended,
    InputRefused,
    NondeterminismError,
    StateTooLarge,
    TooManyRounds,
)
from mrtr.flows import Flows
from mrtr.guard import ReplayGuard, open_guard
from mrtr.shedding import LoadShedder
from mrtr.steps import StepInfo, current_step
from mrtr.stores import TaskRecord, TaskStore, open_store

__all__ = [
    "BrokerBus",
    "Cancelled",
    "Capability",
    "Declined",
    "FlowContext",
    "FlowDefinitionError",
    "FlowError",
    "FlowExpired",
    "FlowSuspended",
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
    "open_bus",
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
