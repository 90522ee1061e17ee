"""Start-up warnings for deployments that work on one instance and fail on two.

The traps are silent on a laptop: a server without `request_state_security` seals each
round's state under a key only its own process holds, and the default task store is a
file in the working directory. Both work with one instance and fail — after the user
has answered — once a second instance (or a restart) serves the next round. `Flows`
says so at start-up, through the standard `logging` module (logger `mrtr.fleet`).
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.mcpserver import MCPServer

from mrtr import sdk

logger = logging.getLogger(__name__)


def warn_about_state_key(server: MCPServer[Any]) -> None:
    if sdk.uses_process_local_key(server):
        logger.warning(
            "mrtr: server %r has no request_state_security, so its requestState is sealed with a key only this "
            "process holds: a second instance (or this one after a restart) rejects every flow in flight with "
            "'Invalid or expired requestState', after the user answered. Give every instance the same key ring: "
            "MCPServer(..., request_state_security=RequestStateSecurity(keys=[...]))",
            server.name,
        )


def warn_about_default_store(path: str) -> None:
    logger.warning(
        "mrtr: durable tasks use the default store, a SQLite file (%s) on this host: instances on other hosts "
        "cannot see its tasks. Give the fleet one shared store: Flows(server, store=mrtr.open_store(url))",
        path,
    )
