"""The markers that choose tests by what they need: registered, selected by `make test-fast`, guarded.

tests/conftest.py runs `markers.check` on every collection, so a test under tests/fleet or
tests/external that declares nothing fails the whole run before anything runs. These tests
show the guard catches what it must, and that pyproject.toml, the Makefile and
tests/support/markers.py agree on the list.
"""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.support import markers
from tests.support.flowkit import ROOT_DIR
from tests.support.markers import Collected, check


def test_pyproject_registers_exactly_the_markers_the_guard_knows() -> None:
    config = tomllib.loads((ROOT_DIR / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.partition(":")[0] for line in config["markers"]}
    assert registered == {*markers.NEEDS, markers.IN_PROCESS, markers.ALONE}
    assert "--strict-markers" in config["addopts"]  # a misspelt marker is an error, not a silent no-op


def test_make_test_fast_deselects_every_need_over_the_whole_tree() -> None:
    makefile = (ROOT_DIR / "Makefile").read_text()
    (expression,) = re.findall(r"^FAST := (.*)$", makefile, re.M)
    assert expression == markers.fast_expression()
    (recipe,) = re.findall(r"^test-fast:.*\n\t(.*)$", makefile, re.M)
    assert '-m "$(FAST)"' in recipe
    assert "tests/" not in recipe  # chosen by marker, not by directory
    (recipe,) = re.findall(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)
    runs = [run.strip() for run in re.findall(r"\$\(PY\) -m pytest([^;&]*)", recipe)]
    # `make test` (CI) runs everything: test-fast's selection, then exactly the rest, in two parts:
    # shared by modules on two workers, then what must run alone.
    assert runs == [
        '-q -n 4 --dist worksteal -m "$(FAST)"',
        '-q -n 2 --dist loadfile -m "not ($(FAST)) and not alone"',
        '-q -m "not ($(FAST)) and alone"',
    ]


def test_an_undeclared_test_under_fleet_or_external_is_refused() -> None:
    problems = check(
        [
            Collected("tests/fleet/test_new.py::test_spawns_a_fleet", "tests/fleet/test_new.py", {"anyio"}),
            Collected("tests/external/test_x.py::test_y", "tests/external/test_x.py", set()),
            Collected("tests/integration/test_z.py::test_z", "tests/integration/test_z.py", set()),
        ]
    )
    assert len(problems) == 2
    assert problems[0].startswith("tests/fleet/test_new.py::test_spawns_a_fleet: declares no need")
    assert problems[1].startswith("tests/external/test_x.py::test_y: declares no need")


@pytest.mark.parametrize("declared", [{"spawns"}, {"needs_redis"}, {"in_process"}, {"spawns", "needs_node"}])
def test_a_declared_test_passes(declared: set[str]) -> None:
    assert check([Collected("tests/fleet/t.py::t", "tests/fleet/t.py", declared)]) == []


def test_a_need_shown_by_a_fixture_or_a_store_parameter_must_be_declared() -> None:
    temporal = Collected("tests/fleet/t.py::a", "tests/fleet/t.py", {"spawns"}, fixtures=("temporal_address",))
    npx = Collected("tests/external/t.py::b", "tests/external/t.py", {"spawns"}, fixtures=("npx", "tmp_path"))
    redis = Collected("tests/integration/t.py::c[redis]", "tests/integration/t.py", set(), params={"kind": "redis"})
    postgres = Collected("tests/fleet/t.py::d", "tests/fleet/t.py", {"spawns"}, params={"guard_kind": "postgres"})
    sqlite = Collected("tests/fleet/t.py::e", "tests/fleet/t.py", {"in_process"}, params={"kind": "sqlite"})
    problems = check([temporal, npx, redis, postgres, sqlite])
    assert [p.split(":", 1)[0] for p in problems] == [
        "tests/fleet/t.py",
        "tests/external/t.py",
        "tests/integration/t.py",
        "tests/fleet/t.py",
    ]
    assert "needs_temporal" in problems[0] and "needs_node" in problems[1]
    assert "needs_redis" in problems[2] and "needs_postgres" in problems[3]


def test_backends_marks_the_services_and_keeps_the_values() -> None:
    params = markers.backends("sqlite", "redis", ("postgres", "flows"))
    assert [p.values for p in params] == [("sqlite",), ("redis",), ("postgres", "flows")]
    assert [[m.name for m in p.marks] for p in params] == [[], ["needs_redis"], ["needs_postgres"]]


def test_every_collection_goes_through_the_guard(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py refuses a collection holding an undeclared test under tests/fleet, before `-m` selects."""
    from tests import conftest

    class Item:  # what the hook reads of a pytest item
        nodeid = "tests/fleet/test_new.py::test_forgot_its_marker"
        path = request.config.rootpath / "tests" / "fleet" / "test_new.py"
        fixturenames = ("tmp_path",)

        def iter_markers(self) -> list[pytest.Mark]:
            return [pytest.mark.anyio.mark]

    items = list(request.session.items)
    conftest.pytest_collection_modifyitems(request.config, items)  # this session's own tests pass
    with pytest.raises(pytest.UsageError, match="test_forgot_its_marker: declares no need"):
        conftest.pytest_collection_modifyitems(request.config, [*items, Item()])  # type: ignore[list-item]
