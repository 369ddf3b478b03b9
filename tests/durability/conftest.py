"""The acceptance tests of "nothing acknowledged is lost" with the default configuration.

The PostgreSQL fixtures are the PostgreSQL suite's own (the session server, a fresh schema per
test). Tests that stop, restart or stall a server get one of their own module (``server``): the
session server other tests use is never touched. Every test has its own state directory
(``XDG_STATE_HOME``), so the default spill path of a guard is under the test's ``tmp_path``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres
from tests.postgres.conftest import pg_dsn, pg_server, schema_name

from ._support import thaw

__all__ = ["module_server", "pg_dsn", "pg_server", "schema_name", "server", "state_home"]


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``XDG_STATE_HOME`` of the test (read when a ``GuardConfig()`` is built): the default spill
    files go under it, never under the user's home."""
    home = tmp_path / "state"
    home.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.delenv("GUARDED_DLQ_PATH", raising=False)
    return home


@pytest.fixture(scope="module")
def module_server() -> Iterator[EmbeddedPostgres]:
    """A server of the module's own: its tests stop and stall it. ``synchronous_commit`` on, so a
    commit the store saw survives a stop."""
    with embedded_postgres(settings={"synchronous_commit": "on"}) as own:
        yield own
        thaw(own)


def _running(server: EmbeddedPostgres) -> None:
    """Thawed and started, whatever the previous test left."""
    thaw(server)
    if not server.running:
        server.start()


@pytest.fixture
def server(module_server: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """The module's server, running when the test starts; thawed and running again after it."""
    _running(module_server)
    yield module_server
    _running(module_server)
