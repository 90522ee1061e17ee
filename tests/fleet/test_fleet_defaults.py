"""Defaults that hold on a fleet: the README's plain recipe pushes task changes across instances.

`Flows(server, store=RedisStore|PostgresStore)` with no `MCPServer(subscriptions=...)` is how
the README builds a fleet. Its task clients listen by default, so the server must either hear
every instance's changes or not acknowledge task ids at all:

- the plain recipe gets a bus on the store's own broker: a listener on A hears, pushed, every
  state of a task that B runs, answers and completes (two real uvicorn instances);
- `Flows(fleet_bus=False)` keeps the in-process bus and acknowledges no task ids, and
  `FlowClient(tasks=True)` then finishes by polling;
- in process: an explicit `subscriptions=` always wins, a store whose connection options a
  bus cannot copy gets none (and a warning), and the start-up log line says which bus.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus

import mrtr
from mrtr import _sdk as sdk
from mrtr._flows import _SDKHost
from mrtr._host import fleet as fleet_policy
from mrtr.client import FlowClient
from tests.fleet.test_bus_fleet import URLS, answer, fleet, follow_across, need, served
from tests.support import buskit
from tests.support.markers import backends
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, cluster_url

pytestmark = pytest.mark.in_process  # unless marked otherwise

KEY = bytes(range(32))


@pytest.fixture(params=backends("redis", "redis-cluster", "postgres"))
def plain(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Instances A and B built by the README's plain recipe: a shared store, no `subscriptions=`
    (on a Redis Cluster the store brings the sharded bus)."""
    url = cluster_url(request.param, request)
    if url is None:
        need(request.param)
        url = URLS[request.param]
    with fleet(tmp_path, "", store=url) as servers:  # no MRTR_BUS
        yield {label: server.url for label, server in servers.items()}


@pytest.fixture
def no_fleet_bus(tmp_path: Path) -> Iterator[str]:
    """One instance with `Flows(fleet_bus=False)` beside a shared Redis store."""
    need("redis")
    with fleet(tmp_path, "", store=REDIS_URL, labels=("A",), MRTR_FLEET_BUS="0") as servers:
        yield servers["A"].url


@pytest.mark.anyio
@pytest.mark.spawns
async def test_the_plain_fleet_recipe_pushes_a_task_run_on_b_to_a_listener_on_a(plain: dict[str, str]) -> None:
    # On the SDK's in-process bus nothing B does reaches A: the question would never arrive.
    tasks = await follow_across(plain["A"], plain["B"], "p")
    assert [p["status"] for p in tasks][-1] == "completed"


@pytest.mark.anyio
@pytest.mark.spawns
@pytest.mark.needs_redis
async def test_fleet_bus_false_acknowledges_no_task_ids_and_clients_poll(no_fleet_bus: str) -> None:
    a = no_fleet_bus
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
        reply = await buskit.call(http, a, "tools/call", {"name": "pipeline", "arguments": {"job": "q", "slow": 0}})
        task_id = reply["result"]["taskId"]
        async with buskit.listen(a, {"taskIds": [task_id]}) as stream:
            ack = stream.frames[0]
            assert ack["method"] == "notifications/subscriptions/acknowledged", ack
            assert "taskIds" not in ack["params"]["notifications"], "a listen it cannot serve is not promised"
        before = await served(http, a)
        async with FlowClient(a, elicitation_callback=answer, tasks=True) as flows:
            result = await flows.call_tool("pipeline", {"job": "r", "slow": 0})
        after = await served(http, a)
    assert result.content[0].text == "published DATA(R)"
    assert after.get("tasks/get", 0) > before.get("tasks/get", 0), "with no task ids acknowledged, it polled"


def _server(**options: Any) -> MCPServer:
    return MCPServer("fleet-defaults", request_state_security=RequestStateSecurity(keys=[KEY]), **options)


