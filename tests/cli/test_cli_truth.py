"""The operator's tools tell the truth: a spill file that cannot be read is an error with no counts
on stdout, reading never creates or changes a file (no ``-wal``/``-shm``, no directory), and piped
tables print whole values."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.cli.support import EXIT_USAGE
from guarded.deadletter import DeadLetterBuffer
from tests.deadletter.support import config, event

from .support import REPO, clean_environment, guarded, in_process
from .test_dlq_cli import spill

LONG_TARGET = "postgresql://db.internal.example.com:5432/agents?schema=tenant_with_a_rather_long_schema_name"
LONG_KEY = "memory:tenant-with-a-long-name:user-with-a-long-name:session-0123456789abcdef0123456789"


def files_of(directory: Path) -> dict[str, str]:
    """Every entry of ``directory`` (recursively) with the SHA-256 of its bytes (``dir`` for a directory)."""
    found: dict[str, str] = {}
    for root, directories, names in os.walk(directory):
        for name in directories:
            found[os.path.relpath(os.path.join(root, name), directory)] = "dir"
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return found


# --- spill files that cannot be read -----------------------------------------------------------------


def truncated(path: Path) -> None:
    spill(path, 300)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garbage(path: Path) -> None:
    spill(path, 300)
    with open(path, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\xde\xad\xbe\xef" * 4096)


def not_sqlite(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def foreign(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE pending (seq INTEGER PRIMARY KEY, call TEXT)")
    db.executemany("INSERT INTO pending (call) VALUES (?)", [("x",)] * 5)
    db.commit()
    db.close()


DAMAGED: dict[str, Callable[[Path], None]] = {
    "truncated": truncated,
    "garbage": garbage,
    "not_sqlite": not_sqlite,
    "foreign": foreign,
}


@pytest.mark.parametrize("verb", ["list", "stats"])
@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_file_that_cannot_be_read_is_an_error_with_no_counts_and_is_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, verb: str
) -> None:
    path = tmp_path / "dlq.sqlite"
    DAMAGED[damage](path)
    before = files_of(tmp_path)
    ran = in_process(capsys, "dlq", verb, "--path", str(path))
    assert ran.code == EXIT_USAGE, (ran.out, ran.err)
    assert ran.out == "", f"stdout must carry no counts for an unreadable file: {ran.out!r}"
    assert ran.error.startswith("error: "), ran.err
    assert str(path) in ran.error
    ran = in_process(capsys, "dlq", verb, "--path", str(path), "--json")
    assert ran.code == EXIT_USAGE
    document = json.loads(ran.out)
    counts = ("total",) if verb == "list" else ("pending", "parked", "quarantined")
    assert all(document[name] is None for name in counts), document
    assert document["files"][0]["error"]
    assert files_of(tmp_path) == before, "reading created or changed a file"


@pytest.mark.parametrize("verb", ["list", "stats"])
def test_an_unreadable_slot_file_is_reported_and_no_total_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    path = tmp_path / "dlq.sqlite"
    spill(path, 20)
    (tmp_path / "dlq.sqlite.1").mkdir()  # a slot file that cannot be read (root reads any file)
    ran = in_process(capsys, "dlq", verb, "--path", str(path))
    assert ran.code == EXIT_USAGE, ran.err
    assert str(tmp_path / "dlq.sqlite.1") in ran.error
    assert "pending:" not in ran.out
    assert " of 20 " not in ran.out
    assert "write(s) in" not in ran.out
    document = json.loads(in_process(capsys, "dlq", verb, "--path", str(path), "--json").out)
    assert document["pending" if verb == "stats" else "total"] is None
    assert [file["slot"] for file in document["files"]] == [0, 1]


def stamped(directory: Path) -> dict[str, tuple[str, int]]:
    """:func:`files_of` ``directory`` with each entry's modification time in nanoseconds (``.``: the
    directory's own, which moves when an entry is created or removed)."""
    found = {".": ("dir", directory.stat().st_mtime_ns)}
    for name, digest in files_of(directory).items():
        found[name] = (digest, (directory / name).stat().st_mtime_ns)
    return found


OPERATIONS = {
    "replay": ("replay", "--store", "tests.deadletter.factories:memory_store"),
    "purge": ("purge", "--parked", "--yes"),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_replay_and_purge_of_a_file_that_cannot_be_read_is_an_error_with_no_counts_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, operation: str
) -> None:
    path = tmp_path / "dlq.sqlite"
    DAMAGED[damage](path)
    before = stamped(tmp_path)
    ran = in_process(capsys, "dlq", *OPERATIONS[operation], "--path", str(path))
    assert ran.code == EXIT_USAGE, (ran.out, ran.err)
    assert ran.out == "", f"stdout must carry no counts for an unreadable file: {ran.out!r}"
    assert ran.error.startswith("error: "), ran.err
    assert str(path) in ran.error
    ran = in_process(capsys, "dlq", *OPERATIONS[operation], "--path", str(path), "--json")
    assert ran.code == EXIT_USAGE
    document = json.loads(ran.out)
    counts = ("waiting", "replayed", "parked", "remaining") if operation == "replay" else ("purged",)
    assert all(document[name] is None for name in counts), document
    assert [(file["path"], bool(file["error"])) for file in document["files"]] == [(str(path), True)]
    assert stamped(tmp_path) == before, f"{operation} created or changed a file"


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_replay_and_purge_report_a_directory_in_a_slot_files_place_and_print_no_total(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], operation: str
) -> None:
    path = tmp_path / "dlq.sqlite"
    spill(path, 20)
    slot = tmp_path / "dlq.sqlite.1"
    slot.mkdir()
    before = stamped(slot)
    ran = in_process(capsys, "dlq", *OPERATIONS[operation], "--path", str(path))
    assert ran.code == EXIT_USAGE, (ran.out, ran.err)
    assert [line for line in ran.err_lines if line.startswith("error: ")] == [
        f"error: cannot read dead-letter spill file '{slot}': it is not a regular file"
    ]
    assert "remaining" not in ran.out, "a total that left the slot file out reads as nothing waiting"
    assert "parked now" not in ran.out
    assert str(slot) not in ran.out
    assert "could not be read" in ran.out
    ran = in_process(capsys, "dlq", *OPERATIONS[operation], "--path", str(path), "--json")
    document = json.loads(ran.out)
    assert document["remaining" if operation == "replay" else "purged"] is None
    assert [(file["slot"], bool(file["error"])) for file in document["files"]] == [(0, False), (1, True)]
    assert stamped(slot) == before
    assert not list(tmp_path.glob("dlq.sqlite.1?*")), "an unreadable slot file got files beside it"


