"""Errors the client caused, as FastMCP logs them: one INFO line, not an ERROR with a traceback.

FastMCP logs any exception a tool raises at ERROR with a full traceback, except its own
`FastMCPError`s, which it logs at their `log_level` without one. A flow's call can end
because of the client: a malformed sampling answer, a stale or foreign `requestState`, a
flow past its deadline or round cap, a round the replay guard refused, a user who declined.
None is a bug in the server, so an operator should not be paged by a traceback for them;
they become a `ToolError` with the same message, which FastMCP passes to the client as the
tool error it would have sent anyway. The engine has already logged a -32602 at INFO with its
reason (`mrtr.engine`), so FastMCP's own line (which names only the tool) drops to DEBUG; a
user's refusal is logged by FastMCP's line alone, at INFO.
"""

from __future__ import annotations

import logging

from fastmcp.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mrtr._errors import InputRefused


def quiet_tool_error(exc: MCPError | InputRefused) -> ToolError | None:
    """The quiet `ToolError` for a client-caused error; None for one that must reach the wire as it is.

    mrtr raises -32602 only for what the client sent (answers, state, a round it repeated or
    kept going past the caps); -32603 is the server's own failure and keeps its traceback, and
    any other code (-32021 above all, which FastMCP sends as a JSON-RPC error) passes through.
    """
    if isinstance(exc, InputRefused):
        return ToolError(str(exc), log_level=logging.INFO)
    if exc.error.code == INVALID_PARAMS:
        return ToolError(exc.error.message, log_level=logging.DEBUG)
    return None


__all__ = ["quiet_tool_error"]
