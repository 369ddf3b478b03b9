"""Slots: any number of buffers on one base path, target identity, adoption of orphaned files.

In-process buffers stand for processes here (each takes its own ``flock``); the tests where real
processes matter are in ``test_processes.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.deadletter import DeadLetter, DeadLetterBuffer, SpillFile, slot_files, slot_path
from guarded.deadletter import spill as spill_module
from guarded.deadletter.spill import SCHEMA_VERSION, acquire_lock
from guarded.logical_time import WRITE_TIME_ARGUMENT
from guarded.models import TaskContextSnapshot, TaskState, TaskStatus, TaskType
from tests.deadletter.support import config, event, put_events

pytestmark = pytest.mark.asyncio

MEMORY = "save_memory_state"


def target_buffer(path: Path, target: str | None = "db-a", **options: Any) -> DeadLetterBuffer:
    clock = options.pop("clock", None)
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    return DeadLetterBuffer(
        config(path, **options), store_name="primary", registry=CollectorRegistry(), target=target, **extra
    )


def read(path: Path | str) -> tuple[list[DeadLetter], int, str | None]:
    """Waiting entries, parked count and recorded target of a file (read-only)."""
    reader = SpillFile.open_read_only(str(path))
    try:
        return reader.page(0, None), reader.totals().parked, reader.target
    finally:
        reader.close()


@contextlib.contextmanager
def sqlite(path: Path | str) -> Iterator[sqlite3.Connection]:
    """A connection that commits and is closed on the way out: ``with sqlite3.connect()`` only
    commits, and an open connection's WAL is checkpointed into the file whenever the connection
    happens to be collected, changing bytes a test compares."""
    with contextlib.closing(sqlite3.connect(str(path))) as db, db:
        yield db


def meta(path: Path | str, name: str) -> str | None:
    with sqlite(path) as db:
        row = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def exists(path: Path | str) -> bool:
    return os.path.exists(path)


async def put_memory(target: DeadLetterBuffer, key: str, value: Any, stamp: int) -> None:
    await target.put(MEMORY, (key, {"v": value}), {}, key=key, stamp=stamp, error="x")


async def orphan(path: Path, fill: Any, *, target: str | None = "db-a", **options: Any) -> str:
    """Leave a slot file other than slot 0 with writes in it, as a process that is gone would:
    a holder keeps slot 0 while the filler takes the next slot and closes."""
    holder = target_buffer(path, target)
    await holder.put("save_event", (event("holder", 0),), {}, scope="holder", stamp=0, error="x")
    filler = target_buffer(path, target, **options)
    try:
        await fill(filler)
        name = filler.spill_path
        assert name is not None
    finally:
        await filler.aclose()
        await holder.aclose()
    return name


# --- names and locks ----------------------------------------------------------------------------


async def test_slot_names_and_the_listing_of_a_base_path(tmp_path: Path) -> None:
    base = str(tmp_path / "dlq.sqlite")
    assert slot_path(base, 0) == base
    assert slot_path(base, 3) == base + ".3"
    for name in (
        "dlq.sqlite",
        "dlq.sqlite.1",
        "dlq.sqlite.12",
        "dlq.sqlite.lock",
        "dlq.sqlite.1.lock",
        "dlq.sqlite.1-wal",
        "dlq.sqlite.01",
        "dlq.sqlite.x",
        "dlq.sqlite.corrupt-20260101T000000Z",
        "other.sqlite.2",
    ):
        (tmp_path / name).write_bytes(b"")
    assert slot_files(base) == [(0, base), (1, base + ".1"), (12, base + ".12")]
    assert slot_files(str(tmp_path / "missing" / "dlq.sqlite")) == []


async def test_a_lock_taken_on_a_replaced_lock_file_is_dropped_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock/unlink race: a remover unlinks the lock file (holding it) between our open and our
    flock; the lock we then get is on a dead inode and protects nothing."""
    path = str(tmp_path / "dlq.sqlite")
    real_flock = fcntl.flock
    calls: list[int] = []

    def flock(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        calls.append(fd)
        if len(calls) == 1:  # the remover's unlink, and a new lock file by someone else
            os.unlink(path + ".lock")
            os.close(os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600))

    monkeypatch.setattr(spill_module.fcntl, "flock", flock)
    fd = acquire_lock(path)
    try:
        assert len(calls) == 2
        assert os.fstat(fd).st_ino == os.stat(path + ".lock").st_ino
    finally:
        os.close(fd)


