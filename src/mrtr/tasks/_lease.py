"""What the lease runtime and its worker share: one `LeaseContext`, built by the runtime.

The runtime (`mrtr.tasks._runtime`: the engine's API) and the worker (`mrtr.tasks._worker`:
the scanner and the runs) both read and write tasks through the same store, on the same
clock, under the same lease, for the same flows, and report committed states to the same
place. That is this object; neither holds the other's. The runtime reaches the worker one
way only (launch a run, wake a task, stop a local run), and the worker never reaches back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from mrtr._wire import TaskView
from mrtr.stores._abilities import has_clock
from mrtr.stores._sealed import RecordSeal, SealedStore
from mrtr.tasks._seam import ConvertResult

if TYPE_CHECKING:
    from mrtr._engine.spec import FlowSpec
    from mrtr.stores import TaskStore
    from mrtr.tasks._callbacks import CallbackUrls

Report = Callable[[TaskView], Awaitable[None]]
"""Where committed states go (the engine's `changed`, hence its `on_change`)."""

Wake = Callable[[str], Awaitable[bool]]
"""Claim the task now and run it here if it is claimable; whether it was."""


async def _nowhere(task: TaskView) -> None:
    """A context built without an engine (a worker on its own, in tests) reports to no one."""


class LeaseContext:
    """The store, clock, lease, flows, callback URLs and report hook the runtime and worker share.

    Args:
        store: Where tasks live (its records' payload sealed or not): what the fleet shares.
        lease: Seconds a worker may go silent before another instance takes its task over.
        seal: Seal every record's payload at rest with this key ring; None: plain records.
        report: Called with each state the runtime or the worker commits.
        callbacks: Mints `ctx.callback_url` URLs (None: a flow that asks for one fails).

    `now()` is the store's clock (Redis `TIME`, PostgreSQL `clock_timestamp()`, the SQLite
    host's clock) as last measured: this host's clock plus an offset that `sync_clock` measures
    against the store (error: half a store round trip plus the drift since).
    """

    def __init__(
        self,
        store: TaskStore,
        *,
        lease: float,
        seal: RecordSeal | None = None,
        report: Report = _nowhere,
        callbacks: CallbackUrls | None = None,
    ) -> None:
        self.plain_store = store
        """The store as given (its records' payload sealed or not): what the fleet shares."""
        self.seal = seal
        # Without a ring of its own the context still goes through `SealedStore`: it writes plain
        # records, and refuses (`RecordSealed`) a sealed one it cannot open rather than run its
        # flow from an empty journal or write an event beside a payload it cannot see.
        self.store: TaskStore = SealedStore(store, seal or RecordSeal(None))
        """The store the runtime and worker read and write through: sealing on the way in and out."""
        self.lease = lease
        self.report = report
        self.callbacks = callbacks
        self.flows: dict[str, tuple[FlowSpec, ConvertResult]] = {}
        """The flows this instance serves, by name."""
        self.local_clock: Callable[[], float] = time.time
        """This host's wall clock (replaceable in tests to simulate a skewed host)."""
        self.clock_offset = 0.0
        self.clock_synced = False

    def use_seal(self, seal: RecordSeal) -> None:
        """Seal records at rest from now on: every read opens (plain records too), every write seals."""
        self.seal = seal
        self.store = SealedStore(self.plain_store, seal)

    def now(self) -> float:
        """Epoch seconds on the store's clock, as last measured (see the class docstring)."""
        return self.local_clock() + self.clock_offset

    async def sync_clock(self) -> None:
        """Measure this host's offset from the store's clock (stores without `clock()`: none)."""
        store = self.store
        if not has_clock(store):
            self.clock_synced = True
            return
        before = self.local_clock()
        store_time = await store.clock()
        after = self.local_clock()
        self.clock_offset = store_time - (before + after) / 2
        self.clock_synced = True


__all__ = ["LeaseContext", "Report", "Wake"]
