"""`Flows(protocol_versions=[...])`: serve only the protocol versions listed, on both hosts.

A fleet without sticky routing may serve only 2026-07-28 (every request stands alone); a
server may keep to 2025-11-25 while its clients move. Every other version gets the spec's
version-mismatch answer, -32022 (UnsupportedProtocolVersion) with
`data: {"supported": [...], "requested": "..."}`, which the SDK's HTTP transport sends with
HTTP 400:

- a 2026-07-28-era request (including `server/discover`) at a version not listed;
- an `initialize` whose negotiated version is not listed. The handshake negotiates as the SDK
  does (the requested version if it is a handshake version, else the latest one), and the
  result is refused rather than rewritten, so the session never holds a version the client
  was not told. An auto-negotiating client told `supported: ["2026-07-28"]` by `initialize`,
  or a handshake version by `server/discover`, knows where to go.

It is a server middleware of the SDK's low-level server, which both `MCPServer` and FastMCP
run every request through (stdio and HTTP alike), installed outermost. Notifications at a
version not served are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, KNOWN_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from mrtr._errors import FlowDefinitionError

DIALECT_VERSION = "2026-07-28"
"""The version the seed dialects are served at (each translates its wire to a 2026-07-28 request)."""


def served_versions(versions: Sequence[str], dialects: Sequence[str] = ()) -> tuple[str, ...]:
    """`protocol_versions=` checked: known versions, at least one; with dialects, 2026-07-28 among them.

    Raises:
        ValueError: An empty list, or a version this SDK does not know (naming the known ones).
        FlowDefinitionError: Seed dialects enabled while 2026-07-28 is not served.
    """
    if isinstance(versions, str):
        raise ValueError(f"protocol_versions takes a list of versions, e.g. [{versions!r}], not a string")
    listed = tuple(dict.fromkeys(versions))
    if not listed:
        raise ValueError(f"protocol_versions=[] serves nothing; list some of {list(KNOWN_PROTOCOL_VERSIONS)}")
    unknown = [v for v in listed if v not in KNOWN_PROTOCOL_VERSIONS]
    if unknown:
        raise ValueError(
            f"protocol_versions: unknown version(s) {unknown}; the known ones are {list(KNOWN_PROTOCOL_VERSIONS)}"
        )
    if dialects and DIALECT_VERSION not in listed:
        raise FlowDefinitionError(
            f"Flows(dialects={list(dialects)!r}, protocol_versions={list(listed)!r}): the seed dialects are served "
            f"as {DIALECT_VERSION} requests, so {DIALECT_VERSION} must be among the protocol versions"
        )
    return listed


class ServedVersions:
    """Server middleware refusing every request at a protocol version not in `versions` (see the module docstring)."""

    def __init__(self, versions: Sequence[str]) -> None:
        self.versions = tuple(versions)

    def refusal(self, requested: object) -> MCPError:
        return MCPError(
            code=UNSUPPORTED_PROTOCOL_VERSION,
            message=f"Unsupported protocol version {requested!r}: this server serves {', '.join(self.versions)}",
            data={"supported": list(self.versions), "requested": requested if isinstance(requested, str) else None},
        )

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        if ctx.method == "initialize":
            params = ctx.params or {}
            requested = params.get("protocolVersion")
            negotiated = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
            if negotiated not in self.versions:
                raise self.refusal(requested)
        elif ctx.protocol_version not in self.versions:
            if ctx.request_id is None:
                return None  # a notification: nothing to answer
            raise self.refusal(ctx.protocol_version)
        return await call_next(ctx)


__all__ = ["DIALECT_VERSION", "ServedVersions", "served_versions"]
