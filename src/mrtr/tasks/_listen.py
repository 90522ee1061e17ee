"""`subscriptions/listen` with the tasks extension's `notifications.taskIds`, on any bus.

The SDK's `ListenHandler` knows the core filter only (list changes, resource URIs) and lets
unknown keys fall out of its acknowledgement. This handler serves the same stream the same
way (acknowledgement first, every frame stamped with the subscription id, bounded backlog,
no replay) and adds the extension's filter:

- `notifications.taskIds`: each id is checked exactly as `tasks/get` checks it (the tasks
  extension declared on the request, else -32021; another principal's or an unknown task is
  refused). The acknowledgement lists only the accepted ids; when none is accepted, the
  request fails with the error `tasks/get` would give for the first.
- `notifications["mrtr/taskSnapshots"]: true` (mrtr's opt-in, echoed when honoured): right
  after the acknowledgement, one `notifications/tasks` per accepted task with its state at
  that moment, so a client needs no `tasks/get` to catch up. Without it clients refetch.
- `notifications["mrtr/taskKeys"]: [{"tool", "key"}, ...]` (mrtr's opt-in): watch the tasks
  this client *will* create with these idempotency keys (`_meta["mrtr/idempotencyKey"]`).
  Each is the task id `tools/call` derives from (the caller's principal, tool, key), so it
  belongs to the caller by construction and is accepted before the task exists. The
  acknowledgement echoes each pair with its `taskId`. A client keeps one stream open for a
  batch of keys it has not used yet: a task is then followed with no request but its
  `tools/call` (one listen instead of one per task, no wait for the listen before the create).

Every `notifications/tasks` carries `_meta["mrtr/taskVersion"]`, the record's store version,
so a client can drop a stale state that arrives after a newer one. A `BusGap` that knows
nothing of what was lost (the fleet bus reconnected, or events went missing in transit) ends
the stream with an error, so clients re-listen and refetch instead of waiting for an event
that never comes. A `BusGap` that names what was lost (a sender dropped events and said about
what) reaches only the streams watching one of those things, and each refetches for its
client at once, without ending: a task's state is read from the store and sent if newer than
what the stream sent; a resource URI or a list gets its level-triggered notification again
(the SDK's own signal to refetch). Only if that read fails does the stream end.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.streams.memory
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from mrtr import _sdk as sdk
from mrtr._errors import StoreUnavailable
from mrtr._telemetry import metrics
from mrtr._wire import SNAPSHOTS, TASK_IDS, TASK_KEYS, TASK_VERSION
from mrtr.buses._events import BusGap, TaskChanged
from mrtr.tasks._extension import valid_idempotency_key
from mrtr.tasks._records import detailed_task, keyed_task_id, same_owner

if TYPE_CHECKING:
    from mrtr._wire import TaskView
    from mrtr.tasks._extension import TasksExtension

logger = logging.getLogger("mrtr.tasks.listen")

MAX_TASK_IDS = 256
"""The most tasks one stream may watch: `taskIds` and `mrtr/taskKeys` together."""
_BUS_READY_WAIT = 5.0  # seconds a listen waits for a reconnecting fleet bus before refusing


class ListenHandler:
    """Serves `subscriptions/listen` (core filter plus `taskIds`); see the module docstring.

    Args:
        bus: The server's `SubscriptionBus`.
        tasks: The tasks extension whose checks `taskIds` pass (None: task ids are not honoured).
        max_subscriptions, max_buffered_events: As the SDK's `ListenHandler`.
    """

    def __init__(
        self,
        bus: SubscriptionBus,
        tasks: TasksExtension | None = None,
        *,
        max_subscriptions: int = 1024,
        max_buffered_events: int = 1024,
    ) -> None:
        self.bus = bus
        self.tasks = tasks
        self._max_subscriptions = max_subscriptions
        self._max_buffered_events = max_buffered_events
        self._streams: set[anyio.streams.memory.MemoryObjectSendStream[Any]] = set()
        metrics.watch_listens(self)

    @property
    def open_streams(self) -> int:
        """Streams this handler serves now (the `mrtr.listen.streams` metric sums them)."""
        return len(self._streams)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if len(self._streams) >= self._max_subscriptions:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        requested = params.notifications
        extra = requested.model_extra or {}
        honored = SubscriptionFilter(
            tools_list_changed=True if requested.tools_list_changed else None,
            prompts_list_changed=True if requested.prompts_list_changed else None,
            resources_list_changed=True if requested.resources_list_changed else None,
            resource_subscriptions=list(requested.resource_subscriptions) if requested.resource_subscriptions else None,
        )
        uris = frozenset(honored.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        raw_ids = extra.get(TASK_IDS)
        keyed = self._keyed(ctx, extra.get(TASK_KEYS), raw_ids)
        # Changes to the asked-for tasks are buffered from the moment of subscribing, before the
        # ids are checked: one committed while a task loads must not be missed. Only the ids
        # that pass the check are ever sent (`versions` holds them, with the newest version sent).
        asked = {i for i in raw_ids if isinstance(i, str)} if isinstance(raw_ids, list) and self.tasks else set()
        asked.update(pair["taskId"] for pair in keyed)
        versions: dict[str, int] = {}
        send, recv = anyio.create_memory_object_stream[Any](self._max_buffered_events)

        def deliver(event: Any) -> None:
            if isinstance(event, TaskChanged):
                wanted = event.task_id in asked
            elif isinstance(event, BusGap):
                wanted = concerns(event, honored, uris, asked)
            else:
                wanted = event_matches(honored, uris, event)
            if not wanted:
                return
            try:
                send.send_nowait(event)
            except anyio.ClosedResourceError:
                pass
            except anyio.WouldBlock:
                logger.warning("listen stream %r backlog full; ending the stream", subscription_id)
                self._streams.discard(send)
                send.close()

        # Subscribe before checking and loading the tasks: a change committed after the load
        # is then in the backlog, and one committed before it is in the snapshot.
        unsubscribe = self.bus.subscribe(deliver)
        self._streams.add(send)
        try:
            records = await self._tasks_asked(ctx, raw_ids, keyed=bool(keyed))
            listed = {record.task_id for record in records}
            # A keyed task is the caller's by construction: accepted whether or not it exists yet.
            keyed_ids = [pair["taskId"] for pair in keyed if pair["taskId"] not in listed]
            records += await self._existing(ctx, keyed_ids)
            versions.update((task_id, -1) for task_id in [*listed, *keyed_ids])
            snapshots = bool(listed or keyed) and extra.get(SNAPSHOTS) is True
            ready = getattr(self.bus, "ready", None)
            if ready is not None and not await ready(_BUS_READY_WAIT):
                raise MCPError(INTERNAL_ERROR, "the fleet's event bus is reconnecting; poll, or listen again later")
            acked: dict[str, Any] = {}
            if self.tasks is not None and TASK_IDS in extra:
                acked[TASK_IDS] = [record.task_id for record in records if record.task_id in listed]
            if keyed:
                acked[TASK_KEYS] = keyed
            if snapshots:
                acked[SNAPSHOTS] = True
            ack = SubscriptionFilter.model_validate(honored.model_dump(by_alias=True, exclude_none=True) | acked)
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(notifications=ack, _meta=meta)
                ),
                related_request_id=subscription_id,
            )
            if snapshots:
                for record in records:
                    versions[record.task_id] = record.version
                    await self._send_task(ctx, meta, detailed_task(record), record.version)
            async for event in recv:
                if isinstance(event, BusGap):
                    if not event.known:
                        raise MCPError(
                            INTERNAL_ERROR, "events may have been lost (the fleet's bus reconnected); re-listen"
                        )
                    await self._refetch(ctx, meta, event, honored, uris, versions)
                    continue
                if isinstance(event, TaskChanged):
                    newest = versions.get(event.task_id)
                    if newest is None or (event.version is not None and event.version <= newest):
                        continue  # not accepted, or older than what this stream already sent
                    versions[event.task_id] = event.version if event.version is not None else newest
                    await self._send_task(ctx, meta, dict(event.task), event.version)
                else:
                    await ctx.session.send_notification(
                        event_to_notification(event, meta), related_request_id=subscription_id
                    )
        finally:
            try:
                unsubscribe()
            except Exception:  # a custom bus raising must not skip the stream's own cleanup
                logger.exception("bus unsubscribe raised; continuing stream cleanup")
            self._streams.discard(send)
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=meta)

    def _keyed(self, ctx: ServerRequestContext[Any, Any], raw: Any, raw_ids: Any) -> list[dict[str, str]]:
        """`mrtr/taskKeys` checked, each pair with the id its task has or will have (this caller's)."""
        if raw is None or self.tasks is None:
            return []
        self.tasks.require_opt_in(ctx)  # -32021, as tasks/get
        room = MAX_TASK_IDS - (len(raw_ids) if isinstance(raw_ids, list) else 0)
        shaped = isinstance(raw, list) and len(raw) <= room
        pairs = [p for p in raw if isinstance(p, dict) and set(p) == {"tool", "key"}] if shaped else []
        if (
            not shaped
            or len(pairs) != len(raw)
            or not all(isinstance(p["tool"], str) and p["tool"] and valid_idempotency_key(p["key"]) for p in pairs)
        ):
            raise MCPError(
                INVALID_PARAMS,
                f'notifications["{TASK_KEYS}"] must be a list of {{"tool", "key"}} (an idempotency key),'
                f" at most {MAX_TASK_IDS} with taskIds",
            )
        owner = self.tasks.engine.owner_of(ctx)
        unique = dict.fromkeys((p["tool"], p["key"]) for p in pairs)
        return [{"tool": tool, "key": key, "taskId": keyed_task_id(owner, tool, key)} for tool, key in unique]

    async def _existing(self, ctx: ServerRequestContext[Any, Any], task_ids: list[str]) -> list[TaskView]:
        """The keyed tasks that exist already (a client listening again), for their snapshots."""
        if not task_ids or self.tasks is None:
            return []
        self.tasks.engine.ensure_running()
        owner = self.tasks.engine.owner_of(ctx)
        records = await self.tasks.engine.get_many(task_ids)
        return [r for r in records if r is not None and same_owner(r.owner, owner)]

    async def _tasks_asked(self, ctx: ServerRequestContext[Any, Any], raw: Any, *, keyed: bool) -> list[TaskView]:
        """The records of the requested task ids this client may watch (checked like `tasks/get`)."""
        if raw is None or self.tasks is None:
            return []
        self.tasks.require_opt_in(ctx)  # -32021, as tasks/get
        if not isinstance(raw, list) or not all(isinstance(i, str) and i for i in raw) or len(raw) > MAX_TASK_IDS:
            raise MCPError(INVALID_PARAMS, f"notifications.taskIds must be a list of at most {MAX_TASK_IDS} task ids")
        accepted: list[TaskView] = []
        refused: MCPError | None = None
        for task_id in dict.fromkeys(raw):
            try:
                accepted.append(await self.tasks.load_checked(ctx, task_id, check_name=False))
            except MCPError as error:
                if error.error.code != INVALID_PARAMS:
                    raise
                refused = refused or error
        if refused is not None and not accepted and not keyed:
            raise refused  # exactly what tasks/get answers
        return accepted

    async def _refetch(
        self,
        ctx: ServerRequestContext[Any, Any],
        meta: dict[str, Any],
        gap: BusGap,
        honored: SubscriptionFilter,
        uris: frozenset[str],
        versions: dict[str, int],
    ) -> None:
        """Catch this stream up on what a sender dropped: each task it watches from the store, if
        newer than what it sent; each URI and list as its notification again (level triggers)."""
        for event in [*_list_events(gap.lists), *(ResourceUpdated(uri=uri) for uri in sorted(gap.uris & uris))]:
            if event_matches(honored, uris, event):
                await ctx.session.send_notification(
                    event_to_notification(event, meta), related_request_id=ctx.request_id
                )
        watched = [task_id for task_id in sorted(gap.task_ids) if task_id in versions]
        if not watched or self.tasks is None:
            return
        try:
            records = [await self.tasks.engine.get(task_id) for task_id in watched]
        except StoreUnavailable:
            raise  # ends the stream with the store's retryable error (logged once per burst by the store)
        except Exception as exc:  # the client refetches instead: end the stream
            logger.warning("listen stream %r could not refetch after a bus gap (%s); ending it", ctx.request_id, exc)
            raise MCPError(INTERNAL_ERROR, "events were lost and could not be refetched; re-listen") from exc
        for record in records:
            if record is not None and record.version > versions[record.task_id]:
                versions[record.task_id] = record.version
                await self._send_task(ctx, meta, detailed_task(record), record.version)

    async def _send_task(
        self, ctx: ServerRequestContext[Any, Any], meta: dict[str, Any], task: dict[str, Any], version: int | None
    ) -> None:
        stamped = meta if version is None else meta | {TASK_VERSION: version}
        await sdk.notify_in_request(ctx.session, "notifications/tasks", {**task, "_meta": stamped})

    def close(self) -> None:
        """End every open stream gracefully (each sends its final result after its backlog)."""
        for stream in list(self._streams):
            stream.close()


def concerns(gap: BusGap, honored: SubscriptionFilter, uris: frozenset[str], tasks: set[str]) -> bool:
    """Whether a stream with this filter, these URIs and these task ids may have missed an event in `gap`."""
    if not gap.known:
        return True
    return (
        bool(gap.task_ids & tasks)
        or bool(gap.uris & uris)
        or any(event_matches(honored, uris, event) for event in _list_events(gap.lists))
    )


def _list_events(kinds: frozenset[str]) -> list[Any]:
    made = {"tools": ToolsListChanged, "prompts": PromptsListChanged, "resources": ResourcesListChanged}
    return [made[kind]() for kind in sorted(kinds) if kind in made]


__all__ = ["MAX_TASK_IDS", "SNAPSHOTS", "TASK_IDS", "TASK_KEYS", "TASK_VERSION", "ListenHandler"]
