"""A deployment assistant served as an mrtr flow: many round trips, any instance.

The `deploy` tool is a conversation, written as one straight async function:

1. where to? (elicitation; declining aborts) + the client's roots, asked together;
2. which services? (a loop: one elicitation per service until the user ticks "done");
3. plan the release (a *step*: a side effect that runs once per flow, whatever instance
   serves the next round, and is replayed from the journal afterwards);
4. risk summary from the client's LLM (sampling, skipped if the client cannot sample);
5. a branch: production asks approval per service (a loop; "no" skips the service,
   declining the form cancels) and a change ticket; staging asks one confirmation;
6. roll out each approved service (one step each, with an idempotency key).

Also: an `announcement` prompt that asks who it is for, and a fixed-URI resource
`deployer://console-session` that sends the user to a login page (URL-mode elicitation).

Under MCP 2026-07-28 every question ends the request with `input_required`; the flow's
journal travels in the sealed `requestState`, so each round may land on another process
as long as all processes share `MRTR_STATE_KEY` and the server name. Under 2025-11-25
the same code sends ordinary server-to-client requests inside one call.

With `MRTR_STORE` set (a `mrtr.open_store` URL: `sqlite:////tmp/deployer-tasks.db`, four
slashes for an absolute path, or `redis://...` / `postgresql://...`) the server also offers
`migrate`, a *durable task* (tasks extension, `task="required"`): its journal lives in that
store, so when the worker running it dies, another instance sharing the store adopts it
once the lease (`MRTR_TASK_LEASE` seconds, default 10) runs out, and replays it.
`MRTR_STORE_NAMESPACE` picks the Redis key prefix / PostgreSQL table. Without `MRTR_STORE`
there is no `migrate` and no tasks extension, and the server is exactly the ephemeral one:
durability needs a store the whole fleet shares, which only the operator can name, and the
library's embedded default (a SQLite file in the per-user state directory) is one host's only.

Side effects are observable: each step appends a JSON line to the file named by
`MRTR_AUDIT_LOG` (if set), which is how the demo and the tests prove run-once.

Usage:
    MRTR_STATE_KEY=$(python -c 'import secrets; print(secrets.token_hex(32))') \\
    MRTR_INSTANCE=A python examples/deployer_server.py --port 8001   # HTTP at /mcp
    MRTR_STORE=sqlite:////tmp/deployer-tasks.db MRTR_TASK_LEASE=1 ...  # + the durable `migrate`
    python examples/deployer_server.py --stdio                        # stdio
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import socket
import sys
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse

import mrtr

SERVER_NAME = "deployer"
"""Constant across instances: it is the audience sealed into every `requestState`."""

READY_PREFIX = "deployer ready:"
"""First stdout line of an HTTP server, followed by its URL: spawners wait for it."""

MAX_SERVICES = 5
MAX_MIGRATION_SECONDS = 60.0

logger = logging.getLogger("deployer")


def instance_label() -> str:
    """Which process this is, for humans: the `MRTR_INSTANCE` env var (default: the pid)."""
    return os.environ.get("MRTR_INSTANCE") or f"pid{os.getpid()}"


# -- questions (elicitation schemas) --------------------------------------------------------


class Target(BaseModel):
    environment: Literal["staging", "production"] = Field(description="Where to deploy")


class AddService(BaseModel):
    service: str = Field(default="", description="A service to include, e.g. api (leave empty when done)")
    done: bool = Field(default=False, description="Tick when the list is complete")


class Approval(BaseModel):
    approve: bool = Field(description="Roll this service out now?")


class ChangeTicket(BaseModel):
    ticket: str = Field(pattern=r"^CHG-[0-9]+$", description="Approved change ticket, e.g. CHG-1234")


class Audience(BaseModel):
    audience: Literal["engineers", "customers"] = Field(description="Who reads the announcement")


class Cutover(BaseModel):
    switch: bool = Field(description="Switch live traffic to the migrated schema now?")


# -- results ---------------------------------------------------------------------------------


class Rollout(BaseModel):
    service: str
    receipt: str
    idempotency_key: str
    ran_on: str


class DeployReport(BaseModel):
    """The tool's structured result; `ran_on` fields show which instance did each side effect."""

    app: str
    status: Literal["deployed", "aborted", "cancelled", "nothing_approved"]
    environment: str | None = None
    services: list[str] = []
    workspace: str | None = None
    plan_id: str | None = None
    planned_on: str | None = None
    risk: str | None = None
    ticket: str | None = None
    rolled_out: list[Rollout] = []
    skipped: list[str] = []