def test_reading_a_healthy_file_creates_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.sqlite"
    spill(path, 50)
    before = files_of(tmp_path)
    for argv in (("list",), ("list", "--parked"), ("list", "--quarantined"), ("stats",)):
        ran = in_process(capsys, "dlq", *argv, "--path", str(path), "--json")
        assert ran.code == 0, ran.err
    assert json.loads(ran.out)["pending"] == 50
    assert files_of(tmp_path) == before


CRASHED_WRITER = textwrap.dedent(
    """
    import asyncio, os, sys
    from tests.deadletter.support import buffer, event

    async def main():
        target = buffer(sys.argv[1])
        await target.put_many(
            [("save_event", (event("t", i),), {}, None, "t", i, "x") for i in range(40)]
        )
        os._exit(0)  # killed: the WAL and the shared memory stay beside the file

    asyncio.run(main())
    """
)


def test_reading_a_file_a_crashed_writer_left_counts_its_wal_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.sqlite"
    subprocess.run(
        [sys.executable, "-c", CRASHED_WRITER, str(path)],
        cwd=REPO,
        env=clean_environment(),
        check=True,
        timeout=120,
    )
    assert (tmp_path / "dlq.sqlite-wal").exists()
    before = files_of(tmp_path)
    ran = in_process(capsys, "dlq", "stats", "--path", str(path), "--json")
    assert ran.code == 0, ran.err
    assert json.loads(ran.out)["pending"] == 40
    assert files_of(tmp_path) == before


# --- snapshot stores that do not exist ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("list",),
        ("show", "some-id"),
        ("diff", "a", "b"),
        ("restore", "some-id", "--into", "tests.cli.snapshot_factories:target"),
        ("tag", "some-id", "keep"),
        ("gc", "--keep-last", "1"),
    ],
    ids=lambda argv: argv[0],
)
def test_a_mistyped_snapshot_directory_is_an_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    for typo in (tmp_path / "snapshotz", Path("/nonexistent/dir")):
        ran = in_process(capsys, "snapshot", argv[0], "--dir", str(typo), *argv[1:])
        assert ran.code == EXIT_USAGE, (ran.out, ran.err)
        assert ran.out == ""
        assert ran.error.startswith(f"error: no snapshot store at '{typo}'"), ran.error
        assert not typo.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    ran = in_process(capsys, "snapshot", argv[0], "--dir", str(empty), *argv[1:])
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith(f"error: no snapshot store at '{empty}'"), ran.error
    assert list(empty.iterdir()) == []


def test_reading_a_snapshot_store_creates_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "snapshots"
    ran = in_process(
        capsys,
        "snapshot",
        "capture",
        "--dir",
        str(root),
        "--from",
        "tests.cli.snapshot_factories:populated",
        "--session",
        "s1",
        "--json",
    )
    assert ran.code == 0, ran.err
    snapshot_id = json.loads(ran.out)["snapshot"]["id"]
    for name in ("locks", "staging", "trash"):  # as an older version, or another tool, may leave it
        for entry in (root / name).iterdir():
            entry.unlink()
        (root / name).rmdir()
    before = files_of(root)
    for argv in (
        ("list",),
        ("show", snapshot_id),
        ("diff", snapshot_id, snapshot_id),
        ("restore", snapshot_id, "--into", "tests.cli.snapshot_factories:target"),
    ):
        ran = in_process(capsys, "snapshot", argv[0], "--dir", str(root), *argv[1:])
        assert ran.code == 0, (argv, ran.err)
    assert files_of(root) == before


# --- piped tables ------------------------------------------------------------------------------------


def test_piped_tables_print_whole_values(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"

    async def fill() -> None:
        target = DeadLetterBuffer(
            config(path), store_name="primary", registry=CollectorRegistry(), target=LONG_TARGET
        )
        await target.put(
            "save_memory_state",
            (LONG_KEY, {"v": 1}),
            {},
            scope=LONG_KEY,
            stamp=1,
            error="ConnectionError: the database at db.internal.example.com refused the connection",
        )
        await target.put("save_event", (event("t", 1),), {}, scope="t", stamp=2, error="x")
        await target.aclose()

    asyncio.run(fill())
    ran = guarded("dlq", "stats", "--path", str(path))  # stdout is a pipe
    assert ran.code == 0, ran.err
    assert LONG_TARGET in ran.out
    assert "…" not in ran.out
    ran = guarded("dlq", "list", "--path", str(path))
    assert ran.code == 0, ran.err
    assert LONG_KEY in ran.out
    assert "ConnectionError: the database at db.internal.example.com refused the connection" in ran.out
    assert "…" not in ran.out
