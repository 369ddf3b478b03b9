"""Saves a guarded snapshot store holds: a save the backend cannot take (it refuses connections,
times out, its circuit is open) is staged on local disk and held in the dead-letter buffer, the
caller gets its record back, and the held save is replayed into the backend once it is back --
also by the next process, when this one is killed. A staging failure raises; bad data and the
store's own answers are never staged; a replay meeting another content under the same id is parked.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded import guard
from guarded.controller import controller
from guarded.deadletter import DeadLetterBuffer
from guarded.observability import telemetry_names as names
from guarded.snapshots import (
    FileSnapshotStore,
    Snapshot,
    SnapshotConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    SnapshotStoreUnavailableError,
)
from guarded.snapshots.content import SnapshotContent, content_hash
from guarded.snapshots.guarded import GuardedSnapshotStore
from guarded.snapshots.record import SECTIONS
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from guarded.testing.snapshot_contract import make_content

REPO = Path(__file__).resolve().parents[2]
DOWN = FaultPlan.always(Fault.error_before(ConnectionRefusedError))


def outcomes(registry: CollectorRegistry, store: str) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for family in registry.collect():
        for found in family.samples:
            if found.name == names.CALLS + "_total" and found.value and found.labels.get("store") == store:
                counts[(found.labels["method"], found.labels["outcome"])] += int(found.value)
    return counts


async def fingerprint(content: SnapshotContent) -> tuple[str, dict[str, str]]:
    """The content hash recomputed from the lines read back, and the SHA-256 of every blob."""
    hashes = {}
    blobs = {}
    for section in SECTIONS:
        digest = hashlib.sha256()
        async for batch in content.lines(section):
            if batch:
                digest.update(b"\n".join(batch) + b"\n")
            if section == "artifacts":
                for line in batch:
                    blob = json.loads(line)["blob"]
                    blobs[blob] = hashlib.sha256(await content.read_blob(blob)).hexdigest()
        hashes[section] = digest.hexdigest()
    return content_hash(hashes), blobs


def buffer_of(store: GuardedSnapshotStore) -> DeadLetterBuffer:
    found = controller(store).dead_letters
    assert found is not None
    return found


def staged_ids(store: GuardedSnapshotStore) -> list[str]:
    assert store.staging is not None
    return store.staging.ids()


@pytest.mark.asyncio
async def test_a_save_during_an_outage_is_held_and_lands_once(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, FaultPlan())
    injector = fault_injector(faulty)
    registry = CollectorRegistry()
    guarded = guard(faulty, name="held", registry=registry, timeout=0.5, retries=1)
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        content = await make_content("s-held", snapshot_id="held-1", events=300, blobs=(b"a" * 70_000, b"b"))
        expected = await fingerprint(content)
        injector.plan = DOWN
        saved = await guarded.save(content)  # returns: held, not raised
        assert saved == content.snapshot
        assert buffer_of(guarded).depth == 1
        assert staged_ids(guarded) == ["held-1"]
        # Read-your-writes: the held snapshot answers load and get from its staged copy.
        async with await guarded.load("held-1") as staged:
            assert await fingerprint(staged) == expected
        assert (await guarded.get("held-1")).content_hash == content.snapshot.content_hash
        with pytest.raises(SnapshotNotFoundError):
            await backend.get("held-1")
        # The same save again while held: held once (same id, same content).
        assert await guarded.save(content) == saved
        await content.aclose()

        injector.plan = FaultPlan()
        assert await controller(guarded).drain(30) == 0
        assert staged_ids(guarded) == []  # the staged copy is gone once replayed
        assert (await buffer_of(guarded).stats()).parked == 0

    page = await backend.list()
    assert [item.id for item in page.items] == ["held-1"]  # exactly once
    async with await backend.load("held-1") as landed:
        assert landed.snapshot.content_hash == saved.content_hash
        assert await fingerprint(landed) == expected
    counted = outcomes(registry, "held")
    assert counted[("save", "dead_lettered")] == 2
    assert counted[("save", "ok")] == 0


@pytest.mark.asyncio
async def test_an_open_breaker_holds_a_save_without_asking_the_backend(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, FaultPlan())
    registry = CollectorRegistry()
    guarded = guard(faulty, name="open", registry=registry, timeout=0.5, retries=0)
    async with guarded:
        controller(guarded).breaker.force_open()
        content = await make_content("s-open", snapshot_id="open-1")
        async with content:
            assert (await guarded.save(content)).id == "open-1"
        assert fault_injector(faulty).calls("save") == 0
        assert buffer_of(guarded).depth == 1
        controller(guarded).breaker.reset()
        assert await controller(guarded).drain(30) == 0
    assert (await backend.get("open-1")).id == "open-1"
    assert outcomes(registry, "open")[("save", "dead_lettered")] == 1


def _worker(mode: str, *args: str, state: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    env.pop("GUARDED_DLQ_PATH", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.snapshots._worker", mode, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.asyncio
async def test_a_held_save_survives_sigkill_and_the_next_process_replays_it(tmp_path: Path) -> None:
    state = Path(os.environ["XDG_STATE_HOME"])  # this test's own (tests/conftest.py)
    root = tmp_path / "backend"
    process = _worker("held", str(root), str(tmp_path / "spool"), state=state)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else "no output"
        told = json.loads(line)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    backend = FileSnapshotStore(root)
    with pytest.raises(SnapshotNotFoundError):
        await backend.get(told["id"])  # held in the killed process: not in the backend

    guarded = guard(backend, name="killed", registry=CollectorRegistry())
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:  # adopts the killed process's spill file and replays it
        assert await controller(guarded).drain(30) == 0
        assert staged_ids(guarded) == []
    async with await backend.load(told["id"]) as landed:
        assert landed.snapshot.content_hash == told["content_hash"]
        assert (await fingerprint(landed))[0] == told["content_hash"]
    assert [item.id for item in (await backend.list()).items] == [told["id"]]


class _FailingBlobs:
    """A content whose blobs cannot be read (a disk full or failing under the spool): staging it
    fails after its sections were written."""

    def __init__(self, inner: SnapshotContent) -> None:
        self.inner = inner

    @property
    def snapshot(self) -> Snapshot:
        return self.inner.snapshot

    def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        return self.inner.lines(section)

    async def read_blob(self, digest: str) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.asyncio
async def test_a_staging_failure_raises_and_nothing_half_staged_is_replayed(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, DOWN)
    registry = CollectorRegistry()
    guarded = guard(faulty, name="nostage", registry=registry, timeout=0.5, retries=0)
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        content = _FailingBlobs(await make_content("s-nostage", snapshot_id="nostage-1"))
        with pytest.raises(SnapshotStoreUnavailableError, match="could not be staged") as caught:
            await guarded.save(content)
        assert isinstance(caught.value.__cause__, OSError)
        assert buffer_of(guarded).depth == 0
        assert staged_ids(guarded) == []
        with pytest.raises(SnapshotStoreUnavailableError):
            await guarded.load("nostage-1")  # nothing staged answers it
        fault_injector(faulty).plan = FaultPlan()
        assert await controller(guarded).drain(10) == 0
        await content.aclose()
    # Nor does the next guard on the same paths find anything to replay.
    again = guard(backend, name="nostage", registry=CollectorRegistry())
    async with again:
        assert await controller(again).drain(10) == 0
    with pytest.raises(SnapshotNotFoundError):
        await backend.get("nostage-1")
    assert outcomes(registry, "nostage")[("save", "dead_lettered")] == 0


@pytest.mark.asyncio
async def test_a_replay_meeting_another_content_is_parked_not_retried(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, DOWN)
    guarded = guard(faulty, name="conflict", registry=CollectorRegistry(), timeout=0.5, retries=0)
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        mine = await make_content("s-c", snapshot_id="c-1", events=4)
        async with mine:
            await guarded.save(mine)
        # Meanwhile another writer saved another content under the same id, straight to the backend.
        theirs = await make_content("s-c", snapshot_id="c-1", events=9)
        async with theirs:
            await backend.save(theirs)
        # A second content under the held id in this process: the store's answer, at once.
        other = await make_content("s-c", snapshot_id="c-1", events=7)
        async with other:
            with pytest.raises(SnapshotConflictError):
                await guarded.save(other)

        fault_injector(faulty).plan = FaultPlan()
        calls_before = fault_injector(faulty).calls("save")
        assert await controller(guarded).drain(10) == 0  # parked: nothing left waiting
        parked = await buffer_of(guarded).parked()
        assert [entry.method for entry in parked] == ["save"]
        assert "another content" in parked[0].reason
        assert fault_injector(faulty).calls("save") == calls_before + 1  # tried once, not again
        assert staged_ids(guarded) == ["c-1"]  # kept for the operator
        # The backend's snapshot is what get and load answer, not the parked staged copy.
        assert (await guarded.get("c-1")).content_hash == theirs.snapshot.content_hash
    assert (await backend.get("c-1")).content_hash == theirs.snapshot.content_hash


class _Relabelled:
    """A content under a record that does not match it (bad data)."""

    def __init__(self, inner: SnapshotContent, snapshot: Snapshot) -> None:
        self.inner = inner
        self._snapshot = snapshot

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        return self.inner.lines(section)

    async def read_blob(self, digest: str) -> bytes:
        return await self.inner.read_blob(digest)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.asyncio
async def test_bad_data_is_never_staged(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, FaultPlan())
    guarded = guard(faulty, name="bad", registry=CollectorRegistry(), timeout=0.5, retries=0)
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        inner = await make_content("s-bad", snapshot_id="bad-1")
        lying = _Relabelled(inner, inner.snapshot.model_copy(update={"content_hash": "0" * 64}))
        with pytest.raises(SnapshotCorruptError):
            await guarded.save(lying)  # the backend's answer: raised, not staged
        fault_injector(faulty).plan = DOWN
        with pytest.raises(SnapshotCorruptError):
            await guarded.save(lying)  # the backend is down: staging checks the content too
        assert buffer_of(guarded).depth == 0
        assert (await buffer_of(guarded).stats()).parked == 0
        assert staged_ids(guarded) == []
        await inner.aclose()


@pytest.mark.asyncio
async def test_deleting_a_held_snapshot_takes_its_save_out(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, DOWN)
    guarded = guard(faulty, name="gone", registry=CollectorRegistry(), timeout=0.5, retries=0, breaker=False)
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        content = await make_content("s-gone", snapshot_id="gone-1")
        async with content:
            await guarded.save(content)
        assert buffer_of(guarded).depth == 1
        # The backend answers again, but not saves yet: the held save cannot land before the delete.
        fault_injector(faulty).plan = FaultPlan.always(
            Fault.error_before(ConnectionRefusedError), methods=["save"]
        )
        assert await guarded.delete("gone-1") is True  # held here, not in the backend
        fault_injector(faulty).plan = FaultPlan()
        assert buffer_of(guarded).depth == 0
        assert staged_ids(guarded) == []
        assert await controller(guarded).drain(10) == 0
        with pytest.raises(SnapshotNotFoundError):
            await guarded.get("gone-1")
    with pytest.raises(SnapshotNotFoundError):
        await backend.get("gone-1")


def test_guards_of_two_file_stores_never_share_held_saves(tmp_path: Path) -> None:
    first = guard(FileSnapshotStore(tmp_path / "a"), registry=CollectorRegistry())
    second = guard(FileSnapshotStore(tmp_path / "b"), registry=CollectorRegistry())
    assert isinstance(first, GuardedSnapshotStore)
    assert isinstance(second, GuardedSnapshotStore)
    assert first.staging is not None
    assert second.staging is not None
    assert first.staging.root != second.staging.root
    assert first.staging.root.parent.name == "default-snapshots.staged"


@pytest.mark.asyncio
async def test_a_held_save_that_had_committed_lands_once(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    # The save commits, then its answer is lost: held, and its replay finds it saved already.
    faulty = FaultyStore(backend, FaultPlan.script({"save": [Fault.error_after(ConnectionResetError)]}))
    guarded = guard(faulty, name="lost", registry=CollectorRegistry(), timeout=0.5, retries=0)
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        content = await make_content("s-lost", snapshot_id="lost-1")
        async with content:
            assert (await guarded.save(content)).id == "lost-1"
        assert await controller(guarded).drain(10) == 0
        assert (await buffer_of(guarded).stats()).parked == 0
        assert staged_ids(guarded) == []
    assert [item.id for item in (await backend.list()).items] == ["lost-1"]
    assert (await backend.get("lost-1")).content_hash == content.snapshot.content_hash


@pytest.mark.asyncio
async def test_a_chosen_staging_directory_holds_saves_per_backend(tmp_path: Path) -> None:
    backend = FileSnapshotStore(tmp_path / "backend")
    faulty = FaultyStore(backend, DOWN)
    chosen = tmp_path / "staging"
    guarded = guard(
        faulty, name="chosen", registry=CollectorRegistry(), staging_dir=chosen, timeout=0.5, retries=0
    )
    assert isinstance(guarded, GuardedSnapshotStore)
    async with guarded:
        content = await make_content("s-chosen", snapshot_id="chosen-1")
        async with content:
            await guarded.save(content)
        assert guarded.staging is not None
        assert guarded.staging.root.parent == chosen
        assert (guarded.staging.root / "chosen-1").is_dir()
        fault_injector(faulty).plan = FaultPlan()
        assert await controller(guarded).drain(10) == 0
    assert (await backend.get("chosen-1")).id == "chosen-1"
