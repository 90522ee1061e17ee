"""A resent first round joins its first copy: stock clients behind HAProxy while an instance is SIGKILLed.

Two chaos-server instances (tests/support/chaos_server.py: a shared Redis store, the replay
guard on by default, leases of 1 s) behind HAProxy configured as docs/guides/fleet.md says:
retries on connection failure and empty response, and a request id stamped once per client
request (`unique-id-format` + `X-Request-ID`), kept on HAProxy's retries. The `pay` flow
charges (a step), then notifies (a slow step that first says it started: by then the charge
is checkpointed); each finished side effect is counted in Redis.

- The official `mcp.Client` at its defaults (no idempotency key), and `FlowClient` inline
  and with `tasks=True`: the instance is SIGKILLed during `notify`, after `charge` finished
  and before the round answered. HAProxy resends the request to the other instance, which
  joins the first copy (waits out its lease, resumes from its checkpoint): the call returns
  the right value, and each step ran once.
- A balancer's duplicate: the same request POSTed twice at once with the same stamped id,
  once to each instance: the steps run once and both copies get the same answer.
- Two separate clients sending byte-identical calls (same JSON-RPC id, same arguments) are
  never merged, through HAProxy (each gets its own stamp) or straight to one instance (no
  stamp, no key, no principal: nothing to join them by).

One fleet for the module. Needs HAProxy (installed with apt-get when missing and running as
root) and Redis on 127.0.0.1:6379; missing either fails under `CI=true`, skips otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types as t
import pytest
import redis
from benchmarks.chaos_fleet import Fleet, HaproxyUnavailable, Instance, balancer, find_haproxy
from benchmarks.chaos_load import Job, answer_question
from fastmcp import Client as FastMCPClient
from mcp import Client

from mrtr.client import FlowClient

pytestmark = [pytest.mark.anyio, pytest.mark.spawns, pytest.mark.needs_redis, pytest.mark.needs_haproxy]

REDIS_URL = "redis://127.0.0.1:6379/0"

# The fleet guide's configuration (docs/guides/fleet.md): modern clients (retries, a stamped
# request id) and legacy ones (sticky by Mcp-Session-Id), with the test's ports filled in and
# health checks fast enough for a test.
DOCUMENTED_HAPROXY = """\
global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    option http-buffer-request
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout 502 503 504

frontend mcp
    bind 127.0.0.1:{frontend_port}
    unique-id-format %[uuid()]
    http-request set-header X-Request-ID %[unique-id]
    default_backend fleet

