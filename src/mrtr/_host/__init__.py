"""The host core under both `Flows`: `mrtr.Flows` (the SDK's `MCPServer`) and `mrtr.fastmcp.Flows`.

- `options`: `FlowsOptions`, the one definition of every `Flows` keyword, and `FlowOptions` /
  `ToolOptions` with `flow_options`, the per-flow keywords checked by name;
- `core`: `HostCore`, every decision that does not depend on the framework;
- `call`: one request of a flow, run by the engine, ended in a typed `Outcome`;
- `adapter`: `Host`, the few framework seams each `Flows` implements for the core;
- `base`: `BaseFlows`, the public face both `Flows` share;
- `fleet`, `checks`, `registration`, `instance`: start-up checks, registration-time checks,
  the framework-registrable entry point, the `X-Mrtr-Instance` header.
"""
