"""The file backend beyond the contract suite: a save killed by SIGKILL leaves nothing visible,
gc removes exactly the unreferenced blob files, and processes save concurrently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guarded.snapshots import (
    FileSnapshotStore,
    SnapshotNotFoundError,
    SnapshotStoreNotFoundError,
    SnapshotStoreReadOnlyError,
)
from guarded.snapshots.content import parse_line, read_section
from guarded.testing.snapshot_contract import make_content
from tests.killed_process import REPO, report_then_kill


@pytest.mark.asyncio
@pytest.mark.parametrize("moment", ["sections", "blobs"])
async def test_a_save_killed_midway_leaves_no_partial_snapshot(tmp_path: Path, moment: str) -> None:
    root = tmp_path / "store"
    report = report_then_kill(
        "tests.snapshots._worker", ["killed", str(root), str(tmp_path), moment], tmp_path / "log", timeout=60
    )
    assert report["moment"] == moment
    assert list((root / "staging").iterdir()), "the save was not killed midway"
    store = FileSnapshotStore(root)
    assert (await store.list()).items == ()
    with pytest.raises(SnapshotNotFoundError):
        await store.load(report["id"])

    async with await make_content("s-killed", snapshot_id=report["id"]) as content:
        saved = await store.save(content)  # the next save of the same id works
    assert [s.id for s in (await store.list()).items] == [saved.id]
    collected = await store.gc()
    assert collected.staging_removed == 1
    assert list((root / "staging").iterdir()) == []
    async with await store.load(saved.id) as loaded:
        assert loaded.snapshot == saved


def _blob_files(root: Path) -> set[str]:
    return {path.name for path in (root / "blobs").glob("*/*")}


def _referenced(root: Path) -> set[str]:
    return {
        str(parse_line(line)["blob"])
        for section in (root / "snapshots").glob("*/sections/artifacts.jsonl.gz")
        for batch in read_section(section)
        for line in batch
    }


@pytest.mark.asyncio
async def test_gc_removes_exactly_the_unreferenced_blob_files(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    saved = []
    for index in range(4):
        async with await make_content("s", blobs=(b"shared", f"own-{index}".encode())) as content:
            saved.append(await store.save(content))
    assert len(_blob_files(tmp_path)) == 5  # stored once each
    await store.delete(saved[1].id)
    await store.delete(saved[2].id)
    report = await store.gc()
    assert report.blobs_deleted == 2
    assert _blob_files(tmp_path) == _referenced(tmp_path)
    assert len(_blob_files(tmp_path)) == 3


def test_processes_save_concurrently_while_another_collects(tmp_path: Path) -> None:
    root = str(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def spawn(*args: str) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "tests.snapshots._worker", *args]
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)

    savers = [spawn("saver", root, label, "8") for label in ("a", "b")]
    collector = spawn("collector", root, "3")
    outputs = [process.communicate(timeout=120)[0] for process in [*savers, collector]]
    assert [process.returncode for process in [*savers, collector]] == [0, 0, 0]
    ids = [snapshot_id for output in outputs[:2] for snapshot_id in json.loads(output)]
    assert len(set(ids)) == 16
    assert json.loads(outputs[2])["runs"] >= 1

    async def check() -> None:
        store = FileSnapshotStore(root)
        assert sorted(s.id for s in (await store.list(limit=100)).items) == sorted(ids)
        for snapshot_id in ids:  # every blob each snapshot references survived the collector
            async with await store.load(snapshot_id) as content:
                async for batch in content.lines("artifacts"):
                    for line in batch:
                        await content.read_blob(str(parse_line(line)["blob"]))

    import asyncio

    asyncio.run(check())


@pytest.mark.asyncio
async def test_a_store_opened_read_only_or_existing_never_creates_one(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    for options in ({"read_only": True}, {"create": False}):
        with pytest.raises(SnapshotStoreNotFoundError, match="no snapshot store at"):
            FileSnapshotStore(missing, **options)
        assert not missing.exists()
    root = tmp_path / "store"
    async with await make_content("s-1") as content:
        saved = await FileSnapshotStore(root).save(content)
    before = sorted(str(path.relative_to(root)) for path in root.rglob("*"))
    reader = FileSnapshotStore(root, read_only=True)
    assert [s.id for s in (await reader.list()).items] == [saved.id]
    async with await reader.load(saved.id) as loaded:
        assert loaded.snapshot == saved
    async with await make_content("s-2") as content:
        with pytest.raises(SnapshotStoreReadOnlyError, match="save is refused"):
            await reader.save(content)
    with pytest.raises(SnapshotStoreReadOnlyError, match="tag is refused"):
        await reader.tag(saved.id, ["x"])
    with pytest.raises(SnapshotStoreReadOnlyError, match="gc is refused"):
        await reader.gc()
    with pytest.raises(SnapshotStoreReadOnlyError, match="delete is refused"):
        await reader.delete(saved.id)
    assert sorted(str(path.relative_to(root)) for path in root.rglob("*")) == before
    assert (await FileSnapshotStore(root, create=False).tag(saved.id, ["kept"])).tags == ("kept",)
