"""Exit codes and the one-line errors the CLI ends with (never a traceback)."""

from __future__ import annotations

import os

EXIT_OK = 0
EXIT_TOOL_ERROR = 1
"""The tool answered with `isError`, or a durable task failed."""
EXIT_USAGE = 2
"""Bad input: options, arguments, unknown tool/prompt, answers file, store URL, key."""
EXIT_UNREACHABLE = 3
"""The server (or store) could not be reached."""
EXIT_PROTOCOL = 4
"""The server answered with a JSON-RPC error."""
EXIT_ABANDONED = 5
"""The person (or the answers file) cancelled, or no answer could be given."""
EXIT_TASK_CANCELLED = 6
"""The durable task ended `cancelled`."""
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """Ends the command with `mrtr: <message>` on stderr and `exit_code`."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(CliError):
    exit_code = EXIT_USAGE


class Unreachable(CliError):
    exit_code = EXIT_UNREACHABLE


class Abandoned(CliError):
    exit_code = EXIT_ABANDONED


def debug() -> bool:
    """`MRTR_DEBUG=1`: show the traceback instead of the one-line error."""
    return os.environ.get("MRTR_DEBUG", "") not in ("", "0")


__all__ = [
    "EXIT_ABANDONED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROTOCOL",
    "EXIT_TASK_CANCELLED",
    "EXIT_TOOL_ERROR",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Abandoned",
    "CliError",
    "Unreachable",
    "UsageError",
    "debug",
]
