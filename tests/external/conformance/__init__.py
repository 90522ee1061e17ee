"""The official MCP conformance suite against mrtr: fixture server, client under test, harness, summary."""
