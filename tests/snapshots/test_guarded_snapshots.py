"""``guard(snapshot_store)``: the contract suite through the guard, and a database outage on the
PostgreSQL backend (real embedded server): reads answer stale, a save is staged and held (replayed
once the database answers again), the store's own answers (not found, conflict) are raised as they
are, every call measured."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded import guard
from guarded.backends.postgres import PostgresSnapshotStore
from guarded.controller import controller
from guarded.guard import GuardedStore
from guarded.observability import telemetry_names as names
from guarded.policy import Kind
from guarded.policy_table import PolicyTable
from guarded.snapshots import (
    FileSnapshotStore,
    SnapshotConflictError,
    SnapshotNotFoundError,
    SnapshotStore,
    SnapshotStoreUnavailableError,
)
from guarded.snapshots.guarded import GuardedSnapshotStore, guard_snapshots
from guarded.testing.snapshot_contract import make_content, run_snapshot_contracts
from tests.postgres.conftest import SMALL_POOL


def method_outcomes(registry: CollectorRegistry, store: str) -> Counter[tuple[str, str]]:
    """Calls of ``store`` by (method, outcome)."""
    counts: Counter[tuple[str, str]] = Counter()
    for family in registry.collect():
        for found in family.samples:
            if found.name == names.CALLS + "_total" and found.value and found.labels.get("store") == store:
                counts[(found.labels["method"], found.labels["outcome"])] += int(found.value)
    return counts


def test_guard_recognises_a_snapshot_store(tmp_path: Path) -> None:
    guarded = guard(FileSnapshotStore(tmp_path), registry=CollectorRegistry())
    assert isinstance(guarded, GuardedSnapshotStore)
    assert isinstance(guarded, SnapshotStore)
    assert not isinstance(guarded, GuardedStore)
    assert controller(guarded).name == "default"
    with pytest.raises(TypeError, match="takes a SnapshotStore"):
        guard_snapshots(object())


def test_the_policy_table_of_snapshot_methods() -> None:
    table = PolicyTable.for_snapshot_store()
    assert table.get("save").kind is Kind.UPSERT
    assert not table.get("save").dead_letter  # not held as its arguments: staged, then held
    assert table.get("save").staged
    assert table.get("save").repeat_safe
    assert table.get("tag").repeat_safe
    assert not table.get("delete").repeat_safe
    assert not table.get("gc").repeat_safe
    for read in ("get", "list", "lineage", "diff"):
        assert table.get(read).merge is not None, read  # stale-if-error
    assert table.get("load").merge is None


@pytest.mark.asyncio
async def test_the_contract_suite_passes_through_the_guard(tmp_path: Path) -> None:
    report = await run_snapshot_contracts(
        lambda: guard(FileSnapshotStore(tmp_path / uuid.uuid4().hex), registry=CollectorRegistry())
    )
    assert report.ok, str(report)


@pytest_asyncio.fixture
async def pg_snapshots(pg_dsn: str, schema_name: str) -> AsyncIterator[PostgresSnapshotStore]:
    store = await PostgresSnapshotStore.connect(pg_dsn, schema=schema_name, pool=SMALL_POOL)
    yield store
    await store.close()


@pytest.mark.asyncio
async def test_a_database_outage_answers_reads_stale_and_holds_saves(
    pg_snapshots: PostgresSnapshotStore, pg_dsn: str, schema_name: str
) -> None:
    registry = CollectorRegistry()
    guarded = guard(pg_snapshots, name="snaps", registry=registry, timeout=0.5, retries=0, breaker=False)
    async with guarded:
        first = await make_content("s-out", snapshot_id="out-1")
        saved = await guarded.save(first)
        assert await guarded.save(first) == saved  # idempotent through the guard
        await first.aclose()
        page = await guarded.list(subject_id="s-out")
        record = await guarded.get(saved.id)
        chain = await guarded.lineage(saved.id)
        with pytest.raises(SnapshotNotFoundError):
            await guarded.get("nope")  # the store's answer, raised as it is
        other = await make_content("s-out", snapshot_id="out-1", events=9)
        with pytest.raises(SnapshotConflictError):
            await guarded.save(other)

        locker = await asyncpg.connect(pg_dsn)
        try:
            await locker.execute("BEGIN")
            await locker.execute(f'LOCK TABLE "{schema_name}".snapshots IN ACCESS EXCLUSIVE MODE')
            # The database does not answer: what this process read is served stale.
            assert await guarded.list(subject_id="s-out") == page
            assert await guarded.get(saved.id) == record
            assert await guarded.lineage(saved.id) == chain
            with pytest.raises(SnapshotNotFoundError):
                await guarded.get("nope")  # the last answer for it, stale too
            # Nothing to serve: loud, with the backend's failure chained.
            with pytest.raises(SnapshotStoreUnavailableError, match="could not answer list"):
                await guarded.list(subject_id="never-listed")
            with pytest.raises(SnapshotStoreUnavailableError, match="could not answer load"):
                await guarded.load(saved.id)
            # A save the database cannot take is staged and held: the caller gets its record.
            fresh = await make_content("s-out", snapshot_id="out-2", events=40)
            assert await guarded.save(fresh) == fresh.snapshot
            assert controller(guarded).dead_letters is not None
            assert controller(guarded).dead_letters.depth == 1
            async with await guarded.load("out-2") as staged:  # read-your-writes, from the staged copy
                assert staged.snapshot.content_hash == fresh.snapshot.content_hash
        finally:
            await locker.execute("ROLLBACK")
            await locker.close()

        # The database is back: the held save is replayed, once.
        assert await controller(guarded).drain(30) == 0
        assert guarded.staging is not None
        assert guarded.staging.ids() == []
        async with await pg_snapshots.load("out-2") as landed:
            assert landed.snapshot.content_hash == fresh.snapshot.content_hash
            assert [len(b) async for b in landed.lines("events")] == [40]
        assert (await guarded.save(fresh)).id == "out-2"  # and saving it again is idempotent
        await fresh.aclose()
        await other.aclose()
        assert [s.id for s in (await guarded.list(subject_id="s-out")).items] == ["out-1", "out-2"]

    outcomes = method_outcomes(registry, "snaps")
    assert outcomes[("list", "stale")] == 1
    assert outcomes[("get", "stale")] == 2
    assert outcomes[("lineage", "stale")] == 1
    assert outcomes[("save", "ok")] == 4  # a conflict is the store's answer, not a failure
    assert outcomes[("save", "dead_lettered")] == 1
    failed = Counter({method: n for (method, outcome), n in outcomes.items() if outcome == "timeout"})
    assert failed == Counter({"list": 1, "load": 2})  # the second load answered from staging