class MigrationReport(BaseModel):
    """The `migrate` task's result; the `*_on` fields name the instance that really did each step."""

    app: str
    status: Literal["migrated", "not_switched"]
    backup: str
    backed_up_on: str
    schema_version: str
    migrated_on: str
    idempotency_key: str
    """The schema step's key: what a real migration tool would dedupe a re-run on."""
    switched_on: str | None = None


# -- side effects (run only inside ctx.step) -------------------------------------------------


def audit(step: str, **fields: Any) -> None:
    """Record that a side effect really ran (one JSON line; O_APPEND keeps lines whole)."""
    path = os.environ.get("MRTR_AUDIT_LOG")
    if not path:
        return
    line = json.dumps({"step": step, "instance": instance_label(), "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def make_plan(app: str, environment: str, services: list[str], workspace: str | None) -> dict[str, str]:
    """Reserve a release plan in the (imaginary) deploy system: not safe to repeat."""
    key = mrtr.current_step().idempotency_key
    plan_id = f"plan-{app}-{environment}-{secrets.token_hex(3)}"
    audit("plan", key=key, plan_id=plan_id, services=services, workspace=workspace)
    return {"plan_id": plan_id, "ran_on": instance_label()}


async def roll_out(plan_id: str, service: str, environment: str) -> Rollout:
    """Push one service. The idempotency key is what a real deploy API would dedupe on."""
    key = mrtr.current_step().idempotency_key
    await asyncio.sleep(0)  # stands in for the deploy API call
    receipt = f"{service}@{environment}#{secrets.token_hex(2)}"
    audit("rollout", key=key, plan_id=plan_id, service=service)
    return Rollout(service=service, receipt=receipt, idempotency_key=key, ran_on=instance_label())


def take_backup(app: str) -> dict[str, str]:
    """Snapshot the app's database before touching its schema (quick; never worth repeating)."""
    backup = f"backup-{app}-{secrets.token_hex(3)}"
    audit("backup", flow="migrate", key=mrtr.current_step().idempotency_key, backup=backup)
    return {"backup": backup, "ran_on": instance_label()}


async def migrate_schema(app: str, seconds: float) -> dict[str, str]:
    """The slow part: change the schema (not safe to interrupt, safe to redo under one key).

    Audited at start *and* end, so a worker killed in between shows up as a start without
    an end, and the re-run elsewhere as a second start under the same idempotency key.
    """
    key = mrtr.current_step().idempotency_key
    audit("migrate_schema", flow="migrate", phase="start", key=key)
    await asyncio.sleep(seconds)  # stands in for ALTER TABLE on a big table
    version = f"{app}-v2"
    audit("migrate_schema", flow="migrate", phase="end", key=key, schema_version=version)
    return {"schema_version": version, "ran_on": instance_label(), "key": key}


def switch_traffic(app: str, schema_version: str) -> str:
    """Point live traffic at the migrated schema."""
    audit("switch_traffic", flow="migrate", key=mrtr.current_step().idempotency_key, schema_version=schema_version)
    return instance_label()


def open_console_session() -> str:
    """Mint a console session (stands in for checking the login and creating the session)."""
    session = f"sess-{secrets.token_hex(4)}"
    audit("open_session", key=mrtr.current_step().idempotency_key, session=session)
    return session


# -- the server ------------------------------------------------------------------------------


def build_server(
    key: bytes, store: mrtr.TaskStore | None = None, task_lease: float = 10.0
) -> tuple[MCPServer, mrtr.Flows]:
    """The deployer server and its `Flows`; every instance of a fleet must get the same `key`.

    With a `store` (shared by the fleet) it also registers the durable `migrate` task.
    The `Flows` is returned because the app is `flows.streamable_http_app()`, the one way to
    build it: it starts this instance's task worker at boot (so it adopts a dead instance's
    tasks without waiting for a request) and can name the instance in a response header.
    """
    instructions = "Deployment assistant: call `deploy` with an app name and answer its questions."
    if store is not None:
        instructions += " `migrate` runs a schema migration as a durable task (tasks extension required)."
    server = MCPServer(SERVER_NAME, instructions=instructions, request_state_security=RequestStateSecurity(keys=[key]))
    flows = mrtr.Flows(
        server,
        store=store,
        task_lease=task_lease,
        # Look for orphans several times per lease, so a takeover follows a death closely.
        task_scan_interval=min(1.0, task_lease / 4),
        task_poll_interval=min(0.5, task_lease / 4),
        instance_name=instance_label(),  # `X-Mrtr-Instance` on every response of its app: who answered
    )

    @flows.tool()
    async def deploy(app: str, ctx: mrtr.FlowContext) -> DeployReport:
        """Deploy an app: asks where, which services, and for approvals before touching anything."""
        # Round 1: destination and (if the client has any) its roots, in one round trip.
        want_roots = ctx.client_supports("roots")
        target_ask = ctx.elicit(f"Where should {app} be deployed?", Target, key="target")
        try:
            if want_roots:
                target, roots = await ctx.gather(target_ask, ctx.list_roots(key="roots"))
            else:
                target, roots = await target_ask, []
        except mrtr.InputRefused:
            return DeployReport(app=app, status="aborted")
        env = target.environment
        workspace = str(roots[0].uri) if roots else None

        # A loop of asks: one service per round until the user says done.
        services: list[str] = []
        for i in range(1, MAX_SERVICES + 1):
            so_far = ", ".join(services) or "none yet"
            question = f"Services in this {app} release so far: {so_far}. Add one, or tick done."
            try:
                pick = await ctx.elicit(question, AddService, key=f"service_{i}")
            except mrtr.InputRefused:
                return DeployReport(app=app, status="aborted", environment=env, services=services)
            name = pick.service.strip()
            if name and name not in services:
                services.append(name)
            if pick.done or not name:
                break
        services = services or [app]

        plan = await ctx.step("plan", make_plan, app, env, services, workspace)
        report = DeployReport(
            app=app,
            status="deployed",
            environment=env,
            services=services,
            workspace=workspace,
            plan_id=plan["plan_id"],
            planned_on=plan["ran_on"],
        )

        risk_prompt = f"In one sentence: the main risk of deploying {', '.join(services)} of {app} to {env}?"
        if ctx.client_supports("sampling"):
            completion = await ctx.sample(risk_prompt, max_tokens=120, key="risk")
            report.risk = completion.content.text if completion.content.type == "text" else "(non-text answer)"

        # The branch: production is gated per service and by a ticket; staging by one "ok".
        approved: list[str] = []
        try:
            if env == "production":
                for service in services:
                    answer = await ctx.elicit(
                        f"Roll {service} out to PRODUCTION under {report.plan_id}? Risk: {report.risk or 'unknown'}",
                        Approval,
                        key=f"approve_{service}",
                    )
                    (approved if answer.approve else report.skipped).append(service)
                if approved:
                    change = await ctx.elicit("Change ticket for this release?", ChangeTicket, key="ticket")
                    report.ticket = change.ticket
            else:
                answer = await ctx.elicit(f"Deploy {report.plan_id} to staging?", Approval, key="confirm")
                (approved if answer.approve else report.skipped).extend(services)
        except mrtr.InputRefused:
            report.status = "cancelled"
            return report
        if not approved:
            report.status = "nothing_approved"
            return report

        for service in approved:
            report.rolled_out.append(await ctx.step(f"rollout:{service}", roll_out, plan["plan_id"], service, env))
        return report

    @flows.prompt()
    async def announcement(app: str, ctx: mrtr.FlowContext) -> str:
        """A release-announcement prompt; asks who it is for first."""
        who = await ctx.elicit(f"Who is the {app} announcement for?", Audience, key="audience")
        tone = "precise and technical" if who.audience == "engineers" else "friendly and jargon-free"
        return f"Write a short, {tone} announcement of the new {app} release for {who.audience}."

    @flows.resource("deployer://console-session", mime_type="application/json")
    async def console_session(ctx: mrtr.FlowContext) -> dict[str, str]:
        """Sign in to the deploy console (URL-mode elicitation: the login happens in a browser)."""
        url = f"https://console.deployer.example/login?flow={ctx.flow_id}"
        if not ctx.client_supports("elicitation.url"):
            return {"status": "sign-in required", "url": url}
        try:
            await ctx.elicit_url("Sign in to the deploy console to continue.", url, key="console_login")
        except mrtr.InputRefused:
            return {"status": "not signed in"}
        # Consent only: a real server would now check, in a step, that the login completed.
        session = await ctx.step("open_session", open_console_session)
        return {"status": "signed in", "session": session}

    if store is not None:

        @flows.tool(task="required")
        async def migrate(
            app: str,
            ctx: mrtr.FlowContext,
            seconds: Annotated[float, Field(ge=0, le=MAX_MIGRATION_SECONDS, description="How slow to migrate")] = 2.0,
        ) -> MigrationReport:
            """Migrate an app's database schema as a durable task: backup, migrate (slow), ask, cut over.

            Each side effect is a step, checkpointed to the store as it finishes. If the
            worker dies mid-migration, another instance resumes the task: the backup is
            replayed from the journal, the migration runs again under the same idempotency key.
            """
            backup = await ctx.step("backup", take_backup, app)
            schema = await ctx.step("migrate_schema", migrate_schema, app, seconds)
            report = MigrationReport(
                app=app,
                status="not_switched",
                backup=backup["backup"],
                backed_up_on=backup["ran_on"],
                schema_version=schema["schema_version"],
                migrated_on=schema["ran_on"],
                idempotency_key=schema["key"],
            )
            question = f"{app}: schema {report.schema_version} is ready (backup {report.backup}). Switch traffic?"
            try:
                answer = await ctx.elicit(question, Cutover, key="cutover")
            except mrtr.InputRefused:
                return report  # the old schema keeps serving; the backup stays for a later try
            if answer.switch:
                report.switched_on = await ctx.step("switch_traffic", switch_traffic, app, report.schema_version)
                report.status = "migrated"
            return report

    @server.custom_route("/healthz", methods=["GET"])  # type: ignore[untyped-decorator]  # the SDK's is unannotated
    async def healthz(request: Request) -> JSONResponse:
        """Readiness probe for spawners (not MCP)."""
        return JSONResponse({"ok": True, "instance": instance_label()})

    return server, flows


# -- serving ---------------------------------------------------------------------------------


def load_store() -> tuple[mrtr.TaskStore | None, float]:
    """The fleet's task store from `MRTR_STORE` (None if unset) and the lease from `MRTR_TASK_LEASE`."""
    raw_lease = os.environ.get("MRTR_TASK_LEASE", "10")
    try:
        lease = float(raw_lease)
    except ValueError:
        sys.exit(f"MRTR_TASK_LEASE must be a number of seconds, not {raw_lease!r}")
    if lease <= 0:
        sys.exit("MRTR_TASK_LEASE must be positive")
    url = os.environ.get("MRTR_STORE")
    if not url:
        return None, lease
    try:
        return mrtr.open_store(url, namespace=os.environ.get("MRTR_STORE_NAMESPACE")), lease
    except ValueError as exc:
        sys.exit(f"MRTR_STORE: {exc}")


def load_key() -> bytes:
    """The fleet's shared state key from `MRTR_STATE_KEY` (hex), or a process-local one."""
    raw = os.environ.get("MRTR_STATE_KEY")
    if not raw:
        logger.warning("MRTR_STATE_KEY not set: using a random key; other instances cannot resume these flows")
        return os.urandom(32)
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        sys.exit("MRTR_STATE_KEY must be hex (e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    if len(key) < 32:
        sys.exit("MRTR_STATE_KEY must hold at least 32 bytes (64 hex digits)")
    return key


async def serve_http(flows: mrtr.Flows, port: int) -> None:
    """Serve streamable HTTP on 127.0.0.1:`port` (0 = any free port) at /mcp.

    One app serves both eras: 2026-07-28 requests (`MCP-Protocol-Version: 2026-07-28`)
    are self-contained POSTs the SDK routes to its stateless handler whatever the
    session mode; older clients get ordinary stateful sessions, which they need for
    server-to-client requests (so legacy clients must stick to one instance). The app
    comes from `flows.streamable_http_app()` so the task worker (if any) lives with it.
    """
    import uvicorn

    app = flows.streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))  # bound before serving, so the printed port is really ours
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    runner = uvicorn.Server(config)
    serving = asyncio.create_task(runner.serve(sockets=[sock]))
    while not runner.started:
        if serving.done():
            await serving
            raise SystemExit("uvicorn did not start")
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    print(f"{READY_PREFIX} {url} instance={instance_label()}", flush=True)
    await serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="serve streamable HTTP on 127.0.0.1:PORT/mcp (0: any free port)")
    where.add_argument("--stdio", action="store_true", help="serve over stdin/stdout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("mrtr.fleet").setLevel(logging.INFO)  # start-up facts: which bus this instance uses
    store, lease = load_store()
    server, flows = build_server(load_key(), store, lease)
    if args.stdio:
        asyncio.run(server.run_stdio_async())
    else:
        asyncio.run(serve_http(flows, args.port))


if __name__ == "__main__":
    main()
