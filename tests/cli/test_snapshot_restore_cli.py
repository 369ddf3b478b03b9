"""``guarded snapshot restore``: the store's newer data wins unless ``--rollback``, which says what
it overwrote; ``capture`` says what it could not enumerate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.snapshots._sessions import memory_key

from . import snapshot_factories
from .test_snapshot_cli import captured_id, snap

CHANGED = "tests.cli.snapshot_factories:changed"


def test_restore_keeps_newer_data_and_rollback_names_what_it_overwrote(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snapshot_id = captured_id(capsys, tmp_path, "--pause-token", "s1-pause")
    ran = snap(capsys, tmp_path, "restore", snapshot_id, "--into", CHANGED, "--include-pauses")
    assert ran.code == 0, ran.err
    assert "pause(s) not restored" in ran.err
    kept = snapshot_factories.TARGETS[-1]
    assert asyncio.run(kept.load_memory_state(memory_key("s1"))) == {"newer": True}

    ran = snap(capsys, tmp_path, "restore", snapshot_id, "--into", CHANGED, "--rollback", "--json")
    assert ran.code == 0, ran.err
    report = json.loads(ran.out)
    assert report["rollback"] is True
    assert report["overwritten"]["memory"] == [memory_key("s1")]  # (tasks too: spawned_at differs)
    rolled_back = snapshot_factories.TARGETS[-1]
    assert asyncio.run(rolled_back.load_memory_state(memory_key("s1"))) != {"newer": True}

    ran = snap(capsys, tmp_path, "restore", snapshot_id, "--into", CHANGED, "--rollback")
    assert ran.code == 0, ran.err
    assert f"  overwrote memory: {memory_key('s1')}" in ran.out


def test_capture_says_what_it_could_not_enumerate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ran = snap(
        capsys, tmp_path, "capture", "--from", "tests.cli.snapshot_factories:populated", "--session", "s1"
    )
    assert ran.code == 0, ran.err
    assert "the store cannot list them): pauses" in ran.err
