"""Everything a client needs: drive multi round-trip calls and follow durable tasks.

    from mrtr.client import FlowClient

    async with FlowClient("https://tools.example/mcp", elicit=ask_the_user) as client:
        result = await client.call_tool("book_trip", {"city": "Lisbon"})

- `FlowClient`: calls a tool, prompt or resource through every `input_required` round, on
  mrtr's own per-request HTTP transport (or the SDK's session for stdio and legacy servers),
  reporting each `Round` to `on_round`; `tasks=True` follows durable tasks to their result.
- `TasksClient` (an SDK `ClientExtension` for `mcp.Client`) and `follow_task`, `get_task`,
  `update_task`, `cancel_task`: the tasks extension from any `ClientSession`.
- Errors: `TransportError` and its kinds (`GatewayError`, `TransportTimeout`, `LoadShed`,
  `LegacySessionRejected`), `RoundLimitExceeded`, `InputAbandoned`, `TaskCancelled`,
  `UnansweredInput`.

This package imports the SDK and mrtr's shared wire shapes only — never the engine, the
task runtime, the stores or the dialects — so a client process carries no server code.
"""

from mrtr._wire import IDEMPOTENCY_KEY, SHEDDING_EXTENSION, TASKS_EXTENSION
from mrtr.client._flowclient import FlowClient, InputAbandoned, Round, RoundLimitExceeded
from mrtr.client._tasks import (
    CreatedTask,
    TaskCancelled,
    TasksClient,
    TaskSnapshot,
    UnansweredInput,
    answer_with,
    cancel_task,
    follow_task,
    get_task,
    tasks_client,
    update_task,
)
from mrtr.client._transport import (
    NO_RETRY,
    GatewayError,
    LegacySessionRejected,
    LoadShed,
    RetryPolicy,
    TransportError,
    TransportTimeout,
)

__all__ = [
    "IDEMPOTENCY_KEY",
    "NO_RETRY",
    "SHEDDING_EXTENSION",
    "TASKS_EXTENSION",
    "CreatedTask",
    "FlowClient",
    "GatewayError",
    "InputAbandoned",
    "LegacySessionRejected",
    "LoadShed",
    "RetryPolicy",
    "Round",
    "RoundLimitExceeded",
    "TaskCancelled",
    "TaskSnapshot",
    "TasksClient",
    "TransportError",
    "TransportTimeout",
    "UnansweredInput",
    "answer_with",
    "cancel_task",
    "follow_task",
    "get_task",
    "tasks_client",
    "update_task",
]
