"""`BaseFlows`: what both `Flows` show their users, over one `HostCore`.

As httpx's `Client` and `AsyncClient` stand on one `BaseClient`, `mrtr.Flows` and
`mrtr.fastmcp.Flows` stand on this class: the attributes and `send_event` are written once,
so they read the same on both hosts. What differs (the decorators' framework metadata, the
app each builds) lives in each host's own class.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server.subscriptions import SubscriptionBus

    from mrtr._engine.spec import FlowSpec
    from mrtr._guard import ReplayGuard
    from mrtr._host.core import HostCore
    from mrtr._shedding import LoadShedder
    from mrtr.tasks._seam import TaskEngine


class BaseFlows:
    """The public face both `Flows` share (see the module docstring)."""

    _core: HostCore

    @property
    def specs(self) -> Mapping[str, FlowSpec]:
        """Every flow registered here, by name (`mrtr.testing` looks flows up in it)."""
        return MappingProxyType(self._core.specs)

    @property
    def runtime(self) -> TaskEngine:
        """The task engine: mrtr's lease runtime unless `tasks=` gave another (created, with the
        tasks extension, on first need)."""
        return self._core.engine()

    @property
    def bus(self) -> SubscriptionBus | None:
        """The bus listen streams and task notifications ride (None until a task engine exists)."""
        return self._core.bus

    @property
    def replay_guard(self) -> ReplayGuard | None:
        """The guard that makes every round single-use fleet-wide (None: rounds are not guarded)."""
        return self._core.replay_guard

    @property
    def shedder(self) -> LoadShedder | None:
        """The load shedder (None unless a shedding option was given); its counters say what it did."""
        return self._core.shedder

    @property
    def instance_name(self) -> str | None:
        """Sent as `X-Mrtr-Instance` on every response of the app `Flows` builds (None: no header)."""
        return self._core.options.instance_name

    async def send_event(self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None) -> bool:
        """Deliver event `name` with a JSON `payload` to a durable task, from any instance.

        The task's `ctx.wait_for_event(name)` returns `payload`; an event that comes before
        the flow waits for it is kept in the task's record until it does. Idempotent per
        `event_id`: a resend returns False and changes nothing (None: a fresh id, so every
        call delivers).

        Raises:
            mrtr.EventNotDelivered: The task is unknown or expired, or finished.
            ValueError: A malformed name, or a payload that is not JSON or too large.
        """
        return await self._core.send_event(task_id, name, payload, event_id=event_id)


__all__ = ["BaseFlows"]
