"""Start-up checks for deployments that work on one instance and fail, or degrade, on two.

The traps are silent on a laptop: a server without a shared `request_state_security` seals
each round's state under a key only its own process holds, and the default task store is a
file in the working directory. Both work with one instance and fail — after the user has
answered — once a second instance (or a restart) serves the next round. The host core says
so at start-up, through the standard `logging` module (logger `mrtr.fleet`), or refuses to
start (`require_shared_key=True`, `require_shared_store=True`).

A third trap degrades instead of failing: a fleet sharing a Redis or PostgreSQL task store
on an in-process bus acknowledges task listens whose changes happen on other instances, and
its clients hear of them only at their next resync. `choose_bus` gives such a server a bus
on the store's broker, and logs which bus every server uses.

Every message names the host's own constructor (`MCPServer(...)` or `FastMCP(...)`), so the
same check reads right on both hosts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mrtr._errors import FlowDefinitionError
from mrtr.buses._base import BrokerBus
from mrtr.stores._abilities import is_shared

if TYPE_CHECKING:
    from mcp.server.subscriptions import SubscriptionBus

    from mrtr._host.adapter import Host

logger = logging.getLogger("mrtr.fleet")


def check_state_key(host: Host, *, required: bool) -> None:
    """Warn (or, when `required`, refuse to start) if `requestState` is sealed with a process-local key."""
    if host.shares_state_key():
        return
    fix = f"{host.kind}(..., request_state_security=RequestStateSecurity(keys=[...]))"
    if required:
        raise FlowDefinitionError(
            f"server {host.name!r} has no shared request_state_security (Flows(require_shared_key=True)): "
            f"every instance must seal with the same key ring: {fix}"
        )
    logger.warning(
        "mrtr: server %r has no request_state_security, so its requestState is sealed with a key only this "
        "process holds: a second instance (or this one after a restart) rejects every flow in flight with "
        "'Invalid or expired requestState', after the user answered; and durable task records are stored unsealed "
        "(nothing to seal them with). Give every instance the same key ring: %s",
        host.name,
        fix,
    )


def refuse_unshared_store(host: Host, what: str) -> None:
    """`Flows(require_shared_store=True)`: `what` is the store this instance would use instead."""
    raise FlowDefinitionError(
        f"server {host.name!r} would keep durable tasks and rounds in {what}, which no other instance sees "
        "(Flows(require_shared_store=True)): give every instance one shared store, "
        "Flows(..., store=mrtr.open_store(url)) with a redis:// or postgresql:// URL"
    )


def warn_about_default_store(path: str) -> None:
    logger.warning(
        "mrtr: durable tasks use the default store, a SQLite file (%s) on this host: instances on other hosts "
        "cannot see its tasks. Give the fleet one shared store: Flows(server, store=mrtr.open_store(url)), "
        "and Flows(require_shared_store=True) to refuse to start without one",
        path,
    )


def log_guard(host: Host, where: str | None) -> None:
    """Say at start-up whether rounds are single-use (`where`: the ledger) or not (None: opted out)."""
    if where is None:
        logger.info(
            "mrtr: server %r runs without a replay guard (Flows(replay_guard=False)): a resent round runs its "
            "steps again, under the same idempotency keys",
            host.name,
        )
    else:
        logger.info("mrtr: server %r makes every round single-use fleet-wide (replay guard on %s)", host.name, where)


def log_sealing(host: Host, sealed: bool) -> None:
    """Say at start-up whether durable task records are sealed at rest (`Flows(seal_at_rest=...)`)."""
    if sealed:
        logger.debug("mrtr: server %r seals durable task records at rest with its key ring", host.name)
    else:
        logger.warning(
            "mrtr: server %r stores durable task records in plain text (Flows(seal_at_rest=False)): arguments, "
            "answers, step results and results are readable by anyone who can read the store or its backups",
            host.name,
        )


def choose_bus(
    host: Host,
    store: object | None,
    *,
    given: SubscriptionBus | None,
    fleet_bus: bool,
    engine_spans_fleet: bool = False,
    worker_here: bool = True,
) -> tuple[SubscriptionBus | None, bool]:
    """The bus a server's listen streams and task notifications ride, and whether it hears every task.

    A task store that other hosts share (Redis, PostgreSQL) means a fleet, and on a fleet an
    in-process bus hears only this instance's changes: a listen stream held here would wait
    in silence for a task another instance finishes. So, unless the server was given a bus
    (`given`: `Flows(bus=...)` or `MCPServer(subscriptions=...)`, which always wins), it gets
    one on the store's own broker (`store.fleet_bus()`: same URL, the store's namespace).
    Returns `(bus, hears)`; `bus` None means the host's in-process bus.

    `hears` is False when the bus cannot carry every task change to this instance's listeners
    (`fleet_bus=False`, a store whose connection options the bus cannot copy, or an engine whose
    workers all run in other processes, e.g. `TemporalTasks(worker=False)`, on an in-process
    bus): listen acknowledgements then leave task ids out, so clients poll instead of waiting
    on silence. An engine that may run elsewhere as well as here (Temporal with a worker in
    this process) keeps task listens, with a warning: its other processes' changes need a
    fleet bus.
    """
    fix = f"{host.kind}(..., subscriptions=mrtr.open_bus(url)) or Flows(..., bus=mrtr.open_bus(url))"
    if given is not None:
        channel = given.channel if isinstance(given, BrokerBus) else None
        what = f"{type(given).__name__} {channel!r}" if channel else type(given).__name__
        logger.info("mrtr: listen streams and task notifications ride the server's own bus, %s", what)
        return given, True
    if not is_shared(store):  # one host's store (SQLite), or none: the in-process bus serves it
        if engine_spans_fleet and not worker_here:
            logger.warning(
                "mrtr: server %r keeps an in-process bus, but its tasks run in other processes (the task "
                "engine's workers): listens are acknowledged without task ids, so clients poll. Give every "
                "instance and worker one fleet bus: %s",
                host.name,
                fix,
            )
            return None, False
        if engine_spans_fleet:
            logger.warning(
                "mrtr: server %r keeps an in-process bus: its listeners hear only what this process's worker "
                "reports, not the task changes of other instances and workers (they are heard at the client's "
                "next resync). Give every instance and worker one fleet bus: %s",
                host.name,
                fix,
            )
            return None, True
        if store is not None:
            logger.info(
                "mrtr: task notifications ride an in-process bus: they reach listeners of this process only "
                "(processes sharing one SQLite file need %s)",
                fix,
            )
        return None, True
    where = store.where
    if not fleet_bus:
        logger.warning(
            "mrtr: Flows(fleet_bus=False) keeps an in-process bus beside a shared store (%s): listens are "
            "acknowledged without task ids and task clients poll every task_poll_interval",
            where,
        )
        return None, False
    bus = store.fleet_bus()
    if bus is None:
        logger.warning(
            "mrtr: the task store (%s) was built with connection options a fleet bus cannot copy, so server %r "
            "keeps an in-process bus: listens are acknowledged without task ids and task clients poll. "
            "Give every instance one fleet bus: %s",
            where,
            host.name,
            fix,
        )
        return None, False
    logger.info(
        "mrtr: the task store is shared (%s), so listen streams and task notifications ride a fleet bus on the "
        "same broker (%s %r); pass %s to choose another",
        where,
        type(bus).__name__,
        bus.channel,
        host.bus_option,
    )
    return bus, True


__all__ = [
    "check_state_key",
    "choose_bus",
    "log_guard",
    "log_sealing",
    "refuse_unshared_store",
    "warn_about_default_store",
]
