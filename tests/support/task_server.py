"""A durable-flow server for the fleet tests: `python tests/support/task_server.py --port 0`.

Reads MRTR_STATE_KEY (hex), MRTR_INSTANCE (label), MRTR_STORE (sqlite:///path, redis://...,
postgresql://...), MRTR_STORE_NAMESPACE (Redis prefix / Postgres table) and MRTR_AUDIT (a
file every step appends a JSON line to, so tests can count real side effects).
Optional (issue 11): MRTR_TOKENS (`name=token,...`: bearer auth, one principal per token),
MRTR_GUARD (a replay-guard store URL, namespaced like the store), MRTR_GUARD_LEASE, and
MRTR_MAX_INFLIGHT (load shedding above that many rounds in flight), MRTR_SEED=1 (seed dialect),
MRTR_SERVER_APP=1 (serve `server.streamable_http_app()`).
Optional (issue 16): MRTR_BUS (a fleet bus URL for `subscriptions/listen`, namespaced like the
store), MRTR_PLAIN=1 (no `mrtr.Flows` at all: the SDK's own listen handler on that bus).
Optional (issue 22): MRTR_FLEET_BUS=0 (`Flows(fleet_bus=False)`: no bus derived from a shared store).
Optional (issue 25): MRTR_PUBLIC_URL (`Flows(public_url=...)`: the fleet's base URL for callback URLs).
Optional (issue 40): MRTR_BUS_OPTIONS (JSON: keyword options for `mrtr.open_bus`, e.g. a tight
`max_outbox_age`); the `bus_stats` tool reports the bus's counters (`BrokerBus.stats()`), `bus_lags`
the lags its bus measured; MRTR_SCAN_INTERVAL (seconds between task scans: a long one keeps an
instance from taking up other instances' runnable tasks).
Prints `task-server ready: URL` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

import mrtr  # noqa: E402
from mrtr.stores import open_store  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

INSTANCE = os.environ.get("MRTR_INSTANCE", "?")
REQUESTS: Counter[str] = Counter()
"""Requests this instance served, by method (read through the `requests` tool)."""


async def count_requests(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    REQUESTS[ctx.method] += 1
    if ctx.method == "subscriptions/listen" and os.environ.get("MRTR_NO_TASK_KEYS") == "1":
        # An mrtr release from before listening ahead: it never sees `mrtr/taskKeys`.
        (ctx.params or {}).get("notifications", {}).pop("mrtr/taskKeys", None)
    return await call_next(ctx)


def audit(step: str, phase: str, **extra: Any) -> None:
    info = mrtr.current_step()
    line = {"step": step, "phase": phase, "instance": INSTANCE, "key": info.idempotency_key} | extra
    with open(os.environ["MRTR_AUDIT"], "a") as log:
        log.write(json.dumps(line) + "\n")


class Confirm(BaseModel):
    publish: bool


async def fetch(job: str) -> str:
    audit("fetch", "done")
    return f"data({job})"


async def transform(data: str, seconds: float) -> str:
    audit("transform", "start")
    await asyncio.sleep(seconds)
    audit("transform", "end")
    return data.upper()


async def publish(item: str) -> str:
    audit("publish", "done")
    return f"published {item}"


class StaticTokens:
    """The smallest real `TokenVerifier`: a fixed token -> client table (one principal each)."""

    def __init__(self, spec: str) -> None:
        self.clients = {token: name for name, token in (pair.split("=", 1) for pair in spec.split(","))}

    async def verify_token(self, token: str) -> AccessToken | None:
        client = self.clients.get(token)
        return None if client is None else AccessToken(token=token, client_id=client, scopes=[], subject=client)


class Target(BaseModel):
    env: str


def token_auth() -> dict[str, Any]:
    """`MCPServer` keyword arguments for bearer auth from MRTR_TOKENS (none when unset)."""
    tokens = os.environ.get("MRTR_TOKENS")
    if not tokens:
        return {}
    return {
        "auth": AuthSettings(
            issuer_url="http://127.0.0.1/issuer",
            resource_server_url="http://127.0.0.1/mcp",
            validate_token_resource=False,
        ),
        "token_verifier": StaticTokens(tokens),
    }


def build_server() -> tuple[MCPServer, mrtr.Flows | None]:
    namespace = os.environ.get("MRTR_STORE_NAMESPACE", "mrtr_fleet")
    auth = token_auth()
    bus_url = os.environ.get("MRTR_BUS")
    plain = os.environ.get("MRTR_PLAIN") == "1"
    bus: Any = None
    if bus_url:
        bus = mrtr.open_bus(bus_url, namespace=namespace, **json.loads(os.environ.get("MRTR_BUS_OPTIONS", "{}")))
        auth["subscriptions"] = bus
        if plain:  # no Flows to start the bus with the app: the server's lifespan does
            auth["lifespan"] = lambda _server: bus
    server = MCPServer(
        "task-fleet",
        request_state_security=RequestStateSecurity(keys=[bytes.fromhex(os.environ["MRTR_STATE_KEY"])]),
        middleware=[count_requests],
        **auth,
    )

    @server.tool()
    async def requests() -> dict[str, int]:
        """Requests this instance served so far, by method."""
        return dict(REQUESTS)

    @server.tool()
    async def bus_stats() -> dict[str, Any]:
        """This instance's fleet bus counters (empty without MRTR_BUS)."""
        return bus.stats() if bus is not None else {}

    @server.tool()
    async def bus_lags() -> list[float]:
        """Lags of the events this instance's bus received since the last call (`BrokerBus.drain_lags`)."""
        return bus.drain_lags() if bus is not None else []

    @server.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Raise `notifications/resources/updated` for `uri` (on this instance's bus)."""
        await ctx.notify_resource_updated(uri)
        return f"touched {uri} on {INSTANCE}"

    if plain:
        return server, None
    guard_url = os.environ.get("MRTR_GUARD")
    guard = None
    if guard_url:
        guard = mrtr.open_guard(
            guard_url, namespace=namespace, lease=float(os.environ.get("MRTR_GUARD_LEASE", "10")), max_wait=20
        )
    max_inflight = os.environ.get("MRTR_MAX_INFLIGHT")
    flows = mrtr.Flows(
        server,
        store=open_store(os.environ["MRTR_STORE"], namespace=namespace),
        task_lease=float(os.environ.get("MRTR_LEASE", "1.0")),
        task_scan_interval=float(os.environ.get("MRTR_SCAN_INTERVAL", "0.2")),
        task_poll_interval=0.1,
        replay_guard=guard,
        max_inflight_rounds=int(max_inflight) if max_inflight else None,
        dialects=["sep-2322-tasks"] if os.environ.get("MRTR_SEED") == "1" else (),
        fleet_bus=os.environ.get("MRTR_FLEET_BUS", "1") == "1",
        public_url=os.environ.get("MRTR_PUBLIC_URL") or None,
    )

    def counted(name: str) -> Any:
        async def run(seconds: float = 0.0) -> str:
            audit(name, "start")
            await asyncio.sleep(seconds)
            audit(name, "end")
            return f"{name} done"

        return run

    @flows.tool()
    async def deploy(slow: float, ctx: mrtr.FlowContext) -> str:
        """Ephemeral: ask where, apply (a counted side effect, `slow` seconds), confirm."""
        target = await ctx.elicit("Deploy where?", Target, key="where")
        applied = await ctx.step("apply", counted(f"apply@{target.env}"), slow)
        ok = await ctx.elicit(f"Keep {applied}?", Confirm, key="keep")
        return f"{applied} at {target.env}, publish={ok.publish}"

    @flows.tool()
    async def work(slow: float, ctx: mrtr.FlowContext) -> str:
        """Ephemeral, no input: two counted steps with a shed point between them."""
        first = await ctx.step("a", counted("a"))
        await ctx.checkpoint()
        second = await ctx.step("b", counted("b"), slow)
        return f"{first}, {second}"

    @flows.tool()
    async def hog(seconds: float, ctx: mrtr.FlowContext) -> str:
        """Ephemeral: one slow step, to keep a round in flight."""
        return await ctx.step("hog", counted("hog"), seconds)

    @server.tool()
    async def load() -> dict[str, int]:
        """This instance's shedding counters."""
        shedder = flows.shedder
        if shedder is None:
            return {"shed": 0, "kept": 0, "inflight": 0}
        return {"shed": shedder.shed, "kept": shedder.kept, "inflight": shedder.inflight}

    @flows.tool(task="required")
    async def pipeline(job: str, slow: float, ctx: mrtr.FlowContext) -> str:
        """Fetch, transform (slowly), ask whether to publish, publish: each side effect a step."""
        data = await ctx.step("fetch", fetch, job)
        shaped = await ctx.step("transform", transform, data, slow)
        answer = await ctx.elicit(f"Publish {shaped}?", Confirm)
        if not answer.publish:
            return "not published"
        return await ctx.step("publish", publish, shaped)

    add_wait_flows(server, flows)
    return server, flows


async def noted(step: str, tag: str, **extra: Any) -> str:
    """A step's side effect: one audit line, labelled with the test's `tag` for that task."""
    audit(step, "done", tag=tag, **extra)
    return f"{step} on {INSTANCE}"


async def slow_step(step: str, tag: str, seconds: float) -> str:
    audit(step, "start", tag=tag)
    await asyncio.sleep(seconds)
    audit(step, "end", tag=tag)
    return f"{step} on {INSTANCE}"


def add_wait_flows(server: MCPServer, flows: mrtr.Flows) -> None:
    """Durable waits (issue 25): sleeping, waiting for events, callback URLs, and a way to send events."""

    @flows.tool(task="required")
    async def nap(tag: str, seconds: float, ctx: mrtr.FlowContext) -> str:
        """A counted step, a durable sleep, another counted step."""
        await ctx.step("before", noted, "nap.before", tag)
        await ctx.sleep(seconds)
        await ctx.step("after", noted, "nap.after", tag)
        return f"{tag} rested {seconds}s"

    @flows.tool(task="required")
    async def await_event(
        tag: str,
        name: str,
        ctx: mrtr.FlowContext,
        timeout: float | None = None,
        times: int = 1,
        delay: float = 0.0,
        work: float = 0.0,
        lead: float = 0.0,
    ) -> str:
        """Optionally run a slow step (`lead` seconds) or sleep `delay` first, then wait `times` times
        for event `name`, then (if `work`) run a slow counted step; JSON of what came."""
        await ctx.step("before", noted, "await.before", tag)
        if lead:
            await ctx.step("lead", slow_step, "await.lead", tag, lead)
        if delay:
            await ctx.sleep(delay)
        got: list[Any] = []
        for i in range(times):
            try:
                payload = await ctx.wait_for_event(name, timeout=timeout)
            except mrtr.EventTimeout as exc:
                got.append({"timeout": str(exc)})
                await ctx.step(f"timeout{i}", noted, "await.timeout", tag)
                continue
            got.append({"payload": payload})
            await ctx.step(f"got{i}", noted, "await.got", tag, payload=payload)
        if work:
            await ctx.step("work", slow_step, "await.work", tag, work)
        return json.dumps(got)

    @flows.tool(task="required")
    async def deadline(tag: str, seconds: float, ctx: mrtr.FlowContext) -> str:
        """Event 'approve' or `seconds` of sleep, whichever comes first (`asyncio.wait`); the winner
        is recorded by a counted step, then a second step runs after it."""
        approve = asyncio.ensure_future(ctx.wait_for_event("approve"))
        timer = asyncio.ensure_future(ctx.sleep(seconds))
        done, pending = await asyncio.wait({approve, timer}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        winner = f"approved {approve.result()}" if approve in done else "timed out"
        await ctx.step("decide", noted, "deadline.decide", tag, winner=winner)
        await ctx.sleep(0.2)  # one more park and replay after the race was decided
        await ctx.step("after", noted, "deadline.after", tag)
        return winner

    @flows.tool(task="required")
    async def hooked(tag: str, ctx: mrtr.FlowContext, expires: float = 3600.0) -> str:
        """Hand out a callback URL (through a counted step), wait for its POST, act on it once."""
        url = await ctx.callback_url("ci", expires=expires)
        await ctx.step("hand-out", noted, "hooked.url", tag, url=url)
        payload = await ctx.wait_for_event("ci")
        await ctx.step("deploy", noted, "hooked.deploy", tag, payload=payload)
        return json.dumps(payload)

    @server.tool()
    async def send_event(task_id: str, name: str, payload: Any = None, event_id: str | None = None) -> dict[str, Any]:
        """`flows.send_event` on this instance: delivered (False: a resend), or why not."""
        try:
            delivered = await flows.send_event(task_id, name, payload, event_id=event_id)
        except mrtr.EventNotDelivered as exc:
            return {"delivered": False, "refused": exc.reason, "instance": INSTANCE}
        return {"delivered": delivered, "instance": INSTANCE}


def main() -> None:
    # The task worker starts with the app, whichever app: MRTR_SERVER_APP=1 serves the SDK's own
    # `server.streamable_http_app()` instead of `flows.streamable_http_app()`.
    def app() -> Any:
        server, flows = build_server()
        if os.environ.get("MRTR_SERVER_APP") == "1":
            return server.streamable_http_app(stateless_http=True)
        return (flows or server).streamable_http_app(stateless_http=True)

    serve_main(app, "task-server ready:")


if __name__ == "__main__":
    main()
