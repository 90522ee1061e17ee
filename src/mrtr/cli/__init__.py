"""The `mrtr` console script: try flows by hand, administer durable tasks, read sealed state.

    mrtr call URL TOOL --arg k=v ...        drive a call through every round in the terminal
    mrtr tasks ls|show|cancel|purge --store URL
    mrtr inspect-state TOKEN                unseal a requestState (key from $MRTR_STATE_KEY)

Every failure ends with one line on stderr (`mrtr: ...`) and a documented exit code
(`mrtr.cli._errors`); `MRTR_DEBUG=1` shows the traceback instead. Needs the `cli` extra
(`pip install "mrtr[cli]"`: typer, rich, PyYAML).
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `mrtr` script."""
    try:
        from mrtr.cli._app import app
    except ImportError as exc:  # the `cli` extra is missing
        sys.stderr.write(f'mrtr: the command line needs the cli extra (pip install "mrtr[cli]"): {exc}\n')
        raise SystemExit(2) from None
    app(args=argv, prog_name="mrtr", standalone_mode=True)


def __getattr__(name: str) -> Any:
    if name == "app":
        from mrtr.cli._app import app

        return app
    raise AttributeError(name)


__all__ = ["main"]
