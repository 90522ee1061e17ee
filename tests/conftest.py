"""Shared pytest settings: mrtr runs flows as asyncio tasks, so every async test uses asyncio."""

import threading
from collections.abc import Iterator

import pytest

_PREFETCH = pytest.StashKey[threading.Thread | None]()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A task flow without `store=` keeps its tasks in the per-user state directory: the suite's
    own (`MRTR_STATE_DIR`, which spawned servers inherit), never the home of whoever runs it."""
    import os

    saved = os.environ.get("MRTR_STATE_DIR")
    os.environ["MRTR_STATE_DIR"] = str(tmp_path_factory.mktemp("mrtr-state"))
    yield
    if saved is None:
        os.environ.pop("MRTR_STATE_DIR", None)
    else:
        os.environ["MRTR_STATE_DIR"] = saved


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """A real Temporal dev server for the session (`tests/support/temporalkit.py`); started on first use."""
    from tests.support.temporalkit import in_ci, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        if in_ci():
            pytest.fail(f"{reason}; CI must run the Temporal tests, not skip them")
        pytest.skip(reason)
    from mrtr.temporal._devserver import dev_server

    with dev_server() as address:  # fails loudly (with the server's log) if it cannot start
        yield address


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The `redis+cluster://` URL of a private local Redis Cluster (3 primaries, no replicas) for
    the session (`tests/support/redis_cluster.py`); started on first use, never the shared Redis.
    Tests namespace their keys; the failover test starts a cluster of its own."""
    import os

    from tests.support.redis_cluster import LocalCluster

    reason = LocalCluster.available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the Redis Cluster tests, not skip them")
        pytest.skip(reason)
    with LocalCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster.url


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a collection in which a test under tests/fleet or tests/external declares no need,
    or a test's fixtures or store parameters show a need it does not declare (tests/support/markers.py):
    such a test would slip into `make test-fast`.

    Then the modules holding property tests go first, whole (a stable sort that keeps each
    module's tests together, so a module's fixtures start once; `-m` keeps the order): hypothesis
    runs each for many examples (the replay oracles take 5-20 s), and one started last on an
    xdist worker would be the run's tail while the other workers idle."""
    from tests.support.markers import check, collected

    problems = check(collected(item, config.rootpath) for item in items)
    if problems:
        raise pytest.UsageError("tests with undeclared needs:\n  " + "\n  ".join(problems))
    properties = {item.parent for item in items if getattr(getattr(item, "obj", None), "is_hypothesis_test", False)}
    items.sort(key=lambda item: item.parent not in properties)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the venvs the selected tests will need (tests/support/prefetch.py)."""
    from tests.support import prefetch

    if not session.config.option.collectonly:
        session.config.stash[_PREFETCH] = prefetch.start([item.nodeid for item in session.items])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Never leave a build half done: a venv cut off mid-install would be rebuilt by the next run."""
    thread = session.config.stash.get(_PREFETCH, None)
    if thread is not None:
        thread.join()
