"""``guarded snapshot``: the actions run for real (through ``guarded.cli.main``, and once as a
process) against a file snapshot store and in-memory StateStore factories; the exit codes and the
one-line errors of docs/cli.md."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.cli import snapshot_actions
from guarded.cli.support import (
    EXIT_INTERRUPTED,
    EXIT_NOT_MIGRATED,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from guarded.codec import penguiflow_types
from guarded.snapshots import FileSnapshotStore
from tests.snapshots._sessions import observe, populate

from . import snapshot_factories
from .support import Ran, clean_environment, closed_port, guarded, in_process

SOURCE = "tests.cli.snapshot_factories:populated"
TARGET = "tests.cli.snapshot_factories:target"


def snap(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> Ran:
    action, *rest = argv
    return in_process(capsys, "snapshot", action, "--dir", str(root), *rest)


def captured_id(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> str:
    ran = snap(capsys, root, "capture", "--from", SOURCE, "--session", "s1", "--json", *extra)
    assert ran.code == 0, ran.err
    return str(json.loads(ran.out)["snapshot"]["id"])


def test_capture_list_show_tag_diff_restore_gc(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ran = snap(
        capsys,
        tmp_path,
        "capture",
        "--from",
        SOURCE,
        "--session",
        "s1",
        "--memory-key",
        "custom:s1",
        "--tag",
        "before",
        "--id",
        "one",
    )
    assert ran.code == 0, ran.err
    assert ran.out.startswith("captured snapshot one of session s1: ")
    second = captured_id(
        capsys, tmp_path, "--parent", "one", "--description", "again", "--memory-key", "custom:s1"
    )

    ran = snap(capsys, tmp_path, "list", "--json")
    assert ran.code == 0, ran.err
    listed = json.loads(ran.out)
    assert [item["id"] for item in listed["items"]] == ["one", second]
    assert listed["next_cursor"] is None
    ran = snap(capsys, tmp_path, "list", "--limit", "1")
    assert ran.code == 0
    assert "one" in ran.out
    assert second not in ran.out
    assert ran.err_lines[-1].startswith("note: more snapshots: pass --cursor ")
    ran = snap(capsys, tmp_path, "list", "--limit", "1", "--all", "--json")
    assert [item["id"] for item in json.loads(ran.out)["items"]] == ["one", second]

    ran = snap(capsys, tmp_path, "show", second, "--json")
    assert ran.code == 0, ran.err
    shown = json.loads(ran.out)
    assert shown["lineage"] == [second, "one"]
    assert shown["snapshot"]["description"] == "again"
    ran = snap(capsys, tmp_path, "show", second)
    assert f"lineage:        {second} <- one" in ran.out

    ran = snap(capsys, tmp_path, "tag", second, "prod", "risky")
    assert (ran.code, ran.out) == (0, f"{second}: prod, risky\n")
    ran = snap(capsys, tmp_path, "tag", second, "risky", "--remove")
    assert ran.out == f"{second}: prod\n"
    ran = snap(capsys, tmp_path, "list", "--tag", "prod", "--json")
    assert [item["id"] for item in json.loads(ran.out)["items"]] == [second]

    # Two captures of the same session: only the tasks' spawned_at (set when the factory ran) differ.
    ran = snap(capsys, tmp_path, "diff", "one", second, "--json")
    assert ran.code == 0, ran.err
    changes = json.loads(ran.out)
    assert changes["empty"] is False
    assert changes["events_added"] == changes["memory_changed"] == []
    assert {c["after"]["task_id"] for c in changes["tasks_changed"]} == {
        c["key"] for c in changes["tasks_changed"]
    }
    ran = snap(capsys, tmp_path, "diff", "one", "one")
    assert ran.out == "one and one hold the same state\n"
    ran = snap(capsys, tmp_path, "diff", "one", second)
    assert ran.out.startswith(f"from one to {second}:\n  tasks changed: ")

    before = len(snapshot_factories.TARGETS)
    ran = snap(capsys, tmp_path, "restore", "one", "--into", TARGET, "--json")
    assert ran.code == 0, ran.err
    report = json.loads(ran.out)
    assert sum(report["written"].values()) > 0
    restored = snapshot_factories.TARGETS[before]
    source = InMemoryStateStore(record_types=penguiflow_types())

    async def compare() -> None:
        traces = await populate(source, random.Random(snapshot_factories.SEED), "s1")
        found, expected = await observe(restored, "s1", traces), await observe(source, "s1", traces)
        for seen in (found, expected):  # spawned_at: when the factory ran
            for task in seen.pop("tasks"):
                task["context_snapshot"].pop("spawned_at")
                seen.setdefault("task_list", []).append(task)
        assert found == expected

    asyncio.run(compare())

    ran = snap(capsys, tmp_path, "gc", "--keep-last", "1", "--json")
    assert ran.code == 0, ran.err
    assert json.loads(ran.out)["snapshots_deleted"] == []  # "one" is tagged "before", the other the newest
    ran = snap(capsys, tmp_path, "gc", "--keep-last", "1", "--include-tagged")
    assert ran.code == 0, ran.err
    assert ran.out.startswith("gc: 1 snapshot(s) deleted, ")
    assert "  deleted one" in ran.out


def test_user_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    FileSnapshotStore(tmp_path)  # an empty store
    ran = snap(capsys, tmp_path, "show", "nope")
    assert ran.code == EXIT_USAGE
    assert ran.error == "error: no snapshot 'nope'; hint: 'guarded snapshot list' lists the snapshots"

    ran = in_process(capsys, "snapshot", "list")
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith("error: no snapshot store given; hint: pass --dir PATH")

    ran = in_process(
        capsys, "snapshot", "list", "--snapshots", "tests.cli.snapshot_factories:not_a_snapshot_store"
    )
    assert ran.code == EXIT_USAGE
    assert "returned a InMemoryStateStore, not a SnapshotStore" in ran.error

    ran = snap(capsys, tmp_path, "capture", "--from", "no.such.module:factory", "--session", "s1")
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith("error: cannot import 'no.such.module'")

    ran = snap(capsys, tmp_path, "list", "--since", "yesterday")
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith("error: argument --since: 'yesterday' is neither a time nor an age; hint: ")

    ran = snap(capsys, tmp_path, "list", "--cursor", "forged")
    assert ran.code == EXIT_USAGE
    assert "not a cursor of this store" in ran.error

    ran = snap(capsys, tmp_path, "capture", "--from", SOURCE)
    assert ran.code == EXIT_USAGE  # --session or --trace


def test_an_unreachable_store_exits_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ran = snap(
        capsys, tmp_path, "capture", "--from", "tests.cli.snapshot_factories:unreachable", "--session", "s1"
    )
    assert ran.code == EXIT_UNREACHABLE
    assert ran.error.startswith("error: cannot reach the store's backend: calling ")


def test_problems_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    snapshot_id = captured_id(capsys, tmp_path)
    manifest = tmp_path / "snapshots" / snapshot_id / "manifest.json"
    data = json.loads(manifest.read_text())
    data["format_version"] = 9
    manifest.write_text(json.dumps(data))
    ran = snap(capsys, tmp_path, "restore", snapshot_id, "--into", TARGET)
    assert ran.code == EXIT_PROBLEM
    assert ran.error.startswith("error: snapshot format version 9 is newer than this code's 2")

    other = captured_id(capsys, tmp_path)
    section = tmp_path / "snapshots" / other / "sections" / "events.jsonl.gz"
    section.write_bytes(b"not gzip")
    ran = snap(capsys, tmp_path, "restore", other, "--into", TARGET)
    assert ran.code == EXIT_PROBLEM
    assert "section events of snapshot" in ran.error
    assert "not a valid gzip stream" in ran.error


def test_ctrl_c_during_a_restore_says_what_was_done(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot_id = captured_id(capsys, tmp_path)

    async def interrupted_restore(content: Any, store: Any, **options: Any) -> Any:
        async for _batch in content.lines("events"):
            break
        raise KeyboardInterrupt

    monkeypatch.setattr(snapshot_actions, "restore", interrupted_restore)
    ran = snap(capsys, tmp_path, "restore", snapshot_id, "--into", TARGET)
    assert ran.code == EXIT_INTERRUPTED
    assert ran.err_lines[-1].startswith("interrupted: read 40 of ")
    assert ran.err_lines[-1].endswith("restore is idempotent: run it again to finish")


def test_as_a_process(tmp_path: Path) -> None:
    env = clean_environment()
    ran = guarded("snapshot", "capture", "--from", SOURCE, "--session", "s1", "--dir", str(tmp_path), env=env)
    assert ran.code == 0, ran.err
    env["GUARDED_SNAPSHOT_STORE"] = "tests.cli.snapshot_factories:not_a_snapshot_store"
    ran = guarded("snapshot", "list", "--dir", str(tmp_path), "--json", env=env)
    assert ran.code == 0, ran.err
    assert len(json.loads(ran.out)["items"]) == 1


def test_postgres_snapshot_store_from_the_factory(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pg_dsn: str, schema_name: str
) -> None:
    """The PostgreSQL snapshot store of ``GUARDED_PG_*``: a schema not migrated exits 4, a server
    that does not answer exits 3, a migrated one captures and lists."""
    factory = "guarded.backends.postgres.factory:create_snapshot_store"
    monkeypatch.setenv("GUARDED_PG_DSN", pg_dsn)
    monkeypatch.setenv("GUARDED_PG_SCHEMA", schema_name)
    monkeypatch.setenv("GUARDED_PG_MIGRATE", "0")
    ran = in_process(capsys, "snapshot", "list", "--snapshots", factory)
    assert ran.code == EXIT_NOT_MIGRATED
    assert ran.error.startswith(f"error: schema {schema_name!r} is at migration version 0")
    assert ran.error.endswith("hint: run 'guarded pg migrate' for the store's schema")

    monkeypatch.setenv("GUARDED_PG_MIGRATE", "1")
    monkeypatch.setenv("GUARDED_SNAPSHOT_STORE", factory)
    ran = in_process(capsys, "snapshot", "capture", "--from", SOURCE, "--session", "s1", "--id", "pg-1")
    assert ran.code == 0, ran.err
    ran = in_process(capsys, "snapshot", "list", "--json")
    assert [item["id"] for item in json.loads(ran.out)["items"]] == ["pg-1"]

    monkeypatch.setenv("GUARDED_PG_DSN", f"postgresql://x@127.0.0.1:{closed_port()}/x")
    ran = in_process(capsys, "snapshot", "list")
    assert ran.code == EXIT_UNREACHABLE
    assert ran.error.startswith("error: cannot reach the store's backend at postgresql://")