backend fleet
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter 300ms fall 2 rise 1
    stick-table type string len 128 size 1m expire 1h
    stick match req.hdr(mcp-session-id)
    stick store-response res.hdr(mcp-session-id)
{servers}
"""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: this test must run, not skip)")
    pytest.skip(reason)


@dataclass
class Site:
    """The module's fleet: its instances, the balancer's URL, and the Redis namespace of its counters."""

    fleet: Fleet
    url: str
    namespace: str
    redis: redis.Redis

    def records(self, key: str, flow: str) -> list[dict[str, Any]]:
        raw = self.redis.lrange(f"{self.namespace}:{key}", 0, -1)
        return [r for r in map(json.loads, raw) if r["flow"] == flow]

    def ran(self, flow: str) -> Counter[str]:
        """Each step of `flow` that finished its side effect, counted."""
        return Counter(r["step"] for r in self.records("fxlog", flow))

    async def started(self, flow: str, step: str, timeout: float = 20.0) -> Instance:
        """The instance on which `step` of `flow` started (waits for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.records("started", flow):
                if record["step"] == step:
                    return next(i for i in self.fleet.instances if i.server and i.server.label == record["instance"])
            await asyncio.sleep(0.02)
        raise AssertionError(f"{step} of {flow} never started")

    async def kill_and_revive(self, instance: Instance, during: Any) -> Any:
        """SIGKILL `instance`, await `during` (the call it was serving) while it restarts; its result."""
        self.fleet.kill(instance)
        reviving = asyncio.ensure_future(asyncio.to_thread(self.fleet.spawn, instance))
        try:
            return await asyncio.wait_for(during, 60)
        finally:
            await reviving  # the next test finds both instances up

    def direct(self, instance: Instance) -> str:
        return f"http://127.0.0.1:{instance.port}/mcp"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    try:
        haproxy = find_haproxy(install=True)
    except HaproxyUnavailable as exc:
        _unavailable(str(exc))
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable(f"Redis on 127.0.0.1:6379 unreachable: {exc}")
    namespace = f"mrtr_resend_{secrets.token_hex(4)}"
    env = {
        "CHAOS_REDIS": REDIS_URL,
        "CHAOS_NAMESPACE": namespace,
        "CHAOS_STEP_SECONDS": "0.01",
        "MRTR_TASK_LEASE": "1.0",
        "CHAOS_GUARD": "1",
        "CHAOS_MAX_INFLIGHT": "0",
    }
    workdir = tmp_path_factory.mktemp("resend")
    fleet = Fleet(workdir, env, size=2)
    try:
        fleet.start()
        with balancer(haproxy, fleet, workdir, DOCUMENTED_HAPROXY) as url:
            yield Site(fleet, url, namespace, client)
    except BaseException:
        print(fleet.logs())
        raise
    finally:
        fleet.close()
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def _value(result: t.CallToolResult) -> int:
    assert not result.is_error, result
    (block,) = result.content
    assert isinstance(block, t.TextContent)
    return int(block.text)


async def _killed_mid_round(site: Site, flow: str, call: Any) -> int:
    """Run `call`; SIGKILL the instance running `pay`'s second step once it started; the call's value."""
    running = asyncio.ensure_future(call)
    victim = await site.started(flow, "notify")
    value = _value(await site.kill_and_revive(victim, running))
    _hit_mid_round(site, flow)
    return value


def _hit_mid_round(site: Site, flow: str) -> None:
    """The kill landed after `charge` finished and before `notify` did: notify started twice."""
    notified = [r["instance"] for r in site.records("started", flow) if r["step"] == "notify"]
    assert len(notified) == 2 and notified[0] != notified[1], f"the kill missed the round: {notified}"


async def test_mcp_client_call_survives_a_kill_after_a_step(site: Site) -> None:
    flow = f"mcp-{secrets.token_hex(3)}"
    async with Client(site.url) as client:  # the official client at its defaults: no key, no retries
        value = await _killed_mid_round(site, flow, client.call_tool("pay", {"flow": flow, "base": 5, "slow": 1.5}))
    assert value == 12
    assert site.ran(flow) == {"charge": 1, "notify": 1}, site.records("fxlog", flow)


async def test_fastmcp_client_call_survives_a_kill_after_a_step(site: Site) -> None:
    flow = f"fmcp-{secrets.token_hex(3)}"
    async with FastMCPClient(site.url) as client:  # FastMCP 4's client at its defaults
        running = asyncio.ensure_future(client.call_tool("pay", {"flow": flow, "base": 4, "slow": 1.5}))
        victim = await site.started(flow, "notify")
        result = await site.kill_and_revive(victim, running)
    _hit_mid_round(site, flow)
    assert result.structured_content == {"result": 10}
    assert site.ran(flow) == {"charge": 1, "notify": 1}


async def test_a_task_optional_tool_called_inline_survives_a_kill(site: Site) -> None:
    flow = f"opt-{secrets.token_hex(3)}"
    async with Client(site.url) as client:  # declares no tasks extension: the tool runs inline
        call = client.call_tool("pay_optional", {"flow": flow, "base": 1, "slow": 1.5})
        value = await _killed_mid_round(site, flow, call)
    assert value == 4
    assert site.ran(flow) == {"charge": 1, "notify": 1}


@pytest.mark.parametrize("tasks", [False, True], ids=["inline", "tasks"])
async def test_flowclient_survives_a_kill_after_a_step(site: Site, tasks: bool) -> None:
    flow = f"fc-{tasks}-{secrets.token_hex(3)}"
    async with FlowClient(site.url, tasks=tasks) as client:
        call = client.call_tool("pay_optional", {"flow": flow, "base": 2, "slow": 1.5})
        value = await _killed_mid_round(site, flow, call)
    assert value == 6
    assert site.ran(flow) == {"charge": 1, "notify": 1}


async def test_a_legacy_session_sticks_to_its_instance(site: Site) -> None:
    """A 2025-11-25 client's flow runs live over its session: the fleet guide's stickiness keeps it whole."""
    jobs = [Job("flow", 90000 + i) for i in range(3)]

    async def elicit(context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return answer_question(params.message)

    async with Client(site.url, mode="legacy", elicitation_callback=elicit) as client:
        values = [_value(await client.call_tool("trip", {"flow": j.label, "base": j.base})) for j in jobs]
    assert values == [j.expected() for j in jobs]
    instances = {r["instance"] for j in jobs for r in site.records("fxlog", j.label)}
    assert len(instances) == 1, f"one session's flows ran on {instances}"


def _body(flow: str) -> dict[str, Any]:
    """A stock client's first `tools/call` of a fresh session: JSON-RPC id 2, what every session sends."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": "pay", "arguments": {"flow": flow, "base": 7, "slow": 0.5}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}


async def _post(http: httpx2.AsyncClient, url: str, body: dict[str, Any], request_id: str | None) -> Any:
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "pay",
    }
    if request_id is not None:
        headers["x-request-id"] = request_id
    response = await http.post(url, content=json.dumps(body).encode(), headers=headers, timeout=60)
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and '"id"' in line)
    return json.loads(text)["result"]


async def test_a_balancers_duplicate_runs_once_and_both_copies_get_the_answer(site: Site) -> None:
    flow = f"dup-{secrets.token_hex(3)}"
    stamp = secrets.token_hex(16)
    a, b = site.fleet.instances
    async with httpx2.AsyncClient() as http:
        results = await asyncio.gather(*(_post(http, site.direct(i), _body(flow), stamp) for i in (a, b)))
    assert results[0] == results[1]
    assert results[0]["content"][0]["text"] == "16"
    assert site.ran(flow) == {"charge": 1, "notify": 1}


async def test_two_stock_clients_with_identical_calls_are_never_merged(site: Site) -> None:
    flow = f"two-{secrets.token_hex(3)}"
    arguments = {"flow": flow, "base": 3, "slow": 0.5}

    async def one() -> int:
        async with Client(site.url) as client:  # a fresh session: its first call has JSON-RPC id 2
            return _value(await client.call_tool("pay", arguments))

    assert await asyncio.gather(one(), one()) == [8, 8]
    assert site.ran(flow) == {"charge": 2, "notify": 2}, "two callers' calls were merged through the balancer"
    # FlowClient: each call its own key, inline and as a task.
    for tasks in (False, True):
        flow = f"fc2-{tasks}-{secrets.token_hex(3)}"

        async def mine(tasks: bool = tasks, flow: str = flow) -> int:
            async with FlowClient(site.url, tasks=tasks) as client:
                return _value(await client.call_tool("pay_optional", {"flow": flow, "base": 3, "slow": 0.2}))

        assert await asyncio.gather(mine(), mine()) == [8, 8]
        assert site.ran(flow) == {"charge": 2, "notify": 2}, f"two FlowClient calls merged (tasks={tasks})"
    # Straight to one instance, byte-identical bodies, no stamp, no key, no principal: two calls.
    flow = f"raw-{secrets.token_hex(3)}"
    a = site.fleet.instances[0]
    async with httpx2.AsyncClient() as http:
        await asyncio.gather(*(_post(http, site.direct(a), _body(flow), None) for _ in range(2)))
    assert site.ran(flow) == {"charge": 2, "notify": 2}, "byte-identical bodies alone merged two callers"
