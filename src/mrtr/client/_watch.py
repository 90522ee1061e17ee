"""Following a task by listening: `notifications/tasks` instead of `tasks/get` polls.

`TaskFeed` is what a tasks client uses when the server offers task notifications. For one
task it opens `subscriptions/listen` with `notifications.taskIds` and yields the task's
states as they are pushed, so the client hears of a change the moment it is committed,
on whichever instance, and sends no polls.

It never misses a change:
- the client's interest is registered before the listen request is sent, and the server
  subscribes to its bus before it loads the task: the acknowledgement is followed by the
  task's state at that moment (mrtr's `mrtr/taskSnapshots` opt-in), or, when a server does
  not echo that opt-in, by one `tasks/get`;
- a stream that ends or drops (a broker restart, an instance gone) is followed by one
  `tasks/get` (a terminal state is never lost) and, after bounded, jittered backoff, a new
  listen; a stale state that arrives after a newer one (by `_meta["mrtr/taskVersion"]`) is
  dropped; a stream quiet for `resync` seconds is checked with one `tasks/get`.
When the server does not offer task notifications (no `subscriptions/listen`, or an
acknowledgement without the task's id) the feed says so with `NotOffered`, once per
session, and the client polls as before.

A client that picks its calls' idempotency keys (`FlowClient`) reserves them here
(`reserve`): then one stream watches a whole batch of tasks before they exist
(`mrtr.client._ahead`), and a follower whose key is watched opens no stream of its own.
States that arrive before their follower (a fast task's, pushed before its `tools/call`
answered) are kept for it, a bounded number of them.
"""

from __future__ import annotations

import asyncio
import secrets
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import AsyncGenerator, Awaitable, Callable

import mcp_types as t
from mcp.client.extension import NotificationBinding
from mcp.client.session import ClientSession
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError

from mrtr import _sdk as sdk
from mrtr._wire import SNAPSHOTS, TASK_IDS, TERMINAL, DetailedTask, TaskNotice
from mrtr.client._ahead import KeyBatch, KeysAhead, Reservation
from mrtr.client._transport import RetryPolicy, TransportError

_NOT_OFFERED = frozenset({t.METHOD_NOT_FOUND, t.MISSING_REQUIRED_CLIENT_CAPABILITY, t.INVALID_PARAMS})
"""Listen answers that mean "poll instead" (an unknown task: `tasks/get` then reports it)."""
_BACKOFF = RetryPolicy(initial_delay=0.05, max_delay=2.0)
_STABLE = 5.0  # seconds a stream must have lived for its end to start the backoff over
_EARLY = 256  # pushed states kept for followers that have not started yet


class NotOffered(Exception):
    """The server does not push this task's notifications: poll."""


