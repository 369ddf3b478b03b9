"""Format versions fail loudly: an old snapshot loads through its migrations; a missing, failing or
too-new version raises an error naming the versions, and nothing is loaded or left behind."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.codec import JSONObject
from guarded.snapshots import (
    FORMAT_VERSION,
    SECTIONS,
    FileSnapshotStore,
    FormatTooNewError,
    Migration,
    MigrationFailedError,
    MigrationRegistry,
    MissingMigrationError,
    SnapshotContent,
    capture,
    restore,
)
from guarded.snapshots.migrations import V1_SECTIONS, V1_TO_V2

from ._old_formats import write_v1
from ._sessions import observe, populate


async def _lines(content: SnapshotContent) -> dict[str, list[bytes]]:
    return {name: [line async for batch in content.lines(name) for line in batch] for name in SECTIONS}


async def _store_v1(
    root: Path, seed: int = 0
) -> tuple[str, dict[str, list[bytes]], InMemoryStateStore, list[str]]:
    """A v1 snapshot of a random session in ``root``: its id, the v2 lines it must migrate to, the source."""
    source = InMemoryStateStore()
    traces = await populate(source, random.Random(seed), "s1")
    current = FileSnapshotStore(root)
    async with await capture(
        source, session_id="s1", memory_keys=["custom:s1"], tags=["old"], description="from v1"
    ) as captured:
        saved = await current.save(captured)  # puts the blobs in place
        await current.delete(saved.id)
        expected = await _lines(captured)
        await write_v1(root, captured)
    return saved.id, expected, source, traces


@pytest.mark.asyncio
async def test_a_v1_snapshot_loads_through_its_migration(tmp_path: Path) -> None:
    snapshot_id, expected, source, traces = await _store_v1(tmp_path)
    store = FileSnapshotStore(tmp_path)
    stored = await store.get(snapshot_id)
    assert stored.format_version == 1
    assert (stored.subject_kind, stored.subject_id, stored.tags) == ("session", "s1", ("old",))
    assert [s.id for s in (await store.list(subject_id="s1")).items] == [snapshot_id]
    async with await store.load(snapshot_id) as content:
        assert content.snapshot.format_version == FORMAT_VERSION == 2
        assert content.snapshot.description == "from v1"
        assert await _lines(content) == expected
        assert content.snapshot.counts["updates"] == len(expected["updates"]) > 0
        target = InMemoryStateStore()
        await restore(content, target)
    assert await observe(target, "s1", traces) == await observe(source, "s1", traces)


@pytest.mark.asyncio
async def test_a_missing_migration_names_the_versions(tmp_path: Path) -> None:
    snapshot_id, *_ = await _store_v1(tmp_path)
    store = FileSnapshotStore(tmp_path, migrations=MigrationRegistry([]))
    with pytest.raises(
        MissingMigrationError,
        match="version 1 cannot be migrated to 2: no migration registered from version 1",
    ) as caught:
        await store.load(snapshot_id)
    assert (caught.value.found, caught.value.current, caught.value.missing_from) == (1, 2, 1)


@pytest.mark.asyncio
async def test_a_gap_in_the_chain_is_a_missing_migration(tmp_path: Path) -> None:
    snapshot_id, *_ = await _store_v1(tmp_path)
    identity = Migration(2, SECTIONS, lambda manifest: manifest, lambda name, record: [(name, record)])
    store = FileSnapshotStore(tmp_path, migrations=MigrationRegistry([V1_TO_V2, identity], current=4))
    with pytest.raises(MissingMigrationError, match="from version 3") as caught:
        await store.load(snapshot_id)
    assert (caught.value.found, caught.value.current) == (1, 4)


def _explode_on_steering(name: str, record: JSONObject) -> Iterable[tuple[str, JSONObject]]:
    if name == "session_log" and record["type"] == "steering":
        raise RuntimeError("cannot read this steering record")
    return V1_TO_V2.record(name, record)


@pytest.mark.asyncio
async def test_a_failing_migration_loads_nothing_and_leaves_nothing(tmp_path: Path) -> None:
    snapshot_id, *_ = await _store_v1(tmp_path / "store")
    failing = Migration(1, V1_SECTIONS, V1_TO_V2.manifest, _explode_on_steering)
    spool = tmp_path / "spool"
    spool.mkdir()
    store = FileSnapshotStore(tmp_path / "store", migrations=MigrationRegistry([failing]), spool_dir=spool)
    with pytest.raises(
        MigrationFailedError, match=r"format version 1 to 2 failed at step 1 -> 2: RuntimeError"
    ) as caught:
        await store.load(snapshot_id)
    assert (caught.value.step_from, caught.value.step_to) == (1, 2)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert list(spool.iterdir()) == []  # the partial spool is gone
    assert (await FileSnapshotStore(tmp_path / "store").get(snapshot_id)).format_version == 1  # untouched


@pytest.mark.asyncio
async def test_a_manifest_the_migration_cannot_read_fails_the_load(tmp_path: Path) -> None:
    source = InMemoryStateStore()
    await populate(source, random.Random(1), "s1")
    store = FileSnapshotStore(tmp_path)
    async with await capture(source, session_id="s1") as captured:
        await write_v1(tmp_path, captured, subject="no-colon-here")
        snapshot_id = captured.snapshot.id
    with pytest.raises(MigrationFailedError, match="step 1 -> 2: ValueError"):
        await store.load(snapshot_id)


@pytest.mark.asyncio
async def test_a_newer_format_is_refused(tmp_path: Path) -> None:
    source = InMemoryStateStore()
    await populate(source, random.Random(2), "s1")
    store = FileSnapshotStore(tmp_path)
    async with await capture(source, session_id="s1") as captured:
        saved = await store.save(captured)
    manifest_path = tmp_path / "snapshots" / saved.id / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 3
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(FormatTooNewError, match="format version 3 is newer than this code's 2") as caught:
        await store.load(saved.id)
    assert (caught.value.found, caught.value.current) == (3, 2)
    assert (await store.get(saved.id)).format_version == 3  # still listed, as what it is
