"""A spill file that fails: a write that needs holding is refused (``WriteNotKeptError``, counted in
``guarded_deadletter_refused_total``), never held in memory only; nothing else raises, one ERROR
says so, ``guarded_deadletter_spill_available`` is 0, and the file is tried again now and then;
what memory still holds (a damaged file's copies, parked writes) moves into it when it is back."""

from __future__ import annotations

import errno
import glob
import logging
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.deadletter import DeadLetterBuffer, SpillFile, store_sender
from guarded.errors import WriteNotKeptError
from tests.deadletter.support import STORE, config, event, put_events, sample

pytestmark = pytest.mark.asyncio

MEMORY = "save_memory_state"
UNAVAILABLE = "deadletter_spill_unavailable"


class Clock:
    """A monotonic clock the test moves: retries of the spill file are due when it says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 10.0) -> None:
        self.now += seconds


def make(
    path: Path | str, registry: CollectorRegistry | None = None, clock: Clock | None = None, **options: Any
) -> DeadLetterBuffer:
    extra: dict[str, Any] = {}
    for name in ("max_slots", "retry_interval"):
        if name in options:
            extra[name] = options.pop(name)
    return DeadLetterBuffer(
        config(path, **options),
        store_name=STORE,
        registry=registry or CollectorRegistry(),
        target="db",
        monotonic=clock or Clock(),
        **extra,
    )


def refused(registry: CollectorRegistry, method: str, reason: str) -> float | None:
    return sample(registry, "guarded_deadletter_refused_total", method=method, reason=reason)


def gauge(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("guarded_deadletter_spill_available", {"store": STORE})


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "event", None) == name]


def on_disk(path: Path | str) -> tuple[int, int]:
    reader = SpillFile.open_read_only(str(path))
    try:
        totals = reader.totals()
        return totals.pending, totals.parked
    finally:
        reader.close()


def exists(path: Path | str) -> bool:
    return os.path.exists(path)


async def put_memory(target: DeadLetterBuffer, key: str, value: Any, stamp: int) -> None:
    await target.put(MEMORY, (key, {"v": value}), {}, key=key, stamp=stamp, error="x")


def corrupt_error() -> sqlite3.DatabaseError:
    error = sqlite3.DatabaseError("database disk image is malformed")
    error.sqlite_errorcode = sqlite3.SQLITE_CORRUPT  # type: ignore[attr-defined]
    return error


def full_error() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database or disk is full")
    error.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    return error


@pytest.fixture
def caplog_errors(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="guarded.deadletter")
    return caplog


def mount_tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB filesystem (root only; skipped elsewhere)."""
    yield from mount_tmpfs(tmp_path / "tiny", "size=256k")


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Iterator[Path]:
    """A read-only filesystem (root only; skipped elsewhere)."""
    yield from mount_tmpfs(tmp_path / "ro", "ro,size=64k")


# --- no usable slot -----------------------------------------------------------------------------


