"""Claude Code as a tested host: its install, a stand-in for the model's API, the MCP server it drives."""
