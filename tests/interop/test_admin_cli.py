"""``penguiflow-admin history`` / ``replay`` as real subprocesses on our PostgreSQL factories.

PenguiFlow's admin CLI loads a store from ``--state-store module:callable`` (sync or async) and
prints ``load_history`` as JSON lines (spec 000, "Admin CLI" factory contract:
``save_event`` / ``load_history`` / ``save_remote_binding``). The factories read ``GUARDED_PG_*``
(``guarded/backends/postgres/factory.py``); loading them in-process is covered by
``tests/postgres/test_factory_cli_penguiflow.py``. Here the history comes from a real PenguiFlow
run through ``guard(PostgresStateStore)`` and the CLI runs as the installed console script.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from penguiflow.admin import render_events

from guarded.testing.postgres import free_port
from tests.postgres.conftest import StoreFactory

from .support import FATAL, audited_flow, guarded_postgres, run_messages

pytestmark = pytest.mark.asyncio

ADMIN = Path(sys.executable).with_name("penguiflow-admin")
REPO_ROOT = Path(__file__).resolve().parents[2]
FACTORY = "guarded.backends.postgres.factory:create_store"
LAZY_FACTORY = "guarded.backends.postgres.factory:create_store_lazy"
GUARDED_FACTORY = "tests.interop.support:guarded_store_from_env"


@dataclass(frozen=True)
class Finished:
    code: int | None
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def factory_env(dsn: str, schema: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("GUARDED_")}
    env.update(
        GUARDED_PG_DSN=dsn,
        GUARDED_PG_SCHEMA=schema,
        GUARDED_PG_POOL_MIN_SIZE="1",
        GUARDED_PG_POOL_MAX_SIZE="2",
        GUARDED_PG_STATS_INTERVAL="none",
        GUARDED_PG_CONNECT_TIMEOUT="5",
        PYTHONPATH=str(REPO_ROOT),  # for the tests.interop.support factory
    )
    return env


async def penguiflow_admin(env: dict[str, str], *argv: str) -> Finished:
    process = await asyncio.create_subprocess_exec(
        str(ADMIN),
        *argv,
        env=env,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    return Finished(process.returncode, out.decode(), err.decode())


async def test_history_and_replay_print_what_the_flow_recorded(
    make_store: StoreFactory, pg_dsn: str, schema_name: str
) -> None:
    assert ADMIN.is_file(), f"penguiflow's console script is missing: {ADMIN}"
    async with guarded_postgres(make_store) as store:
        audited = audited_flow(store)
        (ok, _), (fatal, _) = await run_messages(audited.flow, ["hello", FATAL])
        ok_history = await store.load_history(ok.trace_id)  # flushes the batched events
        fatal_history = await store.load_history(fatal.trace_id)
    assert len(ok_history) == 9
    assert len(fatal_history) == 8

    env = factory_env(pg_dsn, schema_name)
    history = await penguiflow_admin(env, "history", "--state-store", FACTORY, ok.trace_id)
    replay = await penguiflow_admin(
        env, "replay", "--state-store", LAZY_FACTORY, "--tail", "3", fatal.trace_id
    )
    guarded_tail = await penguiflow_admin(
        env, "history", "--state-store", GUARDED_FACTORY, "--tail", "2", fatal.trace_id
    )

    for finished in (history, replay, guarded_tail):
        assert (finished.code, finished.err) == (0, "")
    assert history.lines == render_events(ok_history)
    assert [line for line in history.lines if '"event": "node_retry"' in line]
    assert replay.lines == [
        f"# replay trace={fatal.trace_id} events=3",
        *render_events(fatal_history, tail=3),
    ]
    assert '"event": "node_failed"' in replay.lines[-1]
    assert guarded_tail.lines == render_events(fatal_history, tail=2)


async def test_an_unreachable_database_is_reported_not_shown_as_an_empty_history(schema_name: str) -> None:
    env = factory_env(f"postgresql://nobody@127.0.0.1:{free_port()}/none", schema_name)
    finished = await penguiflow_admin(env, "history", "--state-store", FACTORY, "trace-1")
    assert finished.code == 1
    assert finished.out == ""
    assert finished.err.startswith("error: ")
    assert "Traceback" not in finished.err
