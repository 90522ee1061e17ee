"""One room at a time, a package per room: `engine`, `host`, `tasks`, `stores`, and `suite` (the test
suite's own machinery). No subprocesses and no services: in-memory SQLite at most, and sockets on
127.0.0.1 that never answer (a store that is down)."""
