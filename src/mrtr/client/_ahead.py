"""Listening ahead: one listen stream watches the tasks a batch of fresh idempotency keys will create.

Following a task by a listen stream of its own costs a request per task, sent only once the
`tools/call` has answered with the task's id. A client that gives its calls idempotency keys
(`FlowClient` does, one per call) can do better with mrtr's `mrtr/taskKeys` opt-in (see
`mrtr.tasks._listen`): it opens one stream for a batch of keys it has not used yet, the server
answers with the task id each key will create (bound to the caller's principal), and every
change to those tasks is pushed on that stream from the moment they exist. A task is then
followed with no request but its `tools/call`, and the first pushed state needs no listen
round trip first.

A batch is opened for a tool once a call to it has created a task on this session (inline
tools never cost a stream), the next one a little before the current runs out, and a batch
closes when every key it handed out has been followed to its end, or when it has sat idle.
A server that does not echo `mrtr/taskKeys` is never asked again on that session; its calls
use plain keys and are followed as before (a stream per task, or polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import Callable

import mcp_types as t
from mcp.client.session import ClientSession
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError

from mrtr import _sdk as sdk
from mrtr._wire import SNAPSHOTS, TASK_KEYS
from mrtr.client._transport import TransportError

logger = logging.getLogger("mrtr.client.ahead")

BATCH = 64
"""Keys one stream watches (the server takes up to 256 tasks per stream)."""
REFILL = 16
"""When the current batch has fewer unused keys than this, the next stream is opened."""
IDLE = 30.0
"""Seconds a batch with nothing in flight stays open for further calls before it closes."""


class KeyBatch:
    """One listen stream and the idempotency keys it watches."""

    def __init__(self, tool: str, size: int = BATCH) -> None:
        self.tool = tool
        self.keys = [secrets.token_urlsafe(16) for _ in range(size)]
        self.unused = list(reversed(self.keys))
        self.task_ids: dict[str, str] = {}
        """Key -> the task id it creates, from the server's acknowledgement."""
        self.snapshots = False
        self.acked = asyncio.Event()
        """Set once acknowledged, or once it ended without (then `task_ids` is empty)."""
        self.in_use = 0
        self.closing = False
        self.ended = False
        self.changed = asyncio.Event()
        self.last_used = asyncio.get_running_loop().time()
        self.runner: asyncio.Task[None] | None = None

    def take(self) -> str:
        self.in_use += 1
        self.last_used = asyncio.get_running_loop().time()
        return self.unused.pop()

    def release(self) -> None:
        self.in_use -= 1
        self.last_used = asyncio.get_running_loop().time()
        self.changed.set()

    def done(self, idle: float) -> bool:
        """Nothing in flight, and no key left or none asked for a while."""
        quiet = asyncio.get_running_loop().time() - self.last_used >= idle
        return self.in_use == 0 and (not self.unused or quiet)


class Reservation:
    """A fresh idempotency key for one `tools/call`, and the batch stream watching its task (if any)."""

    def __init__(self, key: str, batch: KeyBatch | None = None) -> None:
        self.key = key
        self.batch = batch
        self._released = False

    async def watching(self, task_id: str, wait: float = 30.0) -> bool:
        """Whether this key's batch stream is open and watches `task_id` (waits for its acknowledgement)."""
        batch = self.batch
        if batch is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(batch.acked.wait(), wait)
        return not batch.ended and batch.task_ids.get(self.key) == task_id

    def release(self) -> None:
        """The call is over (followed to its end, or it made no task): its batch may close."""
        if self.batch is not None and not self._released:
            self._released = True
            self.batch.release()


