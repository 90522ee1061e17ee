"""The package's shape: no import circle, every module importable alone, one fence around SDK internals."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "mrtr"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()

pytestmark = pytest.mark.in_process  # unless marked otherwise


def _imports(name: str, path: Path) -> set[str]:
    """Every mrtr module `name` imports, anywhere in the file (top level, functions, TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    # A module's own ancestor packages are imported before it by Python itself, whatever it
    # writes (`from mrtr.tasks import wire` names both): those are not design edges.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {t for t in targets if t in MODULES and t != name and t not in ancestors}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere_in_the_package() -> None:
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []
    # The checker itself finds a circle when there is one.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


_ALONE = """
import importlib, sys, traceback
failed = []
for module in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "mrtr" or m.startswith("mrtr.")]:
        del sys.modules[loaded]  # nothing of mrtr loaded before: the module must bring what it needs
    try:
        importlib.import_module(module)
    except Exception:
        failed.append(module + ": " + traceback.format_exc(limit=3))
print("\\n".join(failed))
raise SystemExit(1 if failed else 0)
"""


@pytest.mark.spawns  # a fresh interpreter
def test_every_module_imports_alone() -> None:
    modules = sorted(name for name in MODULES if not name.endswith("__main__"))  # __main__ runs the CLI
    run = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _ALONE, *modules],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


_SDK_INTERNALS = re.compile(
    r"\._(stamp|dispatcher|apply_extension|install_extension_interceptor|lowlevel_server|security|mcp_server)\b"
    r"|mcp\.[\w.]*\._\w+"
)


def test_only_the_sdk_adapter_touches_sdk_internals() -> None:
    offenders = []
    for name, path in MODULES.items():
        if name in ("mrtr._sdk", "mrtr.fastmcp._internals"):  # the SDK's fence, and FastMCP's
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _SDK_INTERNALS.search(code) and "self._" not in code:
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert offenders == [], "SDK internals belong in mrtr/_sdk.py"


def test_every_module_says_what_it_owns() -> None:
    missing = [name for name, path in MODULES.items() if ast.get_docstring(ast.parse(path.read_text())) is None]
    assert missing == []
