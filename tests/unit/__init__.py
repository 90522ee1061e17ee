"""Tests with no I/O: no sockets, no subprocesses, no database but in-memory SQLite."""
