"""`mrtr tasks event ID NAME --data JSON`: deliver an event to a durable task from a shell.

The same compare-and-set delivery as `Flows.send_event` (`mrtr.tasks._inbox`): the event is
kept in the task's record, and a task parked on `ctx.wait_for_event(NAME)` becomes claimable
at once, so the next scan of any instance (within its `task_scan_interval`) resumes it.
"""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.markup import escape

from mrtr._errors import EventNotDelivered
from mrtr.cli._errors import EXIT_OK, CliError, UsageError
from mrtr.cli._fleetbus import fleet_bus
from mrtr.stores import RecordSeal, SealedStore, TaskStore, open_store
from mrtr.tasks._events import TaskEvents
from mrtr.tasks._inbox import deliver, new_event


def parse_data(text: str | None) -> object:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--data must be JSON ({exc.args[0] if exc.args else exc})") from None


async def send_event(
    url: str,
    namespace: str | None,
    task_id: str,
    name: str,
    data: str | None,
    event_id: str | None,
    out: Console,
    seal: RecordSeal | None = None,
    bus: str | None = None,
) -> int:
    payload = parse_data(data)
    try:
        event = new_event(name, payload, event_id, time.time())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        store: TaskStore = open_store(url, namespace=namespace)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if seal is not None:
        store = SealedStore(store, seal, strict=False)
    try:
        known = await store.load(task_id, time.time())
        if known is not None and known.sealed:  # its inbox is sealed: an event goes in only with the key
            raise CliError(
                f"task {task_id!r} is sealed at rest: give the key ring (MRTR_STATE_KEY or --key-file) to deliver"
            )
        delivered, record = await deliver(store, task_id, event, time.time(), known=known)
        if delivered and bus:
            async with fleet_bus(bus, namespace) as fleet:
                assert fleet is not None
                await TaskEvents(fleet).publish(record)
    except EventNotDelivered as exc:
        raise CliError(str(exc)) from None
    finally:
        await store.close()
    if not delivered:
        outcome = f"event {escape(event['id'])} was delivered before; nothing changed"
    elif record.lease_until == 0.0 and record.status == "working":
        outcome = f"event {escape(name)!r} delivered; the task resumes at the next scan"
    else:
        outcome = f"event {escape(name)!r} delivered; kept until the flow waits for it"
    out.print(f"task {escape(task_id)}: {outcome}", soft_wrap=True)
    return EXIT_OK


__all__ = ["parse_data", "send_event"]
