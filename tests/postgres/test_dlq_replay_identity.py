"""``guarded dlq replay`` replays a spill file only into the store it was recorded for: a file of
one PostgreSQL schema is refused by a store of another (both identities named, exit 2), and a
deliberate move takes ``--retarget`` with the identity the file recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.testing import Fault, FaultPlan, FaultyStore
from tests.cli.support import clean_environment, guarded
from tests.postgres.conftest import StoreFactory, new_schema_name

pytestmark = pytest.mark.asyncio

FACTORY = "guarded.backends.postgres.factory:create_store"


async def _held_for(make_store: StoreFactory, schema: str, spill: Path) -> str:
    """A spill file holding one write for ``schema`` (its store refused it); the identity it records."""
    store = await make_store(schema=schema)
    down = FaultyStore(
        store, FaultPlan.always(Fault.error_before(ConnectionRefusedError), methods={"save_memory_state"})
    )
    guarded_store = guard(
        down,
        registry=CollectorRegistry(),
        timeout=0.3,
        dead_letter={"path": str(spill), "drain_timeout": 0},  # closed without trying the store again
    )
    async with guarded_store:
        await guarded_store.save_memory_state("tenant_x:key", {"owner": "tenant_x"})
        buffer = controller(guarded_store).dead_letters
        assert buffer is not None
        assert buffer.depth == 1
    identity = store.target_identity
    assert isinstance(identity, str)
    return identity


async def test_replay_refuses_a_file_recorded_for_another_schema(
    make_store: StoreFactory, pg_dsn: str, tmp_path: Path
) -> None:
    tenant_x, tenant_a = new_schema_name(), new_schema_name()
    spill = tmp_path / "dlq.sqlite"
    recorded = await _held_for(make_store, tenant_x, spill)
    store_a = await make_store(schema=tenant_a)
    env = clean_environment(GUARDED_PG_DSN=pg_dsn, GUARDED_PG_SCHEMA=tenant_a)

    refused = guarded("dlq", "replay", "--path", str(spill), "--store", FACTORY, env=env)
    assert refused.code == 2, refused
    assert recorded in refused.err, refused.err
    assert store_a.target_identity in refused.err, refused.err
    assert "--retarget" in refused.err
    assert await store_a.load_memory_state("tenant_x:key") is None, "tenant_x's write reached tenant_a"

    wrong = guarded(
        "dlq",
        "replay",
        "--path",
        str(spill),
        "--store",
        FACTORY,
        "--retarget",
        "postgresql://elsewhere",
        env=env,
    )
    assert wrong.code == 2, wrong
    assert await store_a.load_memory_state("tenant_x:key") is None

    moved = guarded(
        "dlq", "replay", "--path", str(spill), "--store", FACTORY, "--retarget", recorded, env=env
    )
    assert moved.code == 0, moved
    assert "replayed 1 of 1" in moved.out
    assert await store_a.load_memory_state("tenant_x:key") == {"owner": "tenant_x"}


async def test_replay_into_the_recorded_schema_needs_no_option(
    make_store: StoreFactory, pg_dsn: str, tmp_path: Path
) -> None:
    tenant_x = new_schema_name()
    spill = tmp_path / "dlq.sqlite"
    await _held_for(make_store, tenant_x, spill)
    env = clean_environment(GUARDED_PG_DSN=pg_dsn, GUARDED_PG_SCHEMA=tenant_x)
    ran = guarded("dlq", "replay", "--path", str(spill), "--store", FACTORY, env=env)
    assert ran.code == 0, ran
    store_x = await make_store(schema=tenant_x)
    assert await store_x.load_memory_state("tenant_x:key") == {"owner": "tenant_x"}