# --- many buffers on one path -------------------------------------------------------------------


async def test_buffers_on_one_base_path_take_distinct_slots(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    buffers = [target_buffer(path) for _ in range(3)]
    try:
        for index, target in enumerate(buffers):
            await put_events(target, f"t{index}", 2)
        assert [target.spill_path for target in buffers] == [str(path), f"{path}.1", f"{path}.2"]
        for index, target in enumerate(buffers):
            entries, _, recorded = read(target.spill_path or "")
            assert [entry.scope for entry in entries] == [f"t{index}"] * 2
            assert recorded == "db-a"
    finally:
        for target in buffers:
            await target.aclose()


async def test_an_empty_slot_file_is_removed_when_its_buffer_closes(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    first, second = target_buffer(path), target_buffer(path)
    await put_events(first, "a", 1)
    await put_events(second, "b", 1)
    assert second.spill_path == f"{path}.1"
    for target in (first, second):
        await target.purge(pending=True, parked=True)
        await target.aclose()
    assert exists(path)  # slot 0 is the configured path itself: kept
    assert not any(exists(f"{path}.1{suffix}") for suffix in ("", "-wal", "-shm", ".lock"))


# --- target identity ----------------------------------------------------------------------------


async def test_a_file_of_another_target_is_neither_claimed_nor_adopted(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    first = target_buffer(path, "db-a")
    await put_memory(first, "k", "for a", 1)
    await first.aclose()

    other = target_buffer(path, "db-b")
    try:
        assert await other.open() == 0
        assert other.spill_path is None
        await put_memory(other, "k", "for b", 1)
        assert other.spill_path == f"{path}.1"
        assert await other.adopt_orphans() == 0
        assert other.depth == 1
    finally:
        await other.aclose()
    entries, _, recorded = read(path)
    assert recorded == "db-a"
    assert [entry.call["args"][1] for entry in entries] == [{"v": "for a"}]

    again = target_buffer(path, "db-a")
    try:
        assert await again.open() == 1
        assert again.spill_path == str(path)
        assert await again.adopt_orphans() == 0  # slot 1 is db-b's
        assert await again.latest_for_key(MEMORY, "k") == (("k", {"v": "for a"}), {})
    finally:
        await again.aclose()
    assert read(f"{path}.1")[2] == "db-b"


async def test_an_empty_file_of_another_target_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    first = target_buffer(path, "db-a")
    await put_memory(first, "k", 1, 1)
    await first.purge(pending=True, parked=True)
    await first.aclose()
    other = target_buffer(path, "db-b")
    try:
        await put_memory(other, "k", 2, 1)
        assert other.spill_path == str(path)
    finally:
        await other.aclose()
    assert read(path)[2] == "db-b"


async def test_a_file_without_a_recorded_target_is_taken_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Layout 1 recorded no target: it was written by a guard configured with this very path."""
    path = tmp_path / "dlq.sqlite"
    legacy = target_buffer(path, None)
    await put_memory(legacy, "k", "old", 1)
    await legacy.aclose()
    with sqlite(path) as db:  # what guarded with layout 1 wrote
        db.execute("UPDATE meta SET value = '1' WHERE name = 'schema_version'")
        db.execute("DELETE FROM meta WHERE name = 'target'")
    assert meta(path, "target") is None

    target = target_buffer(path, "db-a")
    with caplog.at_level(logging.WARNING, logger="guarded.deadletter"):
        try:
            assert await target.open() == 1
            assert target.spill_path == str(path)
        finally:
            await target.aclose()
    records = [
        record for record in caplog.records if getattr(record, "event", None) == "deadletter_legacy_file"
    ]
    assert len(records) == 1
    assert "db-a" in records[0].getMessage()
    assert meta(path, "schema_version") == str(SCHEMA_VERSION)  # migrated to the newest layout
    assert meta(path, "target") == "db-a"


async def test_a_newer_or_foreign_file_is_passed_over_and_left_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dlq.sqlite"
    newer = target_buffer(path)
    await put_memory(newer, "k", 1, 1)
    await newer.aclose()
    with sqlite(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with sqlite(tmp_path / "dlq.sqlite.1") as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    before = {name: (tmp_path / name).read_bytes() for name in ("dlq.sqlite", "dlq.sqlite.1")}

    target = target_buffer(path)
    with caplog.at_level(logging.WARNING, logger="guarded.deadletter"):
        try:
            assert await target.open() == 0
            await put_memory(target, "k", 2, 1)
            assert target.spill_path == f"{path}.2"
            assert await target.adopt_orphans() == 0
            assert await target.adopt_orphans() == 0
        finally:
            await target.aclose()
    after = {name: (tmp_path / name).read_bytes() for name in ("dlq.sqlite", "dlq.sqlite.1")}
    assert after == before
    skipped = [
        record for record in caplog.records if getattr(record, "event", None) == "deadletter_spill_skipped"
    ]
    assert sorted(record.path for record in skipped) == [str(path), f"{path}.1"]  # once each


# --- adoption -----------------------------------------------------------------------------------


async def test_adoption_moves_waiting_and_parked_writes_in_order(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"

    async def fill(target: DeadLetterBuffer) -> None:
        await put_events(target, "t", 3)
        await target.park("save_task", (), {"state": {}}, reason="bad data")
        await put_events(target, "t", 2, start=3)
        await put_memory(target, "m", "orphaned", 9)

    name = await orphan(path, fill)
    survivor = target_buffer(path)
    try:
        assert await survivor.open() == 1 + 6  # the holder's own event in slot 0, and the orphan's
        assert survivor.spill_path == str(path)
        entries = await survivor.entries()
        assert [(entry.scope, entry.method) for entry in entries] == [("holder", "save_event")] + [
            ("t", "save_event")
        ] * 5 + [(None, MEMORY)]
        assert [entry.call["args"][0]["payload"]["i"] for entry in entries[1:6]] == [0, 1, 2, 3, 4]
        assert [entry.seq for entry in entries] == sorted(entry.seq for entry in entries)
        (parked,) = await survivor.parked()
        assert parked.reason.startswith("bad data")
        assert len(await survivor.pending_for_scope("save_event", "t")) == 5
        assert (await survivor.stats()).adopted_total == 7
        assert await survivor.adopt_orphans() == 0
    finally:
        await survivor.aclose()
    assert not any(exists(name + suffix) for suffix in ("", "-wal", "-shm", ".lock"))


async def test_without_logical_times_adopted_writes_are_older_than_any_write_of_this_process(
    tmp_path: Path,
) -> None:
    """Writes held before logical times existed, and direct writes whose time was not noted."""
    path = tmp_path / "dlq.sqlite"

    async def fill(target: DeadLetterBuffer) -> None:
        for key in ("a", "b", "c"):
            await put_memory(target, key, f"orphaned {key}", 1_000_000)

    await orphan(path, fill)
    survivor = target_buffer(path)
    try:
        await put_memory(survivor, "a", "newer, held", 1)  # claims slot 0; held before adoption
        await survivor.supersede(MEMORY, "b", 1)  # written directly by this process
        assert await survivor.adopt_orphans() == 1  # only c
        assert await survivor.latest_for_key(MEMORY, "a") == (("a", {"v": "newer, held"}), {})
        assert await survivor.latest_for_key(MEMORY, "b") is None
        assert await survivor.latest_for_key(MEMORY, "c") == (("c", {"v": "orphaned c"}), {})
        await put_memory(survivor, "c", "newer still", 0)  # any stamp of this process is newer
        assert await survivor.latest_for_key(MEMORY, "c") == (("c", {"v": "newer still"}), {})
        assert (await survivor.stats()).superseded_total == 3
    finally:
        await survivor.aclose()


async def put_timed(target: DeadLetterBuffer, key: str, value: str, stamp: int, *, at: int) -> None:
    """A held memory state whose call had logical time ``at`` (as the guard keeps it)."""
    await target.put(MEMORY, (key, {"v": value}), {WRITE_TIME_ARGUMENT: at}, key=key, stamp=stamp, error="x")


async def held_value(target: DeadLetterBuffer, key: str) -> Any:
    """The value of the newest waiting memory state of ``key`` (``None`` when none waits)."""
    call = await target.latest_for_key(MEMORY, key)
    return None if call is None else call[0][1]["v"]


async def test_an_orphan_of_a_worker_that_ran_beside_this_one_wins_where_its_calls_were_later(
    tmp_path: Path,
) -> None:
    """Two workers on one path: the orphan's writes of ``held`` and ``direct`` were called after
    this process's held write and direct write of those keys (their logical times are larger), so
    they are adopted, the held one replacing this process's; the orphan's write of ``stale`` was
    called before this process's held write of it and is superseded."""
    path = tmp_path / "dlq.sqlite"

    async def fill(target: DeadLetterBuffer) -> None:
        await put_timed(target, "held", "orphan, later", 1, at=2_000)
        await put_timed(target, "direct", "orphan, later", 2, at=2_000)
        await put_timed(target, "stale", "orphan, earlier", 3, at=1_000)

    await orphan(path, fill)
    survivor = target_buffer(path)
    try:
        await put_timed(survivor, "held", "own, earlier", 1, at=1_500)
        await put_timed(survivor, "stale", "own, later", 2, at=1_500)
        await survivor.supersede(MEMORY, "direct", 3, 1_500)
        assert await survivor.adopt_orphans() == 2
        assert await held_value(survivor, "held") == "orphan, later"
        assert await held_value(survivor, "direct") == "orphan, later"
        assert await held_value(survivor, "stale") == "own, later"
        assert len(await survivor.entries()) == 1 + 3  # slot 0's event, and one write per key
    finally:
        await survivor.aclose()


async def test_an_equal_logical_time_keeps_this_processs_write(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"

    async def fill(target: DeadLetterBuffer) -> None:
        await put_timed(target, "held", "orphan", 1, at=2_000)
        await put_timed(target, "direct", "orphan", 2, at=2_000)

    await orphan(path, fill)
    survivor = target_buffer(path)
    try:
        await put_timed(survivor, "held", "own", 1, at=2_000)
        await survivor.supersede(MEMORY, "direct", 2, 2_000)
        assert await survivor.adopt_orphans() == 0
        assert await held_value(survivor, "held") == "own"
        assert await held_value(survivor, "direct") is None
    finally:
        await survivor.aclose()


async def test_an_orphaned_task_state_is_kept_beside_this_processs_for_the_backend_to_order(
    tmp_path: Path,
) -> None:
    """A task state is ordered by its ``updated_at`` in the backend, not by the logical time of
    the call: the orphan's later call may carry an older state, so neither side supersedes the
    other at adoption (a regression of comparing logical times for every key, found by review)."""
    path = tmp_path / "dlq.sqlite"

    async def put_task(target: DeadLetterBuffer, note: str, stamp: int, *, at: int) -> None:
        state = TaskState(
            task_id="task1",
            session_id="s1",
            status=TaskStatus.RUNNING,
            task_type=TaskType.FOREGROUND,
            priority=0,
            context_snapshot=TaskContextSnapshot(session_id="s1", task_id="task1"),
            description=note,
        )
        await target.put(
            "save_task", (state,), {WRITE_TIME_ARGUMENT: at}, key="task1", stamp=stamp, error="x"
        )

    async def fill(target: DeadLetterBuffer) -> None:
        await put_task(target, "orphan: later call, older updated_at", 1, at=2_000)

    await orphan(path, fill)
    survivor = target_buffer(path)
    try:
        await put_task(survivor, "own: earlier call, newer updated_at", 1, at=1_000)
        assert await survivor.adopt_orphans() == 1
        tasks = [entry for entry in await survivor.entries() if entry.method == "save_task"]
        kept = [
            note
            for note in ("orphan: later call", "own: earlier call")
            for entry in tasks
            if note in str(entry.call)
        ]
        assert sorted(kept) == ["orphan: later call", "own: earlier call"]
    finally:
        await survivor.aclose()


async def test_among_orphaned_writes_of_a_key_the_newest_is_kept(tmp_path: Path) -> None:
    """An orphan may hold several writes of a key (an unparked one beside a newer one), and a key
    waiting from an earlier process loses to a later orphaned write of it."""
    path = tmp_path / "dlq.sqlite"
    now = [1000.0]

    early = target_buffer(path, clock=lambda: now[0])
    await put_memory(early, "q", "earlier process, kept first", 5)
    await early.aclose()  # slot 0 keeps q, enqueued at 1000

    now[0] = 2000.0
    name = str(path) + ".1"
    spill = SpillFile.open(name, target="db-a", check_target=True)
    try:

        def held(seq: int, key: str, value: str, stamp: int) -> DeadLetter:
            call = {"args": [key, {"v": value}], "kwargs": {}}
            return DeadLetter(seq, MEMORY, call, f'"{key}"', None, stamp, 2000.0 + seq, 20, "x")

        spill.write([held(1, "k", "older generation", 50)], generation=1)
        spill.write([held(2, "k", "newer generation", 1), held(3, "q", "later orphan", 1)], generation=2)
    finally:
        spill.close()

    survivor = target_buffer(path, clock=lambda: now[0])
    try:
        assert await survivor.open() == 2  # q of slot 0 gives way to the later orphaned q; k adopted
        assert await survivor.latest_for_key(MEMORY, "k") == (("k", {"v": "newer generation"}), {})
        assert await survivor.latest_for_key(MEMORY, "q") == (("q", {"v": "later orphan"}), {})
    finally:
        await survivor.aclose()
    entries, _, _ = read(path)
    assert sorted(entry.call["args"][1]["v"] for entry in entries) == ["later orphan", "newer generation"]


async def test_a_crash_between_copy_and_removal_duplicates_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dlq.sqlite"
    name = await orphan(path, lambda target: put_events(target, "t", 4))
    survivor = target_buffer(path)
    real_remove = SpillFile.remove
    failures = [OSError("simulated crash before the orphan is removed")]

    def remove(self: SpillFile) -> None:
        if failures:
            self.close()
            raise failures.pop()
        real_remove(self)

    monkeypatch.setattr(SpillFile, "remove", remove)
    try:
        with caplog.at_level(logging.WARNING, logger="guarded.deadletter"):
            assert await survivor.open() == 1 + 4
        assert exists(name)  # the adopting process "crashed" before removing it
        assert await survivor.adopt_orphans() == 4  # the same writes again: duplicates, not loss
        assert not exists(name)
        scopes = [entry.scope for entry in await survivor.entries()]
        assert scopes.count("t") == 8
    finally:
        await survivor.aclose()
    assert any("may be replayed twice" in record.getMessage() for record in caplog.records)


async def test_looking_for_orphans_is_cheap_when_there_are_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dlq.sqlite"
    other = target_buffer(path, "db-b")
    await put_memory(other, "k", 1, 1)
    await other.aclose()  # slot 0: another target's writes
    live = target_buffer(path)
    await put_memory(live, "k", 1, 1)  # slot 1: a live process
    survivor = target_buffer(path)
    opened: list[str] = []
    real_open = SpillFile.open.__func__  # type: ignore[attr-defined]

    def counting_open(cls: type[SpillFile], name: str, **options: Any) -> SpillFile:
        opened.append(name)
        return real_open(cls, name, **options)  # type: ignore[no-any-return]

    try:
        await put_memory(survivor, "j", 1, 1)
        assert survivor.spill_path == f"{path}.2"
        late = SpillFile.open(f"{path}.3", target="db-b", check_target=True)  # after the claim
        late.write(
            [DeadLetter(1, MEMORY, {"args": ["k", {}], "kwargs": {}}, '"k"', None, 1, 1.0, 9, "x")],
            generation=1,
        )
        late.close()
        monkeypatch.setattr(SpillFile, "open", classmethod(counting_open))
        for _ in range(3):
            assert await survivor.adopt_orphans() == 0
        # slot 0 was looked at when slot 2 was claimed, slot 3 once: then a stat says "unchanged";
        # slot 1 is locked by a live process and never opened
        assert opened == [f"{path}.3"]
    finally:
        await survivor.aclose()
        await live.aclose()
