"""The spill file: schema and identity checks, the single-writer lock, read-only access, size cap."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from guarded.deadletter import DeadLetter, ParkedWrite, SpillFile, SpillFileError, SpillFileLockedError
from guarded.deadletter.spill import SpillCapError, dumps


def entry(seq: int, *, method: str = "save_event", key: str | None = None, size: int = 10) -> DeadLetter:
    call = {"args": [{"i": seq}], "kwargs": {}}
    return DeadLetter(seq, method, call, key, None, seq, 1000.0 + seq, size, "ConnectionError")


def test_a_new_file_is_private_wal_and_counts_generations(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "dlq.db")
    spill = SpillFile.open(path)
    assert spill.generation == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert spill._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert spill._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    spill.write([entry(1), entry(2)], generation=spill.generation)
    spill.close()
    again = SpillFile.open(path, synchronous="FULL")
    try:
        assert again.generation == 2
        assert again._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert again.max_seq() == 2
        assert [row.seq for row in again.page(0, None)] == [1, 2]
    finally:
        again.close()


def test_a_second_writer_is_refused_while_readers_are_not(tmp_path: Path) -> None:
    path = str(tmp_path / "dlq.db")
    writer = SpillFile.open(path)
    try:
        writer.write([entry(1)], generation=writer.generation)
        with pytest.raises(SpillFileLockedError, match=f"pid {os.getpid()}"):
            SpillFile.open(path)
        reader = SpillFile.open_read_only(path)
        try:
            assert reader.totals().pending == 1
            writer.write([entry(2)], generation=writer.generation)
            assert reader.totals().pending == 2
            with pytest.raises(SpillFileError, match="read-only"):
                reader.delete([1])
        finally:
            reader.close()
    finally:
        writer.close()
    SpillFile.open(path).close()


def test_read_only_open_works_on_a_cleanly_closed_file(tmp_path: Path) -> None:
    path = str(tmp_path / "dlq.db")
    spill = SpillFile.open(path)
    spill.write([entry(1)], generation=1)
    spill.close()
    assert not os.path.exists(path + "-wal")
    reader = SpillFile.open_read_only(path)
    try:
        assert [row.seq for row in reader.page(0, None)] == [1]
    finally:
        reader.close()


def test_foreign_and_newer_files_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(SpillFileError, match="not a guarded dead-letter spill file"):
        SpillFile.open(str(foreign))
    with pytest.raises(SpillFileError, match="not a guarded dead-letter spill file"):
        SpillFile.open_read_only(str(foreign))

    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database at all" * 40)
    with pytest.raises(SpillFileError):
        SpillFile.open(str(text))

    newer = str(tmp_path / "newer.db")
    SpillFile.open(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(SpillFileError, match="newer"):
        SpillFile.open(newer)
    with pytest.raises(SpillFileError, match="no dead-letter spill file"):
        SpillFile.open_read_only(str(tmp_path / "missing.db"))


def test_the_size_cap_refuses_a_write_and_keeps_what_the_file_holds(tmp_path: Path) -> None:
    spill = SpillFile.open(str(tmp_path / "dlq.db"))
    try:
        result = spill.write([entry(seq, size=100) for seq in range(1, 6)], generation=1, max_bytes=550)
        assert result.totals.pending_bytes == 500
        with pytest.raises(SpillCapError):
            spill.write([entry(seq, size=100) for seq in range(6, 8)], generation=1, max_bytes=550)
        totals = spill.totals()
        assert totals.pending == 5
        assert totals.pending_bytes == 500
        assert totals.oldest == (1, 1001.0)
        assert [item.seq for item in spill.page(0, None)] == [1, 2, 3, 4, 5]
        # A write that replaces as much as it adds fits, even at the cap.
        result = spill.write([entry(6, size=100)], generation=1, delete=[1], max_bytes=550)
        assert result.totals.pending_bytes == 500
    finally:
        spill.close()


def test_parking_moves_an_entry_and_keeps_its_call(tmp_path: Path) -> None:
    spill = SpillFile.open(str(tmp_path / "dlq.db"))
    try:
        spill.write([entry(1, key='"k"')], generation=1)
        result = spill.park_pending(1, reason="bad data", parked_at=5.0)
        assert [row.seq for row in result.deleted] == [1]
        assert result.totals.pending == 0
        (parked,) = spill.parked()
        assert parked == ParkedWrite(1, "save_event", {"args": [{"i": 1}], "kwargs": {}}, "bad data", 5.0, 10)
        spill.park([ParkedWrite(2, "save_x", None, "cannot encode", 6.0, 0)])
        spill.unpark()
        assert [row.seq for row in spill.page(0, None)] == [1]
        assert [row.key for row in spill.index_rows()] == ['"k"']
        assert [write.seq for write in spill.parked()] == [2]
    finally:
        spill.close()


def test_stored_calls_are_compact_json(tmp_path: Path) -> None:
    assert dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'


def test_running_totals_match_a_fresh_count(tmp_path: Path) -> None:
    path = str(tmp_path / "dlq.db")
    spill = SpillFile.open(path)
    try:
        spill.write([entry(seq, size=seq) for seq in range(1, 21)], generation=1, delete=())
        spill.delete([3, 4, 99])
        spill.park_pending(5, reason="bad", parked_at=1.0)
        spill.park([ParkedWrite(30, "save_x", None, "bad", 1.0, 7)])
        with pytest.raises(SpillCapError):
            spill.write(
                [entry(seq, size=50) for seq in range(31, 35)], generation=1, delete=[6], max_bytes=300
            )
        spill.write([entry(seq, size=50) for seq in range(31, 35)], generation=1, delete=[6], max_bytes=1000)
        spill.unpark(limit=1)
        with pytest.raises(sqlite3.IntegrityError):
            spill.write([entry(31)], generation=1, delete=[7])
        written = spill.totals()
        reader = SpillFile.open_read_only(path)
        try:
            assert reader.totals() == written
        finally:
            reader.close()
        assert written.pending == len(spill.page(0, None))
        assert written.pending_bytes == sum(item.size for item in spill.page(0, None))
        assert written.pending_bytes + written.parked_bytes <= 1000
    finally:
        spill.close()
