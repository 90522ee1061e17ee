"""What a new user sees first (#50): `dir()` of the public modules, and the console's install hint.

`dir(mrtr)` is how people (and editors) discover the API: it lists each public name once,
and none of the module's own imports. `mrtr console` without its extra names the package to
install in a form a shell does not mangle: `'mrtr[console]'`, brackets kept.
"""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

import mrtr
import mrtr.testing


def test_dir_lists_each_public_name_once_and_no_leftovers() -> None:
    mrtr.Flows  # noqa: B018 (resolved into the module's globals: it must not show twice)
    mrtr.FlowContext  # noqa: B018
    names = dir(mrtr)
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert set(names) == {*mrtr.__all__, "__version__"}
    for leftover in ("Any", "TYPE_CHECKING", "annotations", "import_module", "_EXPORTS"):
        assert leftover not in names
    assert dir(mrtr.testing) == sorted(mrtr.testing.__all__)
    assert "run_rounds" in dir(mrtr.testing) and "Journal" not in dir(mrtr.testing)


def test_the_console_without_its_extra_says_what_to_install_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    from mrtr.cli._app import app

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the console extra were not installed
    result = CliRunner().invoke(app, ["console", "--store", "sqlite:///:memory:"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "pip install 'mrtr[console]'" in result.stderr, result.stderr
