"""mrtr on FastMCP: `await ctx.elicit(...)` works again on 2026-07-28, across a fleet (`mrtr[fastmcp]`).

    from fastmcp import Context, FastMCP
    from mcp.server.request_state import RequestStateSecurity
    import mrtr
    import mrtr.fastmcp

    mcp = FastMCP("expenses", request_state_security=RequestStateSecurity(keys=[KEY]))
    flows = mrtr.fastmcp.Flows(mcp)

    @flows.tool()                        # was: @mcp.tool
    async def submit(amount: float, ctx: Context) -> str:
        answer = await ctx.elicit(f"Approve {amount}?", response_type=bool)   # FastMCP 3.x code, unchanged
        if answer.action != "accept" or not answer.data:
            return "not submitted"
        receipt = await mrtr.step("file", file_expense, amount)              # runs once per flow
        return f"submitted: {receipt}"

A flow takes either FastMCP's `Context` (3.x-era code: `elicit`, `sample`, `list_roots`) or
`mrtr.FlowContext` (the same flow code as on the SDK's `MCPServer`). Side effects are steps:
`await mrtr.step(name, fn, ...)`, or `ctx.step(...)` on a `FlowContext`.
"""

try:
    import fastmcp as _fastmcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("mrtr.fastmcp needs the fastmcp extra: pip install 'mrtr[fastmcp]'") from exc

from mrtr.fastmcp._context import FlowsContext
from mrtr.fastmcp._flows import Flows
from mrtr.fastmcp._sampling import SampleStep, SamplingResult, SamplingTool

__all__ = ["Flows", "FlowsContext", "SampleStep", "SamplingResult", "SamplingTool"]
