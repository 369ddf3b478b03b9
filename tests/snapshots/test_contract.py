"""The SnapshotStore contract suite on the file backend, and the suite's runner itself."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from guarded.snapshots import FileSnapshotStore
from guarded.testing.pytest_snapshot_contract import SnapshotStoreContract
from guarded.testing.snapshot_contract import SNAPSHOT_CONTRACTS, run_snapshot_contracts


@pytest.fixture
def snapshot_store(tmp_path: Path) -> FileSnapshotStore:
    return FileSnapshotStore(tmp_path / "snapshots")


class TestFileSnapshotStore(SnapshotStoreContract):
    pass


@pytest.mark.asyncio
async def test_runner_reports_every_contract(tmp_path: Path) -> None:
    report = await run_snapshot_contracts(lambda: FileSnapshotStore(tmp_path / uuid.uuid4().hex))
    assert report.ok, str(report)
    assert len(report.results) == len(SNAPSHOT_CONTRACTS) >= 12


class _ForgetfulTags(FileSnapshotStore):
    """Broken on purpose: tag() answers as if it tagged, but stores nothing."""

    async def tag(self, snapshot_id: str, tags: object) -> object:  # type: ignore[override]
        return (await self.get(snapshot_id)).with_tags([*(await self.get(snapshot_id)).tags, *tags])  # type: ignore[misc]


class _GreedyGc(FileSnapshotStore):
    """Broken on purpose: gc also deletes blobs that snapshots still reference."""

    def _referenced(self) -> set[str]:
        return set()


@pytest.mark.asyncio
@pytest.mark.parametrize(("broken", "contract"), [(_ForgetfulTags, "tags"), (_GreedyGc, "gc_blobs")])
async def test_suite_catches_broken_backends(tmp_path: Path, broken: type, contract: str) -> None:
    report = await run_snapshot_contracts(lambda: broken(tmp_path / uuid.uuid4().hex))
    failed = {result.contract.name for result in report.results if result.status.value != "passed"}
    assert contract in failed, str(report)