class KeysAhead:
    """The batch streams of each session and tool; `on_end(batch)` wakes the followers of a batch."""

    def __init__(self, on_end: Callable[[KeyBatch], None], *, size: int = BATCH, idle: float = IDLE) -> None:
        self.size, self.idle, self._on_end = size, idle, on_end
        self._tools: weakref.WeakKeyDictionary[ClientSession, set[str]] = weakref.WeakKeyDictionary()
        self._batches: weakref.WeakKeyDictionary[ClientSession, dict[str, list[KeyBatch]]] = weakref.WeakKeyDictionary()
        self._refused: weakref.WeakSet[ClientSession] = weakref.WeakSet()
        self._runners: set[asyncio.Task[None]] = set()

    def makes_tasks(self, session: ClientSession, tool: str) -> None:
        """A call to `tool` created a task: watch its next calls ahead."""
        self._tools.setdefault(session, set()).add(tool)

    def reserve(self, session: ClientSession, tool: str) -> Reservation:
        """A key for the next call of `tool`: watched ahead where the server offers it."""
        if session in self._refused or tool not in self._tools.get(session, ()):
            return Reservation(secrets.token_urlsafe(16))
        batches = self._batches.setdefault(session, {}).setdefault(tool, [])
        live = [b for b in batches if not b.closing and not b.ended and b.unused]
        batch = live[0] if live else self._open(session, batches, tool)
        reservation = Reservation(batch.take(), batch)
        if len(live) < 2 and len(batch.unused) < min(REFILL, self.size // 4 + 1):
            self._open(session, batches, tool)  # the next stream is acknowledged before it is needed
        return reservation

    async def close(self, session: ClientSession, wait: float = 2.0) -> None:
        """Close this session's batch streams (the session is closing), waiting a little for them to end."""
        runners = []
        for batches in self._batches.pop(session, {}).values():
            for batch in batches:
                batch.closing = True
                batch.changed.set()
                if batch.runner is not None:
                    runners.append(batch.runner)
        if runners:
            await asyncio.wait(runners, timeout=wait)

    def _open(self, session: ClientSession, batches: list[KeyBatch], tool: str) -> KeyBatch:
        batch = KeyBatch(tool, self.size)
        batches.append(batch)
        runner = batch.runner = asyncio.get_running_loop().create_task(self._run(session, batches, batch))
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)
        return batch

    async def _run(self, session: ClientSession, batches: list[KeyBatch], batch: KeyBatch) -> None:
        notifications = {TASK_KEYS: [{"tool": batch.tool, "key": key} for key in batch.keys], SNAPSHOTS: True}
        try:
            async with sdk.listen_stream(session, notifications, on_end=batch.changed.set) as stream:
                acked = stream.honored.model_extra or {}
                pairs = acked.get(TASK_KEYS)
                if not isinstance(pairs, list):
                    self._refused.add(session)  # a server without the opt-in: plain keys from now on
                    return
                batch.task_ids = {
                    p["key"]: p["taskId"]
                    for p in pairs
                    if isinstance(p, dict) and isinstance(p.get("key"), str) and isinstance(p.get("taskId"), str)
                }
                batch.snapshots = acked.get(SNAPSHOTS) is True
                batch.acked.set()
                while not stream.ended.is_set() and not batch.closing and not batch.done(self.idle):
                    batch.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(batch.changed.wait(), self.idle)
                batch.closing = True
        except ListenNotSupportedError:
            self._refused.add(session)
        except MCPError as error:
            if error.error.code in (t.METHOD_NOT_FOUND, t.MISSING_REQUIRED_CLIENT_CAPABILITY, t.INVALID_PARAMS):
                self._refused.add(session)
        except (SubscriptionLost, TransportError, TimeoutError, OSError):
            pass  # its followers fall back to streams of their own; the next call opens a new batch
        except Exception:  # never let a background stream's surprise go unseen
            logger.exception("listen-ahead stream for %r failed", batch.tool)
        finally:
            batch.ended = batch.closing = True
            batch.acked.set()
            with contextlib.suppress(ValueError):
                batches.remove(batch)
            self._on_end(batch)


__all__ = ["BATCH", "IDLE", "SNAPSHOTS", "TASK_KEYS", "KeyBatch", "KeysAhead", "Reservation"]