async def test_locked_on_every_slot_refuses_writes_until_a_slot_frees(
    tmp_path: Path, caplog_errors: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dlq.sqlite"
    holders = [make(path) for _ in range(2)]
    for index, holder in enumerate(holders):
        await put_events(holder, f"holder{index}", 1)
    registry, clock = CollectorRegistry(), Clock()
    target = make(path, registry, clock, max_slots=2)
    store = InMemoryStateStore()
    try:
        assert await target.open() == 0
        with pytest.raises(WriteNotKeptError, match="unavailable"):
            await put_memory(target, "k", "held", 1)
        with pytest.raises(WriteNotKeptError):
            await put_events(target, "t", 1)
        await target.park("save_task", (), {"state": {}}, reason="bad data")
        assert (target.depth, target.memory_only, target.spill_path) == (0, 0, None)
        assert not target.spill_available
        assert gauge(registry) == 0
        assert "no usable dead-letter spill slot" in (target.spill_error or "")
        assert refused(registry, MEMORY, "spill_unavailable") == 1
        await holders[1].aclose()  # slot 1 is free now (its write stays in it)
        clock.advance(1)  # not due yet
        with pytest.raises(WriteNotKeptError):
            await put_events(target, "t", 1, start=3)
        clock.advance()
        await put_events(target, "t", 1, start=4)
        assert target.spill_path == f"{path}.1"
        assert (target.depth, target.memory_only) == (1 + 1, 0)
        assert gauge(registry) == 1
        assert on_disk(f"{path}.1") == (2, 1)
        assert len(events(caplog_errors, UNAVAILABLE)) == 1
        assert len(events(caplog_errors, "deadletter_spill_available")) == 1
        send, send_bulk = store_sender(store)
        summary = await target.replay(send, send_bulk=send_bulk, rate=float("inf"))
        assert (summary.replayed, summary.remaining) == (2, 0)
    finally:
        await target.aclose()
        await holders[0].aclose()
    assert [item.payload["i"] for item in await store.load_history("t")] == [4]
    assert len(await store.load_history("holder1")) == 1
    assert await store.load_memory_state("k") is None


# --- damaged files ------------------------------------------------------------------------------


async def test_a_damaged_file_is_set_aside_and_a_fresh_one_started(
    tmp_path: Path, caplog_errors: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dlq.sqlite"
    garbage = b"this is not an SQLite database " * 200
    path.write_bytes(garbage)
    registry = CollectorRegistry()
    target = make(path, registry)
    try:
        assert await target.open() == 0
        await put_memory(target, "k", 1, 1)
        assert target.spill_path == str(path)
        assert gauge(registry) == 1
    finally:
        await target.aclose()
    (aside,) = glob.glob(f"{path}.corrupt-*")
    with open(aside, "rb") as handle:  # noqa: ASYNC230 - a test reading a small file
        assert handle.read() == garbage
    (record,) = events(caplog_errors, "deadletter_spill_corrupt")
    assert record.levelno == logging.ERROR
    assert record.renamed_to == aside
    assert aside in record.getMessage()
    assert on_disk(path) == (1, 0)


async def test_a_file_damaged_under_a_live_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog_errors: pytest.LogCaptureFixture
) -> None:
    """What memory holds of the damaged file goes on in a fresh one; what only the file held is
    counted as dropped (the renamed file keeps it for inspection)."""
    path = tmp_path / "dlq.sqlite"
    registry = CollectorRegistry()
    target = make(path, registry, max_memory_entries=2)
    try:
        await put_events(target, "t", 5)
        assert (await target.stats()).memory_entries == 2
        spill = target._spill
        assert spill is not None

        def damaged(*args: Any, **kwargs: Any) -> Any:
            raise corrupt_error()

        monkeypatch.setattr(spill, "write", damaged)
        await put_events(target, "t", 1, start=5)
        # The memory cap counts writes waiting for their commit: older copies made room for newer
        # writes, so memory holds the newest.
        assert target.depth == 2
        assert target.spill_path == str(path)
        assert gauge(registry) == 1
        entries = await target.entries()
        assert [entry.call["args"][0]["payload"]["i"] for entry in entries] == [4, 5]
        assert on_disk(path) == (2, 0)
        dropped = sample(
            registry, "guarded_deadletter_dropped_total", method="unknown", reason="spill_corrupt"
        )
        assert dropped == 4
    finally:
        await target.aclose()
    assert len(glob.glob(f"{path}.corrupt-*")) == 1
    assert len(events(caplog_errors, "deadletter_spill_corrupt")) == 1
    assert not events(caplog_errors, UNAVAILABLE)


# --- full disk ----------------------------------------------------------------------------------


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` with one file; returns it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    failure: OSError | None = None
    try:
        while failure is None:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                failure = exc
    finally:
        os.close(fd)
    assert failure.errno == errno.ENOSPC
    return filler


async def check_full_disk(
    target: DeadLetterBuffer,
    registry: CollectorRegistry,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
    make_full: Any,
    make_room: Any,
) -> None:
    await put_memory(target, "warm", 0, 0)
    spill_path = target.spill_path
    assert spill_path is not None
    make_full()
    written = 0
    refusal: WriteNotKeptError | None = None
    while refusal is None:  # until a write meets the full disk
        assert written < 500, "the spill file never filled up"
        try:
            await put_memory(target, f"k{written}", "x" * 1000, written + 1)
        except WriteNotKeptError as exc:
            refusal = exc
        else:
            written += 1
    assert "is full" in str(refusal)
    assert not target.spill_available
    assert (target.depth, target.memory_only) == (1 + written, 0)  # refused, never held in memory
    assert gauge(registry) == 0
    for extra in range(5):
        with pytest.raises(WriteNotKeptError):
            await put_memory(target, f"late{extra}", extra, 1000 + extra)
    await target.park("save_task", (), {"state": {}}, reason="bad data")
    assert target.depth == 1 + written
    assert refused(registry, MEMORY, "disk_full") == 6
    assert len(events(caplog, UNAVAILABLE)) == 1
    make_room()
    clock.advance()
    await put_memory(target, "after", 1, 2000)
    assert target.spill_available
    assert (target.memory_only, target.spill_path) == (0, spill_path)
    assert gauge(registry) == 1
    assert on_disk(spill_path) == (target.depth, 1)
    store = InMemoryStateStore()
    send, send_bulk = store_sender(store)
    summary = await target.replay(send, send_bulk=send_bulk, rate=float("inf"))
    assert (summary.replayed, summary.remaining) == (1 + written + 1, 0)
    for index in range(written):
        assert await store.load_memory_state(f"k{index}") == {"v": "x" * 1000}
    assert await store.load_memory_state(f"k{written}") is None
    assert await store.load_memory_state("late0") is None
    assert await store.load_memory_state("after") == {"v": 1}


async def test_a_full_filesystem(tiny_fs: Path, caplog_errors: pytest.LogCaptureFixture) -> None:
    registry, clock = CollectorRegistry(), Clock()
    target = make(tiny_fs / "dlq.sqlite", registry, clock)
    filler: list[Path] = []
    try:
        await check_full_disk(
            target,
            registry,
            clock,
            caplog_errors,
            lambda: filler.append(fill(tiny_fs)),
            lambda: filler[0].unlink(),
        )
    finally:
        await target.aclose()


async def test_a_database_at_its_page_limit(tmp_path: Path, caplog_errors: pytest.LogCaptureFixture) -> None:
    """``SQLITE_FULL`` without a small filesystem: the file may not grow past its page limit."""
    registry, clock = CollectorRegistry(), Clock()
    target = make(tmp_path / "dlq.sqlite", registry, clock)

    def limit(pages: int | None) -> None:
        spill = target._spill
        assert spill is not None
        count = spill._db.execute("PRAGMA page_count").fetchone()[0]
        spill._db.execute(f"PRAGMA max_page_count = {count + 1 if pages is None else pages}")

    try:
        await check_full_disk(
            target, registry, clock, caplog_errors, lambda: limit(None), lambda: limit(1 << 30)
        )
    finally:
        await target.aclose()


# --- paths that cannot be written ---------------------------------------------------------------


async def test_a_path_under_a_regular_file_refuses_writes_and_raises_nothing_else(
    tmp_path: Path, caplog_errors: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    registry = CollectorRegistry()
    target = make(blocker / "dlq.sqlite", registry)
    try:
        assert await target.open() == 0
        with pytest.raises(WriteNotKeptError):
            await put_memory(target, "k", 1, 1)
        answers = await target.put_many([("save_event", (event("t", 0),), {}, None, "t", 2, "x")])
        assert [type(answer) for answer in answers] == [WriteNotKeptError]
        await target.park(MEMORY, ("p", {"v": 1}), {}, reason="bad data")
        assert await target.adopt_orphans() == 0
        assert await target.latest_for_key(MEMORY, "k") is None
        assert await target.pending_for_scope("save_event", "t") == []
        assert await target.entries() == []
        assert len(await target.parked()) == 1
        assert (target.depth, target.memory_only, target.spill_path) == (0, 0, None)
        assert gauge(registry) == 0
        assert await target.take(MEMORY, "k") is None
        assert await target.supersede(MEMORY, "k", 5) == 0
        assert await target.unpark() == 1
        assert (await target.stats()).spill_available is False
        assert refused(registry, MEMORY, "spill_unavailable") == 1
        assert refused(registry, "save_event", "spill_unavailable") == 1
    finally:
        await target.aclose()
    (record,) = events(caplog_errors, UNAVAILABLE)
    assert record.levelno == logging.ERROR
    assert record.error in ("NotADirectoryError", "FileExistsError")
    refusals = events(caplog_errors, "deadletter_refused")
    assert refusals
    assert all(record.levelno == logging.ERROR for record in refusals)


async def test_a_read_only_filesystem(read_only_fs: Path, caplog_errors: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    target = make(read_only_fs / "dlq.sqlite", registry)
    try:
        with pytest.raises(WriteNotKeptError):
            await put_events(target, "t", 3)
        assert (target.depth, target.memory_only) == (0, 0)
        assert gauge(registry) == 0
    finally:
        await target.aclose()
    (record,) = events(caplog_errors, UNAVAILABLE)
    assert "Read-only file system" in record.getMessage()


async def test_a_slot_whose_lock_cannot_be_created_is_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    (tmp_path / "dlq.sqlite.lock").mkdir()
    target = make(path)
    try:
        await put_events(target, "t", 1)
        assert target.spill_path == f"{path}.1"
    finally:
        await target.aclose()


# --- memory while the file is unavailable -------------------------------------------------------


async def test_nothing_is_held_in_memory_only_while_the_file_is_unavailable(
    tmp_path: Path, caplog_errors: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    registry = CollectorRegistry()
    target = make(blocker / "dlq.sqlite", registry, max_memory_entries=3)
    try:
        for index in range(5):
            with pytest.raises(WriteNotKeptError):
                await put_events(target, "t", 1, start=index)
        assert target.depth == 0
        assert (
            sample(
                registry, "guarded_deadletter_refused_total", method="save_event", reason="spill_unavailable"
            )
            == 5
        )
        assert (
            sample(registry, "guarded_deadletter_dropped_total", method="save_event", reason="memory_full")
            == 0
        )
    finally:
        await target.aclose()
    assert not events(caplog_errors, "deadletter_dropped")


async def test_deletions_the_file_cannot_take_are_applied_when_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replayed and superseded writes the file cannot delete are not replayed again by this
    process, and are deleted from the file once it takes writes again."""
    path = tmp_path / "dlq.sqlite"
    registry, clock = CollectorRegistry(), Clock()
    target = make(path, registry, clock)
    sent: list[tuple[str, Any]] = []

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sent.append((method, args[0] if method == MEMORY else args[0].payload["i"]))
        from guarded.deadletter import ReplayResult

        return ReplayResult.OK

    try:
        await put_events(target, "t", 3)
        await put_memory(target, "k", "old", 1)
        await put_memory(target, "j", "old", 2)
        spill = target._spill
        assert spill is not None
        real_delete = spill.delete

        def full(*args: Any, **kwargs: Any) -> Any:
            raise full_error()

        monkeypatch.setattr(spill, "delete", full)
        await target.supersede(MEMORY, "j", 3)  # a newer direct write of j succeeded
        assert not target.spill_available
        assert await target.latest_for_key(MEMORY, "j") is None
        summary = await target.replay(send, rate=float("inf"))
        assert sent == [("save_event", 0), ("save_event", 1), ("save_event", 2), (MEMORY, "k")]
        assert summary.replayed == 4
        assert on_disk(path) == (5, 0)  # nothing could be deleted yet
        sent.clear()
        await target.replay(send, rate=float("inf"))
        assert sent == []  # not again
        monkeypatch.setattr(spill, "delete", real_delete)
        clock.advance()
        await put_memory(target, "new", 1, 4)
        assert target.spill_available
        assert target.depth == 1
        assert on_disk(path) == (1, 0)
    finally:
        await target.aclose()


async def test_closing_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = make(tmp_path / "dlq.sqlite")
    await put_events(target, "t", 1)
    spill = target._spill
    assert spill is not None

    def broken() -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(spill, "close", broken)
    await target.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await put_events(target, "t", 1)


async def test_a_damaged_call_in_the_file_is_quarantined_not_raised(tmp_path: Path) -> None:
    """A call that is not JSON is moved to the quarantine table with its raw bytes
    (it used to be parked without its call)."""
    path = tmp_path / "dlq.sqlite"
    target = make(path)
    sent: list[int] = []

    async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sent.append(args[0].payload["i"])
        from guarded.deadletter import ReplayResult

        return ReplayResult.OK

    try:
        await put_events(target, "t", 3)
        spill = target._spill
        assert spill is not None
        spill._db.execute("UPDATE pending SET call = '{\"args\": [trunc' WHERE seq = 2")
        target._memory.clear()
        summary = await target.replay(send)
        assert sent == [0, 2]
        assert (summary.replayed, summary.parked) == (2, 0)
        assert await target.parked() == []
        (quarantined,) = await target.quarantined(with_raw=True)
        assert quarantined.seq == 2
        assert "'call' is not JSON" in quarantined.reason
        assert ("call", "text", b'{"args": [trunc') in quarantined.raw
        assert target.is_empty
        assert target.claimed_path == str(path)
    finally:
        await target.aclose()


async def test_a_file_damaged_past_its_header_is_set_aside_when_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog_errors: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dlq.sqlite"
    first = make(path)
    await put_events(first, "t", 3)
    await first.aclose()
    real_rows = SpillFile.index_rows
    damage = [corrupt_error()]

    def index_rows(self: SpillFile) -> Any:
        if damage:
            raise damage.pop()
        return real_rows(self)

    monkeypatch.setattr(SpillFile, "index_rows", index_rows)
    registry = CollectorRegistry()
    target = make(path, registry)
    try:
        assert await target.open() == 0
        await put_events(target, "u", 1)
        assert (target.spill_path, target.depth) == (str(path), 1)
        assert gauge(registry) == 1
    finally:
        await target.aclose()
    (aside,) = glob.glob(f"{path}.corrupt-*")
    assert on_disk(aside) == (3, 0)  # kept for inspection
    assert len(events(caplog_errors, "deadletter_spill_corrupt")) == 1


async def test_a_memory_only_buffer_exports_no_spill_gauge() -> None:
    registry = CollectorRegistry()
    target = make_memory_only(registry)
    try:
        await put_events(target, "t", 2)
        assert gauge(registry) is None
        stats = await target.stats()
        assert (stats.spill_available, stats.spill_path, stats.memory_only) == (None, None, 2)
    finally:
        await target.aclose()


def make_memory_only(registry: CollectorRegistry) -> DeadLetterBuffer:
    return DeadLetterBuffer(config(None), store_name=STORE, registry=registry)


async def test_the_gauge_of_a_store_is_0_when_any_of_its_buffers_cannot_spill(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    blocker = tmp_path / "file"
    blocker.write_text("")
    healthy = make(tmp_path / "dlq.sqlite", registry)
    broken = make(blocker / "dlq.sqlite", registry)
    try:
        await put_events(healthy, "t", 1)
        assert gauge(registry) == 1
        with pytest.raises(WriteNotKeptError):
            await put_events(broken, "t", 1)
        assert gauge(registry) == 0
    finally:
        await broken.aclose()
        assert gauge(registry) == 1
        await healthy.aclose()
