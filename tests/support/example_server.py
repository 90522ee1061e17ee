"""Serve an example's FastMCP server for the fleet tests: `MRTR_EXAMPLE=examples/x.py python example_server.py`.

The example is loaded from its file exactly as a user runs it (its module-level `mcp`), and
served on 127.0.0.1 with `X-Mrtr-Instance` on every response (`MRTR_INSTANCE`), so a test can
run two instances of the example itself, not a copy of it. Prints `example-server ready: URL`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.support.fastmcp_server import named  # noqa: E402
from tests.support.serving import serve_main  # noqa: E402

READY_PREFIX = "example-server ready:"


def main() -> None:
    path = ROOT / os.environ["MRTR_EXAMPLE"]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its pydantic models and dataclasses look their module up
    spec.loader.exec_module(example)
    serve_main(lambda: named(example.mcp.http_app()), READY_PREFIX)


if __name__ == "__main__":
    main()
