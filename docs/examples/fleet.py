"""The fleet guide's recipes: a shared key ring, a shared store (and the bus it brings), the guard.

Building these objects opens no connection: `main` builds each recipe against the local Redis
URL and checks what it got. Run by `tests/integration/test_docs_examples.py`; the recipes run
for real behind HAProxy with instances killed in `tests/fleet/test_chaos.py`.
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity

import mrtr

KEY = os.urandom(32)
URL = "redis://127.0.0.1:6379/1"  # a database of mrtr's own, not 0 (where other software writes by default)


def plain_recipe() -> mrtr.Flows:
    # --8<-- [start:plain]
    server = MCPServer("migrator", request_state_security=RequestStateSecurity(keys=[KEY]))
    flows = mrtr.Flows(server, store=mrtr.RedisStore(URL), task_lease=10, require_shared_store=True)
    # the shared store also makes every round single-use fleet-wide (the replay guard, on by default)
    app = flows.streamable_http_app()  # the SDK's app, with this instance's task worker in its lifespan
    # run N uvicorn processes / hosts behind any load balancer
    # --8<-- [end:plain]
    assert app is not None
    return flows


def explicit_bus() -> mrtr.Flows:
    # --8<-- [start:bus]
    bus = mrtr.open_bus(URL)  # or "postgresql://...": the store's URLs
    server = MCPServer("migrator", subscriptions=bus, request_state_security=RequestStateSecurity(keys=[KEY]))
    flows = mrtr.Flows(server, store=mrtr.RedisStore(URL))  # task notifications ride it too
    # --8<-- [end:bus]
    return flows


def under_fire(server: MCPServer) -> mrtr.Flows:
    # --8<-- [start:guard]
    flows = mrtr.Flows(
        server,
        store=mrtr.RedisStore(URL),  # rounds are single-use fleet-wide: the guard records them here
        max_inflight_rounds=64,  # shed rounds past 64 in flight on this instance
    )
    # --8<-- [end:guard]
    return flows


async def main() -> None:
    plain = plain_recipe()
    assert plain.replay_guard is not None, "a shared store brings the replay guard"
    assert isinstance(explicit_bus().server, MCPServer)
    flows = under_fire(MCPServer("guarded", request_state_security=RequestStateSecurity(keys=[KEY])))
    assert flows.shedder is not None and flows.replay_guard is not None


if __name__ == "__main__":
    asyncio.run(main())