class _Watch:
    """The newest state of one task this follower has not consumed yet."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.pending: DetailedTask | None = None
        self.version: int | None = None
        self.terminal = False

    def offer(self, task: DetailedTask, version: int | None) -> None:
        if self.terminal or (version is not None and self.version is not None and version <= self.version):
            return  # nothing follows a terminal state; an older state arrived late
        if version is not None:
            self.version = version
        self.terminal = task.status in TERMINAL
        self.pending = task
        self.wake.set()

    def take(self) -> DetailedTask | None:
        task, self.pending = self.pending, None
        return task


class TaskFeed:
    """Routes `notifications/tasks` to the followers of each task; opens their listen streams."""

    def __init__(self, resync: float = 10.0) -> None:
        self.resync = resync
        """Seconds without a pushed state after which one `tasks/get` is made anyway: a fleet whose
        instances share no bus (the SDK's in-memory default on each) pushes only what the
        listening instance itself changed, and a client must not wait forever for the rest."""
        self._watches: dict[str, set[_Watch]] = defaultdict(set)
        self._refused: weakref.WeakSet[ClientSession] = weakref.WeakSet()
        self._early: OrderedDict[str, tuple[DetailedTask, int | None]] = OrderedDict()
        self.ahead = KeysAhead(on_end=self._batch_ended)
        """Batch streams that watch tasks before they exist (see `reserve`)."""

    def binding(self) -> NotificationBinding[TaskNotice]:
        """The `ClientExtension.notifications()` entry that feeds this router."""
        return NotificationBinding(method="notifications/tasks", params_type=TaskNotice, handler=self.receive)

    async def receive(self, notice: TaskNotice) -> None:
        task = notice.task()
        if task is None:
            return
        task_id, version = task.task_id, notice.version()
        watches = self._watches.get(task_id)
        if not watches:  # its follower has not started yet (or has finished): keep the newest for it
            kept = self._early.pop(task_id, None)
            if kept is None or kept[1] is None or version is None or version > kept[1]:
                kept = (task, version)
            self._early[task_id] = kept
            while len(self._early) > _EARLY:
                self._early.popitem(last=False)
            return
        for watch in list(watches):
            watch.offer(task, version)

    def reserve(self, session: ClientSession, tool: str) -> Reservation:
        """An idempotency key for one call of `tool`, watched ahead by a batch stream where it can be.

        Call `makes_tasks` once a call of the tool created a task, give the reservation to
        `states` (through `follow_task`), and `release()` it when the call is over.
        """
        if session in self._refused:  # no task notifications at all: a plain key, and polls
            return Reservation(secrets.token_urlsafe(16))
        return self.ahead.reserve(session, tool)

    def makes_tasks(self, session: ClientSession, tool: str) -> None:
        self.ahead.makes_tasks(session, tool)

    async def close(self, session: ClientSession) -> None:
        """The session is closing: close its batch streams."""
        await self.ahead.close(session)

    def _batch_ended(self, batch: KeyBatch) -> None:
        for task_id in batch.task_ids.values():
            for watch in self._watches.get(task_id, ()):
                watch.wake.set()

    def offered(self, session: ClientSession) -> bool:
        """False once this session's server showed it does not push task notifications."""
        return session not in self._refused

    async def states(
        self,
        session: ClientSession,
        task_id: str,
        fetch: Callable[[], Awaitable[DetailedTask]],
        reservation: Reservation | None = None,
    ) -> AsyncGenerator[DetailedTask]:
        """The task's states as they change, until the caller stops; `NotOffered` means poll.

        With the `reservation` whose key created the task, its batch stream (if it watches the
        task) is followed first; a stream of the task's own takes over if that one ends.
        """
        if session in self._refused:
            raise NotOffered
        watch = _Watch()
        self._watches[task_id].add(watch)
        if (early := self._early.pop(task_id, None)) is not None:
            watch.offer(*early)
        failures = 0
        try:
            if reservation is not None and await reservation.watching(task_id):
                batch = reservation.batch
                assert batch is not None
                if not batch.snapshots:
                    watch.offer(await fetch(), None)  # the server sent no state from before the acknowledgement
                while (task := await self._next(watch, lambda: batch.ended, fetch)) is not None:
                    yield task
                watch.offer(await fetch(), None)  # the batch stream ended: catch up, then listen alone
                if (task := watch.take()) is not None:
                    yield task
            while True:
                opened = asyncio.get_running_loop().time()
                try:
                    filter_ = {TASK_IDS: [task_id], SNAPSHOTS: True}
                    async with sdk.listen_stream(session, filter_, on_end=watch.wake.set) as stream:
                        acked = stream.honored.model_extra or {}
                        if task_id not in (acked.get(TASK_IDS) or ()):
                            self._refused.add(session)
                            raise NotOffered
                        if acked.get(SNAPSHOTS) is not True:
                            watch.offer(await fetch(), None)  # refetch after the acknowledgement
                        while (task := await self._next(watch, stream.ended.is_set, fetch)) is not None:
                            yield task
                except ListenNotSupportedError:
                    self._refused.add(session)
                    raise NotOffered from None
                except MCPError as error:
                    if error.error.code in _NOT_OFFERED:
                        if error.error.code != t.INVALID_PARAMS:
                            self._refused.add(session)
                        raise NotOffered from error
                except (SubscriptionLost, TransportError, TimeoutError, OSError):
                    pass
                if asyncio.get_running_loop().time() - opened > _STABLE:
                    failures = 0  # it had been up a while: this is a new incident, not the same one
                # The stream is gone: catch up with one tasks/get (a terminal state is never
                # lost), then listen again after a bounded, jittered pause.
                watch.offer(await fetch(), None)
                if (task := watch.take()) is not None:
                    yield task
                await asyncio.sleep(_BACKOFF.delay(failures))
                failures += 1
        finally:
            self._early.pop(task_id, None)
            watches = self._watches.get(task_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[task_id]

    async def _next(
        self, watch: _Watch, ended: Callable[[], bool], fetch: Callable[[], Awaitable[DetailedTask]]
    ) -> DetailedTask | None:
        """The next state pushed for this watch; None once its stream has ended."""
        while True:
            if (task := watch.take()) is not None:
                return task
            if ended():
                return None
            watch.wake.clear()
            try:
                await asyncio.wait_for(watch.wake.wait(), self.resync)
            except TimeoutError:  # quiet for long: look, in case no fleet bus links us
                watch.offer(await fetch(), None)


__all__ = ["NotOffered", "Reservation", "TaskFeed"]
