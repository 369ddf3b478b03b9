"""Snapshots from an untrusted source: each hostile directory is refused with the ``SnapshotError``
naming its cause, the target store unchanged, nothing outside the store's directory read into the
target or changed (a tree of files and mtimes compared before and after), and the restore's memory
bounded (a child process under a hard address-space limit, its peak RSS under 200 MB).

The attacker hands over the whole store directory, so where a check on hashes would catch a change
too easily, the manifest is forged to agree with the tampered section: only the confinement and the
caps stand in the way.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from guarded.snapshots import FileSnapshotStore, RetentionPolicy
from guarded.snapshots.snapshot_errors import (
    InvalidBlobNameError,
    InvalidSnapshotIdError,
    SnapshotError,
    UnsafeSnapshotFileError,
)

from ._hostile import (
    PEAK_RSS,
    build_snapshot,
    fill_outside,
    forge_manifest,
    manifest_file,
    read_lines,
    restore_in_child,
    section_file,
    tree,
    write_bomb,
    write_section,
)


class World:
    """A store with one real snapshot, and a directory outside it an attacker aims at."""

    def __init__(self, tmp_path: Path, snapshot_id: str, traces: list[str]) -> None:
        self.store = tmp_path / "store"
        self.outside = tmp_path / "outside"
        self.id = snapshot_id
        self.traces = traces

    def lines(self, section: str) -> list[bytes]:
        return read_lines(self.store, self.id, section)

    def blob(self) -> Path:
        record = json.loads(self.lines("artifacts")[0])
        return self.store / "blobs" / record["blob"][:2] / record["blob"]

    def refused(self, error: str, *words: str) -> dict[str, object]:
        """Restore in a child: refused with ``error`` (a SnapshotError whose message holds
        ``words``), the target unchanged, the store and the outside directory untouched, the
        memory under the bound."""
        store_before, outside_before = tree(self.store), tree(self.outside)
        report = restore_in_child(self.store, self.id, self.traces)
        assert report["error"] == error, report
        assert report["snapshot_error"], report
        for word in words:
            assert word in str(report["message"]), report
        assert report["unchanged"], report
        assert int(str(report["peak_rss"])) < PEAK_RSS, report
        assert tree(self.store) == store_before
        assert tree(self.outside) == outside_before
        return report


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> World:
    snapshot_id, traces = await build_snapshot(tmp_path / "store")
    fill_outside(tmp_path / "outside")
    return World(tmp_path, snapshot_id, traces)


def _content_of(store: Path) -> dict[str, object]:
    """What a store holds (its snapshots and blobs; a save's lock and staging files aside)."""
    return {name: tree(store / name) for name in ("snapshots", "blobs")}


def _repeat(unit: bytes, total: int) -> Iterator[bytes]:
    block = unit * ((8 << 20) // len(unit))
    for _ in range(total // len(block)):
        yield block


# --- the cases found in the issue -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_intact_snapshot_restores_in_the_child(world: World) -> None:
    """The harness itself: the same child restores an untouched snapshot and the target changes."""
    report = restore_in_child(world.store, world.id, world.traces)
    assert report["error"] is None, report
    assert not report["unchanged"]
    assert int(str(report["peak_rss"])) < PEAK_RSS


@pytest.mark.parametrize(("state", "differs"), [(b'{"x":666}', "bytes"), (b'{"x":6}', "hash")])
@pytest.mark.asyncio
async def test_a_tampered_section_with_its_manifest_untouched_is_refused(
    world: World, state: bytes, differs: str
) -> None:
    lines = [
        b'{"key":"custom:s1","state":' + state + b"}" if b'"custom:s1"' in line else line
        for line in world.lines("memory")
    ]
    assert lines != world.lines("memory")
    write_section(world.store, world.id, "memory", lines, forge=False)
    world.refused("SectionMismatchError", "memory", differs)


@pytest.mark.asyncio
async def test_a_truncated_section_is_refused_before_anything_is_written(world: World) -> None:
    path = section_file(world.store, world.id, "tasks")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    world.refused("SectionMismatchError", "tasks")


@pytest.mark.asyncio
async def test_a_section_holding_more_records_than_declared_is_refused(world: World) -> None:
    tasks = world.lines("tasks")
    write_section(world.store, world.id, "tasks", [*tasks, tasks[0]], forge=False)
    world.refused("SectionMismatchError", "tasks")


@pytest.mark.parametrize("name", ["absolute", "dev-zero", "dotdot"])
@pytest.mark.asyncio
async def test_a_blob_name_outside_the_store_is_refused(world: World, name: str) -> None:
    victim = world.outside / "secret-0"
    blob = {"absolute": str(victim), "dev-zero": "/dev/zero", "dotdot": "../../outside/secret-0"}[name]
    records = [json.loads(line) for line in world.lines("artifacts")]
    records[0]["blob"] = blob
    write_section(world.store, world.id, "artifacts", [json.dumps(r).encode() for r in records])
    report = world.refused("InvalidBlobNameError", "blob")
    assert blob[:20] in str(report["message"])


@pytest.mark.asyncio
async def test_saving_a_snapshot_naming_an_outside_blob_into_a_clean_store_is_refused(
    world: World, tmp_path: Path
) -> None:
    victim = world.outside / "secret-0"
    records = [json.loads(line) for line in world.lines("artifacts")]
    records[0]["blob"] = str(victim)
    write_section(world.store, world.id, "artifacts", [json.dumps(r).encode() for r in records])
    clean = FileSnapshotStore(tmp_path / "clean")
    clean_before, outside_before = _content_of(tmp_path / "clean"), tree(world.outside)
    with pytest.raises(InvalidBlobNameError, match="blob"):
        async with await FileSnapshotStore(world.store).load(world.id) as content:
            await clean.save(content)
    assert tree(world.outside) == outside_before  # the victim's mtime too
    assert _content_of(tmp_path / "clean") == clean_before
    assert (await clean.list()).items == ()


@pytest.mark.asyncio
async def test_a_blob_that_is_a_fifo_is_refused_without_blocking(world: World) -> None:
    blob = world.blob()
    blob.unlink()
    os.mkfifo(blob)
    world.refused("UnsafeSnapshotFileError", "FIFO", blob.name)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
@pytest.mark.asyncio
async def test_a_blob_linked_to_a_device_is_refused(world: World, device: str) -> None:
    blob = world.blob()
    blob.unlink()
    blob.symlink_to(device)
    world.refused("UnsafeSnapshotFileError", "symbolic link", blob.name)


@pytest.mark.asyncio
async def test_a_gzip_bomb_of_one_400_mib_line_is_refused_in_bounded_memory(world: World) -> None:
    path = section_file(world.store, world.id, "memory")
    newlines, size, digest = write_bomb(path, _repeat(b"a", 400 << 20))
    assert path.stat().st_size < 1 << 20
    assert (size, newlines) == (400 << 20, 0)
    # the forged manifest agrees: one line of 400 MiB with the right hash
    forge_manifest(world.store, world.id, "memory", count=1, size=size, digest=digest)
    world.refused("SnapshotTooLargeError", "memory", "line")


@pytest.mark.asyncio
async def test_a_gzip_bomb_of_short_lines_is_refused_by_its_expansion(world: World) -> None:
    path = section_file(world.store, world.id, "updates")
    newlines, size, digest = write_bomb(path, _repeat(b'{"a":0}\n', 256 << 20))
    forge_manifest(world.store, world.id, "updates", count=newlines, size=size - newlines, digest=digest)
    world.refused("SnapshotTooLargeError", "updates", "compressed")


@pytest.mark.asyncio
async def test_a_section_file_linked_outside_is_refused(world: World) -> None:
    injected = world.outside / "memory.jsonl.gz"
    line = b'{"key":"custom:s1","state":{"injected":true}}'
    with gzip.open(injected, "wb") as handle:
        handle.write(line + b"\n")
    forge_manifest(
        world.store,
        world.id,
        "memory",
        count=1,
        size=len(line),
        digest=hashlib.sha256(line + b"\n").hexdigest(),
    )
    path = section_file(world.store, world.id, "memory")
    path.unlink()
    path.symlink_to(injected)
    world.refused("UnsafeSnapshotFileError", "symbolic link", "memory")


@pytest.mark.asyncio
async def test_a_sections_directory_linked_outside_is_refused(world: World) -> None:
    sections = section_file(world.store, world.id, "memory").parent
    sections.rename(world.outside / "sections")
    sections.symlink_to(world.outside / "sections")
    world.refused("UnsafeSnapshotFileError", "symbolic link")


@pytest.mark.asyncio
async def test_a_snapshot_directory_linked_outside_is_refused_and_not_listed(world: World) -> None:
    directory = manifest_file(world.store, world.id).parent
    directory.rename(world.outside / world.id)
    directory.symlink_to(world.outside / world.id)
    world.refused("UnsafeSnapshotFileError", "symbolic link")
    store = FileSnapshotStore(world.store)
    assert (await store.list()).items == ()
    before = tree(world.outside)
    with pytest.raises(UnsafeSnapshotFileError):
        await store.tag(world.id, ["x"])
    assert await store.delete(world.id)  # the link goes, what it pointed to stays
    assert tree(world.outside) == before


@pytest.mark.asyncio
async def test_a_manifest_linked_outside_is_refused(world: World) -> None:
    manifest = manifest_file(world.store, world.id)
    manifest.rename(world.outside / "manifest.json")
    manifest.symlink_to(world.outside / "manifest.json")
    world.refused("UnsafeSnapshotFileError", "symbolic link", "manifest")


@pytest.mark.asyncio
async def test_a_huge_manifest_is_refused_in_bounded_memory(world: World) -> None:
    manifest = manifest_file(world.store, world.id)
    head, tail = json.dumps({**json.loads(manifest.read_bytes()), "description": "@"}).split("@")
    with manifest.open("wb") as handle:  # written in pieces: this process stays small
        handle.write(head.encode())
        for block in _repeat(b"x", 300 << 20):
            handle.write(block)
        handle.write(tail.encode())
    world.refused("SnapshotTooLargeError", "manifest")


@pytest.mark.asyncio
async def test_a_tampered_blob_is_refused_before_anything_is_written(world: World) -> None:
    blob = world.blob()
    data = bytearray(blob.read_bytes())
    data[:1] = b"\x00" if data[:1] != b"\x00" else b"\x01"
    blob.write_bytes(bytes(data) if data else b"x")
    world.refused("BlobMismatchError", blob.name)


@pytest.mark.asyncio
async def test_a_blob_larger_than_declared_is_refused_unread(world: World) -> None:
    blob = world.blob()
    with blob.open("ab") as handle:
        handle.truncate(1 << 40)  # a sparse terabyte
    world.refused("BlobMismatchError", blob.name, "bytes")


@pytest.mark.asyncio
async def test_a_declared_size_that_differs_is_refused(world: World) -> None:
    manifest = manifest_file(world.store, world.id)
    record = json.loads(manifest.read_bytes())
    record["sizes"]["events"] += 1
    manifest.write_text(json.dumps(record))
    world.refused("SectionMismatchError", "events", "bytes")


# --- ids and gc -----------------------------------------------------------------------------------


@pytest.mark.parametrize("snapshot_id", ["x" * 5000, "../outside", ".hidden", "a/b", "", "a\x00b"])
@pytest.mark.asyncio
async def test_an_invalid_id_is_a_snapshot_error_at_every_method(world: World, snapshot_id: str) -> None:
    store = FileSnapshotStore(world.store)
    before = tree(world.store)
    for call in (
        lambda: store.load(snapshot_id),
        lambda: store.get(snapshot_id),
        lambda: store.delete(snapshot_id),
        lambda: store.tag(snapshot_id, ["t"]),
        lambda: store.untag(snapshot_id, ["t"]),
        lambda: store.lineage(snapshot_id),
        lambda: store.diff(world.id, snapshot_id),
    ):
        with pytest.raises(InvalidSnapshotIdError) as raised:
            await call()
        assert len(str(raised.value)) < 300  # the id is shortened, not echoed whole
    assert tree(world.store) == before


@pytest.mark.asyncio
async def test_gc_never_follows_a_blob_directory_linked_outside(world: World) -> None:
    (world.store / "blobs" / "zz").symlink_to(world.outside)
    for index in range(5):
        (world.outside / f"zz{index:062x}").write_bytes(b"x")
    before = tree(world.outside)
    report = await FileSnapshotStore(world.store).gc(RetentionPolicy())
    assert report.blobs_deleted == 0
    assert tree(world.outside) == before


@pytest.mark.asyncio
async def test_gc_never_follows_links_in_staging_trash_or_snapshots(world: World) -> None:
    (world.store / "staging" / "abandoned.1").symlink_to(world.outside)
    (world.store / "trash" / "gone.1").symlink_to(world.outside / "sub")
    (world.store / "snapshots" / "linked").symlink_to(world.outside)
    before = tree(world.outside)
    store = FileSnapshotStore(world.store)
    await store.gc(RetentionPolicy(keep_last=0, keep_tagged=False))
    assert tree(world.outside) == before
    assert await store.list() is not None


@pytest.mark.asyncio
async def test_a_save_never_writes_through_a_blob_directory_linked_outside(
    world: World, tmp_path: Path
) -> None:
    clean_dir = tmp_path / "clean"
    clean = FileSnapshotStore(clean_dir)
    record = json.loads(world.lines("artifacts")[0])
    (clean_dir / "blobs" / record["blob"][:2]).symlink_to(world.outside)
    before = tree(world.outside)
    with pytest.raises(UnsafeSnapshotFileError, match="symbolic link"):
        async with await FileSnapshotStore(world.store).load(world.id) as content:
            await clean.save(content)
    assert tree(world.outside) == before
    assert not (world.outside / record["blob"]).exists()
    assert (await clean.list()).items == ()


@pytest.mark.parametrize("name", ["snapshots", "blobs", "staging", "trash", "locks"])
@pytest.mark.asyncio
async def test_a_store_whose_directories_link_outside_does_not_open(world: World, name: str) -> None:
    (world.store / name).rename(world.outside / name)
    (world.store / name).symlink_to(world.outside / name)
    before = tree(world.outside)
    with pytest.raises(UnsafeSnapshotFileError, match=f"{name} is a symbolic link"):
        FileSnapshotStore(world.store)
    assert tree(world.outside) == before


@pytest.mark.asyncio
async def test_every_refusal_is_a_snapshot_error(world: World) -> None:
    """The store's own answers to hostile input never surface as OSError."""
    path = section_file(world.store, world.id, "events")
    path.unlink()
    os.mkfifo(path)
    async with await FileSnapshotStore(world.store).load(world.id) as content:
        with pytest.raises(SnapshotError, match="FIFO"):
            _ = [batch async for batch in content.lines("events")]
