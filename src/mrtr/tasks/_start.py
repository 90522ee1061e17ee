"""Starting a task: the host's half of the seam, and the opening every engine shares.

`HostStarter` is what the engine's `Services.tasks` is (`mrtr._engine.spec.TaskStarter`): the
engine hands it the call's raw request, and it reads that once into a `Creator` (principal and
`mrtr/idempotencyKey`) for `TaskEngine.start`. The engine never sees a tasks type, and a task
engine never sees the request.

`NewTask` is the opening of every engine's `start`: the id (random, or derived from creator,
tool and key), the arguments, capabilities and journal as a task keeps them, its TTL and poll
interval; and, when a keyed create finds its id taken, what the resend answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ClientCapabilities

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal
from mrtr._engine.spec import FlowSpec
from mrtr._wire import CreateTaskResult, TaskView
from mrtr.tasks._records import created_result, keyed_task_id, new_task_id
from mrtr.tasks._seam import Creator, EngineOptions, TaskCall, TaskEngine


class HostStarter:
    """Turns a call into a task on `engine`, for the creator its request names (`Services.tasks`)."""

    def __init__(self, engine: TaskEngine) -> None:
        self.engine = engine

    async def start(
        self,
        spec: FlowSpec,
        arguments: Mapping[str, Any],
        capabilities: ClientCapabilities | None,
        journal: Journal,
        request: Any = None,
    ) -> CreateTaskResult:
        """`engine.start` for the request's principal and idempotency key (none without a request)."""
        creator = Creator.of(request, self.engine.owner_of)
        return await self.engine.start(TaskCall(spec, arguments, capabilities, journal), creator)


class KeptTask(TaskView, Protocol):
    """A task as its engine keeps it, arguments included (what a keyed resend is compared with)."""

    @property
    def arguments(self) -> Mapping[str, Any]: ...


class KeptFields(TypedDict):
    """What every engine keeps of a new task, as its own record's fields (`TaskRecord`, Temporal's `TaskStart`)."""

    task_id: str
    flow: str
    arguments: dict[str, Any]
    capabilities: dict[str, Any]
    """The client capabilities declared by the creating request (wire JSON)."""
    journal: str
    """The flow's journal so far (inline rounds before it became a task), encoded."""
    owner: str | None
    created_at: float
    ttl_ms: int | None
    poll_interval_ms: int


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task about to be created, whatever engine keeps it (see the module docstring)."""

    kept: KeptFields
    """Its fields, as the engine's record of it starts."""
    key: str | None
    """The creator's `mrtr/idempotencyKey` (None: the id is random)."""

    @classmethod
    def of(cls, call: TaskCall, creator: Creator, options: EngineOptions, now: float) -> NewTask:
        """The task `creator` asks for: with a key, its id is the one (creator, tool, key) maps to."""
        call.journal.pending = {}  # the questions of an inline round are not the task's
        key, capabilities, flow = creator.idempotency_key, call.capabilities, call.spec.name
        kept = KeptFields(
            task_id=new_task_id() if key is None else keyed_task_id(creator.owner, flow, key),
            flow=flow,
            arguments=dict(call.arguments),
            capabilities=capabilities.model_dump(mode="json", by_alias=True, exclude_none=True) if capabilities else {},
            journal=journal_codec.encode(call.journal),
            owner=creator.owner,
            created_at=now,
            ttl_ms=options.ttl_ms,
            poll_interval_ms=options.poll_interval_ms,
        )
        return cls(kept, key)

    def resent(self, existing: KeptTask) -> CreateTaskResult:
        """A keyed create found its id taken by `existing`: the same call resent after a lost
        answer gets the task the first attempt created; another call under the key is refused."""
        if _digest(existing.arguments) != _digest(self.kept["arguments"]):
            raise MCPError(
                code=INVALID_PARAMS,
                message="mrtr/idempotencyKey was already used for a call with other arguments",
                data={"reason": "idempotency_key_reused"},
            )
        return created_result(existing)


def _digest(arguments: Mapping[str, Any]) -> str:
    """Arguments as a task keeps them (JSON), so a resend compares alike whichever engine kept them."""
    return hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode()).hexdigest()


__all__ = ["HostStarter", "KeptFields", "KeptTask", "NewTask"]
