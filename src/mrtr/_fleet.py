"""Start-up warnings for deployments that work on one instance and fail on two.

The traps are silent on a laptop: a server without `request_state_security` seals each
round's state under a key only its own process holds, and the default task store is a
file in the working directory. Both work with one instance and fail — after the user
has answered — once a second instance (or a restart) serves the next round. `Flows`
says so at start-up, through the standard `logging` module (logger `mrtr._fleet`).

A third trap degrades instead of failing: a fleet sharing a Redis or PostgreSQL task
store on the SDK's in-process bus acknowledges task listens whose changes happen on other
instances, and its clients hear of them only at their next resync. `choose_bus` gives such
a server a bus on the store's broker, and logs which bus every server uses.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

from mcp.server.mcpserver import MCPServer

from mrtr import _sdk as sdk
from mrtr._errors import FlowDefinitionError

logger = logging.getLogger("mrtr.fleet")


def warn_about_state_key(server: MCPServer[Any]) -> None:
    if sdk.uses_process_local_key(server):
        logger.warning(
            "mrtr: server %r has no request_state_security, so its requestState is sealed with a key only this "
            "process holds: a second instance (or this one after a restart) rejects every flow in flight with "
            "'Invalid or expired requestState', after the user answered. Give every instance the same key ring: "
            "MCPServer(..., request_state_security=RequestStateSecurity(keys=[...]))",
            server.name,
        )


def require_shared_key(server: MCPServer[Any]) -> None:
    """`Flows(require_shared_key=True)`: refuse to start with a process-local `requestState` key."""
    if sdk.uses_process_local_key(server) or sdk.state_security(server) is None:
        raise FlowDefinitionError(
            f"server {server.name!r} has no shared request_state_security (Flows(require_shared_key=True)): "
            "every instance must seal with the same key ring: "
            "MCPServer(..., request_state_security=RequestStateSecurity(keys=[...]))"
        )


def warn_about_default_store(path: str) -> None:
    logger.warning(
        "mrtr: durable tasks use the default store, a SQLite file (%s) on this host: instances on other hosts "
        "cannot see its tasks. Give the fleet one shared store: Flows(server, store=mrtr.open_store(url))",
        path,
    )


def choose_bus(
    server: MCPServer[Any],
    store: object | None,
    *,
    fleet_bus: bool,
    engine_spans_fleet: bool = False,
    worker_here: bool = True,
) -> bool:
    """Give a fleet's server a bus that reaches every instance; say at start-up which bus it uses.

    A task store that other hosts share (Redis, PostgreSQL) means a fleet, and on a fleet
    the SDK's in-process bus hears only this instance's changes: a listen stream held here
    would wait in silence for a task another instance finishes. So, unless the server was
    given a bus of its own (`MCPServer(subscriptions=...)`, which always wins), it gets one
    on the store's own broker (`store.fleet_bus()`: same URL, the store's namespace).

    Returns whether the server's bus carries every task change to this instance's
    listeners. When it cannot (`fleet_bus=False`, a store whose connection options the
    bus cannot copy, or an engine whose workers all run in other processes, e.g.
    `TemporalTasks(worker=False)`, on the in-process bus), `Flows` leaves task ids out of
    listen acknowledgements, so clients poll instead of waiting on silence. An engine that
    may run elsewhere as well as here (Temporal with a worker in this process) keeps task
    listens, with a warning: its other processes' changes need a fleet bus.
    """
    if not sdk.uses_default_bus(server):
        logger.info("mrtr: listen streams and task notifications ride the server's own bus, %s", _describe(server))
        return True
    derive = getattr(store, "fleet_bus", None)
    if derive is None:  # no task store yet, or one host's (SQLite): the in-process bus serves it
        if engine_spans_fleet and not worker_here:
            logger.warning(
                "mrtr: server %r keeps the SDK's in-process bus, but its tasks run in other processes (the task "
                "engine's workers): listens are acknowledged without task ids, so clients poll. Give every "
                "instance and worker one fleet bus: MCPServer(..., subscriptions=mrtr.open_bus(url))",
                server.name,
            )
            return False
        if engine_spans_fleet:
            logger.warning(
                "mrtr: server %r keeps the SDK's in-process bus: its listeners hear only what this process's "
                "worker reports, not the task changes of other instances and workers (they are heard at the "
                "client's next resync). Give every instance and worker one fleet bus: "
                "MCPServer(..., subscriptions=mrtr.open_bus(url))",
                server.name,
            )
            return True
        if store is not None:
            logger.info(
                "mrtr: task notifications ride the SDK's in-process bus: they reach listeners of this process "
                "only (processes sharing one SQLite file need MCPServer(subscriptions=mrtr.open_bus(url)))"
            )
        return True
    where = _redacted(str(getattr(store, "url", None) or getattr(store, "dsn", "")))
    if not fleet_bus:
        logger.warning(
            "mrtr: Flows(fleet_bus=False) keeps the SDK's in-process bus beside a shared store (%s): listens are "
            "acknowledged without task ids and task clients poll every task_poll_interval",
            where,
        )
        return False
    bus = derive()
    if bus is None:
        logger.warning(
            "mrtr: the task store (%s) was built with connection options a fleet bus cannot copy, so server %r "
            "keeps the SDK's in-process bus: listens are acknowledged without task ids and task clients poll. "
            "Give every instance one fleet bus: MCPServer(..., subscriptions=mrtr.open_bus(url))",
            where,
            server.name,
        )
        return False
    sdk.set_subscription_bus(server, bus)
    logger.info(
        "mrtr: the task store is shared (%s), so listen streams and task notifications ride a fleet bus on the "
        "same broker (%s %r); pass MCPServer(subscriptions=...) to choose another",
        where,
        type(bus).__name__,
        getattr(bus, "channel", ""),
    )
    return True


def _describe(server: MCPServer[Any]) -> str:
    bus = sdk.subscription_bus(server)
    channel = getattr(bus, "channel", None)
    return f"{type(bus).__name__} {channel!r}" if channel else type(bus).__name__


def _redacted(url: str) -> str:
    """`url` without its password, for logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


__all__ = ["require_shared_key", "choose_bus", "warn_about_default_store", "warn_about_state_key"]
