"""The host core under both `Flows`: `mrtr.Flows` (the SDK's `MCPServer`) and `mrtr.fastmcp.Flows`.

- `options`: `FlowsOptions`, the one definition of every `Flows` keyword, and `FlowOptions`;
- `core`: `HostCore`, every decision that does not depend on the framework;
- `adapter`: `Host`, the few framework seams each `Flows` implements for the core;
- `base`: `BaseFlows`, the public face both `Flows` share;
- `fleet`, `checks`, `registration`, `instance`: start-up checks, registration-time checks,
  the framework-registrable entry point, the `X-Mrtr-Instance` header.
"""
