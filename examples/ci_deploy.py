"""A deployment task that waits for CI through a webhook, then asks the user to confirm.

`ship` is a durable task (`task="required"`): it mints a callback URL
(`ctx.callback_url("ci")`), starts a CI pipeline that will POST its verdict there, and parks
the task (`ctx.wait_for_event("ci", timeout=...)`) — `working`, no worker holding it, for
as long as CI takes, across restarts of the whole fleet. When CI POSTs, any instance
resumes it; the user is asked to confirm (the task goes `input_required`), and the deploy
step runs once.

`start_pipeline` and `deploy` stand in for your CI's and your platform's APIs: here the
pipeline just prints the URL to POST to, e.g.

    curl -X POST -H 'content-type: application/json' -d '{"status": "passed"}' <URL>

Usage (one instance; a fleet shares MRTR_STATE_KEY and MRTR_STORE):
    MRTR_STATE_KEY=$(python -c 'import secrets; print(secrets.token_hex(32))') \\
    MRTR_STORE=sqlite:////tmp/ci-deploy.db python examples/ci_deploy.py --port 8000
"""

from __future__ import annotations

import argparse
import os
import secrets
from datetime import timedelta

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel, Field

import mrtr

PIPELINES: dict[str, str] = {}
"""The demo CI: run id -> the URL it reports to (a real CI keeps that itself)."""


def start_pipeline(app: str, ref: str, report_to: str) -> str:
    """Start CI for `app` at `ref`; it POSTs `{"status": ...}` to `report_to` when done."""
    run_id = f"ci-{secrets.token_hex(3)}"
    PIPELINES[run_id] = report_to
    print(f"CI {run_id} building {app}@{ref}; POST its verdict to {report_to}", flush=True)
    return run_id


def deploy(app: str, ref: str) -> str:
    return f"{app}@{ref} is live"


class Go(BaseModel):
    deploy: bool = Field(description="Deploy to production now?")


def build(store: mrtr.TaskStore, public_url: str, server: MCPServer | None = None) -> mrtr.Flows:
    server = server or MCPServer("ci-deploy")
    # --8<-- [start:ship]
    # A task lives `task_ttl` seconds from its creation, waits included: a day covers CI's hour.
    flows = mrtr.Flows(server, store=store, public_url=public_url, task_ttl=24 * 3600)

    @flows.tool(task="required")
    async def ship(app: str, ref: str, ctx: mrtr.FlowContext) -> str:
        """Build `ref` of `app` in CI, then deploy it once the user confirms."""
        hook = await ctx.callback_url("ci", expires=timedelta(hours=2))  # sealed, single-use URL
        run_id = await ctx.step("start-ci", start_pipeline, app, ref, hook)  # CI will POST its verdict there
        try:
            verdict = await ctx.wait_for_event("ci", timeout=timedelta(hours=1))  # parked: no worker holds it
        except mrtr.EventTimeout:
            return f"CI run {run_id} never reported back; nothing was deployed"
        if verdict.get("status") != "passed":
            return f"CI run {run_id} {verdict.get('status', 'failed')}; nothing was deployed"
        go = await ctx.elicit(f"CI passed for {app}@{ref}. Deploy to production?", Go)
        if not go.deploy:
            return "held back"
        return await ctx.step("deploy", deploy, app, ref)

    # --8<-- [end:ship]
    return flows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--public-url", default=None, help="the URL CI reaches this fleet at")
    options = parser.parse_args()
    key = os.environ["MRTR_STATE_KEY"]
    server = MCPServer("ci-deploy", request_state_security=RequestStateSecurity(keys=[bytes.fromhex(key)]))
    store = mrtr.open_store(os.environ.get("MRTR_STORE", "sqlite:///ci-deploy.db"))
    flows = build(store, options.public_url or f"http://127.0.0.1:{options.port}", server)
    uvicorn.run(flows.streamable_http_app(), host="127.0.0.1", port=options.port)


if __name__ == "__main__":
    main()
