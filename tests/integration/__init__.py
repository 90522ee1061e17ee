"""In-process servers and clients: the official `mcp` Client against an in-process MCPServer, uvicorn on 127.0.0.1."""
