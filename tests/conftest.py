"""Suite-wide fixtures."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from guarded import backend
from guarded.testing import strict
from guarded.testing.redis_cluster import RedisCluster
from guarded.testing.redis_cluster import redis_cluster as started_redis_cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lenient: the test expects a caller's bug or a programming error to degrade as in "
        "production, so it runs outside strict mode",
    )


@pytest.fixture(autouse=True)
def _strict_guards(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every guard is strict (``guarded.testing.strict()``): a test that makes a wrong call by
    mistake fails where it makes it. Tests of how a caller's bug degrades are marked ``lenient``."""
    if request.node.get_closest_marker("lenient") is not None:
        yield
        return
    with strict():
        yield


@pytest.fixture(autouse=True)
def _private_state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets a state directory of its own: guards spill there by default
    (``$XDG_STATE_HOME/guarded/``), and no test adopts another test's held writes."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("GUARDED_DLQ_PATH", raising=False)


_wall_clock_ns = time.time_ns  # not the one a test may have patched when the fixture ends


@pytest.fixture(autouse=True)
def _process_clock_back_to_the_wall() -> Iterator[None]:
    """A test that moves the process's logical clock ahead (a stored time from "another host's
    clock, a minute ahead") leaves it at the wall clock: a later test that measures a TTL from its
    call's logical time would otherwise read a minute of it as gone."""
    yield
    backend._last = min(backend._last, _wall_clock_ns() // 1000)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One real Redis Cluster (three masters with a replica each) for the whole session: the
    cluster suite (tests/redis/cluster) and the differential test share it, each test under a key
    prefix of its own."""
    with started_redis_cluster() as cluster:
        yield cluster
