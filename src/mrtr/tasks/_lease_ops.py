"""The lease runtime's side of the `TaskEngine` seam: read, answer and cancel tasks in the store.

Every change is a compare-and-set on the stored record, retried when another instance (or
the worker running the task) wrote in between, so any instance sharing the store serves any
task. Mixed into `mrtr.tasks._runtime.TaskRuntime`; the wire checks stay in the extension.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mrtr.tasks._seam import StateChanges, busy

if TYPE_CHECKING:
    from mrtr.stores import TaskRecord, TaskStore

_CAS_RETRIES = 20


class LeaseOperations(StateChanges):
    """`get`, `update` and `cancel` over the `TaskStore` (see `mrtr.tasks._seam.TaskEngine`)."""

    store: TaskStore

    if TYPE_CHECKING:  # provided by TaskRuntime

        def now(self) -> float: ...

        async def try_claim(self, task_id: str) -> bool: ...

        def cancel_local(self, task_id: str) -> bool: ...

        def ensure_scanning(self) -> None: ...

    def ensure_running(self) -> None:
        self.ensure_scanning()

    async def get(self, task_id: str) -> TaskRecord | None:
        return await self.store.load(task_id, self.now())

    async def update(
        self, task_id: str, answers: Mapping[str, Any], asked: Mapping[str, Any], known: TaskRecord | None = None
    ) -> None:
        record = known if known is not None else await self.get(task_id)
        for _ in range(_CAS_RETRIES):
            if record is None:
                return
            outstanding = record.input_requests if record.status == "input_required" else {}
            accepted = {k: v for k, v in answers.items() if k in outstanding and outstanding[k] == asked.get(k)}
            if not accepted:
                return
            remaining = {k: v for k, v in outstanding.items() if k not in accepted}
            changed = record.copy(
                responses=record.responses | accepted,
                input_requests=remaining,
                status="input_required" if remaining else "working",
                updated_at=self.now(),
            )
            if await self.store.save(changed):
                await self.changed(changed)
                if not remaining:
                    await self.try_claim(changed.task_id)  # resume here, at once
                return
            record = await self.get(task_id)
        raise busy("update")

    async def cancel(self, task_id: str, known: TaskRecord | None = None) -> None:
        record = known if known is not None else await self.get(task_id)
        for _ in range(_CAS_RETRIES):
            if record is None or record.terminal or record.cancel_requested:
                return  # idempotent, also on finished tasks
            now = self.now()
            running_somewhere = record.status == "working" and record.lease_until >= now
            changed = record.copy(cancel_requested=True, updated_at=now)
            if not running_somewhere:
                changed = changed.copy(status="cancelled", input_requests={}, lease_owner=None, lease_until=0.0)
            if await self.store.save(changed):
                await self.changed(changed)
                if running_somewhere:
                    self.cancel_local(record.task_id)  # elsewhere: its heartbeat sees the flag
                return
            record = await self.get(task_id)
        raise busy("cancel")


__all__ = ["LeaseOperations"]