def test_a_redis_store_brings_a_bus_on_its_own_broker_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    server = _server()
    namespace = f"mrtr_defaults_{secrets.token_hex(4)}"
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        flows = mrtr.Flows(server, store=mrtr.open_store(REDIS_URL, namespace=namespace))
    bus = sdk.subscription_bus(server)
    assert isinstance(bus, mrtr.buses.RedisBus) and flows.bus is bus
    assert bus.url == REDIS_URL and bus.channel == f"{namespace}:bus", "the broker and namespace of the store"
    (line,) = [r for r in caplog.records if r.name == "mrtr.fleet" and "bus" in r.getMessage()]
    assert line.levelno == logging.INFO and "fleet bus" in line.getMessage() and bus.channel in line.getMessage()
    assert "pass MCPServer(subscriptions=...) to choose another" in line.getMessage(), "as docs/guides/fleet.md"


def test_the_fleet_bus_line_names_the_option_a_fastmcp_server_takes(caplog: pytest.LogCaptureFixture) -> None:
    from fastmcp import FastMCP

    import mrtr.fastmcp

    mcp: FastMCP[Any] = FastMCP("defaults", request_state_security=RequestStateSecurity(keys=[secrets.token_bytes(32)]))
    namespace = f"mrtr_defaults_{secrets.token_hex(4)}"
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        mrtr.fastmcp.Flows(mcp, store=mrtr.open_store(REDIS_URL, namespace=namespace))
    (line,) = [r for r in caplog.records if r.name == "mrtr.fleet" and "fleet bus" in r.getMessage()]
    assert "pass Flows(bus=...) to choose another" in line.getMessage()  # FastMCP takes no bus of its own


def test_a_postgres_store_brings_the_bus_open_bus_gives_for_its_namespace() -> None:
    default = _server()
    mrtr.Flows(default, store=mrtr.PostgresStore(POSTGRES_DSN))
    assert sdk.subscription_bus(default).table == "mrtr_bus"  # type: ignore[attr-defined]
    named = _server()
    mrtr.Flows(named, store=mrtr.open_store(POSTGRES_DSN, namespace="billing"))
    assert sdk.subscription_bus(named).table == "billing_bus"  # type: ignore[attr-defined]


def test_an_explicit_bus_always_wins(caplog: pytest.LogCaptureFixture) -> None:
    own = mrtr.open_bus(REDIS_URL, namespace="elsewhere")
    server = _server(subscriptions=own)
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        flows = mrtr.Flows(server, store=mrtr.RedisStore(REDIS_URL))
    assert sdk.subscription_bus(server) is own and flows.bus is own
    assert any("server's own bus" in r.getMessage() for r in caplog.records)


def test_a_store_a_bus_cannot_copy_gets_no_bus_and_no_task_listens(caplog: pytest.LogCaptureFixture) -> None:
    server = _server()
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        flows = mrtr.Flows(server, store=mrtr.RedisStore(REDIS_URL, socket_keepalive=True))

    @flows.tool(task="optional")
    async def job(ctx: mrtr.FlowContext) -> str:
        return "done"

    assert type(sdk.subscription_bus(server)) is InMemorySubscriptionBus
    assert flows._core.listen is not None and flows._core.listen.tasks is None, "task ids are not acknowledged"
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "mrtr.fleet"]
    assert "subscriptions=mrtr.open_bus(url)" in warning.getMessage()


def test_a_single_host_store_keeps_the_in_process_bus_and_serves_task_listens() -> None:
    server = _server()
    flows = mrtr.Flows(server, store=mrtr.SQLiteStore(":memory:"))

    @flows.tool(task="optional")
    async def job(ctx: mrtr.FlowContext) -> str:
        return "done"

    assert type(sdk.subscription_bus(server)) is InMemorySubscriptionBus
    assert flows._core.listen is not None and flows._core.listen.tasks is not None


def test_an_engine_whose_workers_run_elsewhere_needs_a_fleet_bus(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mrtr.fleet"):
        _, hears = fleet_policy.choose_bus(
            _SDKHost(_server()), None, given=None, fleet_bus=True, engine_spans_fleet=True, worker_here=False
        )
    assert hears is False, "no worker here, no fleet bus: nothing would ever be heard"
    assert "subscriptions=mrtr.open_bus(url)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mrtr.fleet"):
        _, hears = fleet_policy.choose_bus(
            _SDKHost(_server()), None, given=None, fleet_bus=True, engine_spans_fleet=True, worker_here=True
        )
    assert hears is True, "this process's worker reports here"
    assert "other instances and workers" in caplog.text, "and the start-up warning says what it misses"
