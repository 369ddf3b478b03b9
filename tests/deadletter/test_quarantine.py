"""Corrupt spill rows are quarantined: a row that cannot be read — a column
of the wrong type, a NULL where a value belongs, text that is not UTF-8, a key or call that is not
JSON — is moved to the file's quarantine table with its raw bytes and a reason, counted and logged
without its contents, listed by ``guarded dlq list --quarantined``, and never makes the library or
the CLI raise. Every read path is tried against rows corrupted by direct SQL."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import GuardConfig, controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.cli import main
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer, ReplayResult, SpillFile, store_sender
from guarded.deadletter.spill import SCHEMA_VERSION, SpillTotals
from guarded.testing import FaultyStore
from tests.deadletter import factories
from tests.deadletter.support import buffer, config, event, sample

SECRET = "s3cr3t-payload"
MEMORY = "save_memory_state"

LATE_CALL = b'{"args":["' + SECRET.encode() + b'\xff"],"kwargs":{}}'
LATE = {"call not UTF-8"}
"""Damage the index does not see (it looks at calls through SQLite only): found when read."""

GOOD_EVENTS = [0, 2, 3]
"""Events of trace ``t`` left after seq 2 (event 1) is damaged."""

REBUILD = (
    "ALTER TABLE pending RENAME TO pending_old",
    "DROP INDEX IF EXISTS pending_by_key",
    "DROP INDEX IF EXISTS pending_by_scope",
    # No NOT NULL, and (for seq) no primary key: what a tool rebuilding the table might leave.
    "CREATE TABLE pending (seq, method, call, key, scope, stamp, generation, enqueued_at, size, error)",
    "INSERT INTO pending SELECT * FROM pending_old",
    "DROP TABLE pending_old",
)
REBUILD_PARKED = (
    "ALTER TABLE parked RENAME TO parked_old",
    "CREATE TABLE parked (seq INTEGER PRIMARY KEY, method, call, reason, parked_at, size, key, scope)",
    "INSERT INTO parked SELECT * FROM parked_old",
    "DROP TABLE parked_old",
)

PENDING_DAMAGE: dict[str, tuple[Sequence[str], str]] = {
    # label: (statements, what the reason says); seq 2 is event 1 of trace t
    "call not JSON": (
        ["UPDATE pending SET call = 'not json " + SECRET + "' WHERE seq = 2"],
        "'call' is not JSON",
    ),
    "call a JSON list": (["UPDATE pending SET call = '[1, 2]' WHERE seq = 2"], "'call' is not a JSON object"),
    "call neither UTF-8 nor JSON": (
        [f"UPDATE pending SET call = CAST(x'7b22{SECRET.encode().hex()}ff' AS TEXT) WHERE seq = 2"],
        "'call' is not JSON",
    ),
    "call not UTF-8": (
        # {"args":["<SECRET>\xff"],"kwargs":{}}: JSON to SQLite, found when the call is read
        [f"UPDATE pending SET call = CAST(x'{LATE_CALL.hex()}' AS TEXT) WHERE seq = 2"],
        "'call' holds text that is not UTF-8",
    ),
    "stamp not a number": (["UPDATE pending SET stamp = 'x' WHERE seq = 2"], "'stamp' holds text"),
    "enqueued_at not a number": (
        ["UPDATE pending SET enqueued_at = 'yesterday' WHERE seq = 2"],
        "'enqueued_at' holds text",
    ),
    "size not a number": (["UPDATE pending SET size = 'big' WHERE seq = 2"], "'size' holds text"),
    "method not UTF-8": (["UPDATE pending SET method = CAST(x'ff' AS TEXT) WHERE seq = 2"], "'method'"),
    "scope not UTF-8": (["UPDATE pending SET scope = CAST(x'74ff' AS TEXT) WHERE seq = 2"], "'scope'"),
    "error a blob": (["UPDATE pending SET error = x'00ff' WHERE seq = 2"], "'error' holds a blob"),
    "method NULL": ([*REBUILD, "UPDATE pending SET method = NULL WHERE seq = 2"], "'method' holds NULL"),
    "stamp NULL": ([*REBUILD, "UPDATE pending SET stamp = NULL WHERE seq = 2"], "'stamp' holds NULL"),
    "seq NULL": ([*REBUILD, "UPDATE pending SET seq = NULL WHERE seq = 2"], "'seq' holds NULL"),
    "seq text": ([*REBUILD, "UPDATE pending SET seq = 'two' WHERE seq = 2"], "'seq' holds text"),
}
KEY_DAMAGE: dict[str, tuple[Sequence[str], str]] = {
    # seq 5 is the memory state of key "k"
    "key not JSON": (["UPDATE pending SET key = '{' WHERE seq = 5"], "'key' is not JSON"),
    "key not UTF-8": (["UPDATE pending SET key = CAST(x'22ff22' AS TEXT) WHERE seq = 5"], "'key'"),
}
PARKED_DAMAGE: dict[str, tuple[Sequence[str], str]] = {
    # seq 7 is the parked write
    "parked call not UTF-8": (["UPDATE parked SET call = CAST(x'ff' AS TEXT) WHERE seq = 7"], "'call'"),
    "parked_at not a number": (["UPDATE parked SET parked_at = 'x' WHERE seq = 7"], "'parked_at' holds text"),
    "parked reason NULL": ([*REBUILD_PARKED, "UPDATE parked SET reason = NULL WHERE seq = 7"], "'reason'"),
}
ALL_DAMAGE = {**PENDING_DAMAGE, **KEY_DAMAGE, **PARKED_DAMAGE}


async def fill(target: DeadLetterBuffer) -> None:
    """seq 1-4: events 0-3 of trace t; 5: memory state of k; 6: memory state of j; 7: parked."""
    for index in range(4):
        await target.put(
            "save_event",
            (event("t", index, note=SECRET),),
            {},
            scope="t",
            stamp=index,
            error="ConnectionError",
        )
    await target.put(MEMORY, ("k", {"note": SECRET}), {}, key="k", stamp=10, error="x")
    await target.put(MEMORY, ("j", {"v": 1}), {}, key="j", stamp=11, error="x")
    await target.park(MEMORY, ("p", {"bad": SECRET}), {}, reason="bad data")


async def written(path: Path, statements: Sequence[str]) -> None:
    """A spill file written by a buffer, then damaged by direct SQL."""
    target = buffer(path)
    await fill(target)
    await target.aclose()
    await asyncio.to_thread(damage, path, statements)


def prepare(path: Path, statements: Sequence[str]) -> None:
    asyncio.run(written(path, statements))


def damage(path: Path, statements: Sequence[str]) -> None:
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        for statement in statements:
            db.execute(statement)
    finally:
        db.close()


def expected(label: str) -> tuple[int, int]:
    """Waiting and parked writes left readable after ``label``'s damage."""
    if label in PARKED_DAMAGE:
        return 6, 0
    return 5, 1


def no_secret(records: Sequence[logging.LogRecord]) -> None:
    for record in records:
        assert SECRET not in record.getMessage()
        assert SECRET not in json.dumps({k: str(v) for k, v in vars(record).items()})


# --- the buffer: open, every read, replay --------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("label", list(ALL_DAMAGE))
async def test_the_buffer_sets_a_damaged_row_aside_and_serves_every_read(
    tmp_path: Path, label: str, caplog: pytest.LogCaptureFixture
) -> None:
    statements, reason = ALL_DAMAGE[label]
    path = tmp_path / "dlq.sqlite"
    await written(path, statements)
    registry = CollectorRegistry()
    target = buffer(path, registry)
    waiting, parked = expected(label)
    try:
        with caplog.at_level(logging.INFO, logger="guarded"):
            if label in LATE:
                assert await target.open() == waiting + 1
                assert len(await target.entries()) == waiting  # the read meets it
            else:
                assert await target.open() == waiting
            stats = await target.stats()
            assert (stats.depth, stats.parked, stats.quarantined, stats.quarantined_total) == (
                waiting,
                parked,
                1,
                1,
            )
            assert sample(registry, "guarded_deadletter_quarantined_total") == 1
            assert len(await target.entries()) == waiting
            assert len(await target.parked()) == parked
            events = await target.pending_for_scope("save_event", "t")
            assert len(events) == (3 if label in PENDING_DAMAGE else 4)
            memory = await target.latest_for_key(MEMORY, "k")
            assert (memory is None) == (label in KEY_DAMAGE)
            (row,) = await target.quarantined(with_raw=True)
            assert reason in row.reason
            assert row.source == ("parked" if label in PARKED_DAMAGE else "pending")
            assert row.raw  # the row as stored
            assert (await target.quarantined())[0].raw == ()
            records = [
                record
                for record in caplog.records
                if getattr(record, "event", None) == "deadletter_quarantined"
            ]
            assert len(records) == 1
            no_secret(caplog.records)

            store = InMemoryStateStore()
            send, send_bulk = store_sender(store)
            summary = await target.replay(send, send_bulk=send_bulk, rate=1_000_000, target=store)
            assert (summary.replayed, summary.remaining, summary.stopped_early) == (waiting, 0, False)
            assert target.is_empty
            history = [item.payload["i"] for item in await store.load_history("t")]
            assert history == (GOOD_EVENTS if label in PENDING_DAMAGE else [0, 1, 2, 3])
    finally:
        await target.aclose()
    totals = await asyncio.to_thread(read_totals, path)
    assert (totals.pending, totals.parked, totals.quarantined) == (0, parked, 1)


def read_totals(path: Path) -> SpillTotals:
    reader = SpillFile.open_read_only(str(path))
    try:
        return reader.totals()
    finally:
        reader.close()


@pytest.mark.asyncio
async def test_rows_damaged_while_the_file_is_open_are_set_aside_by_whichever_read_meets_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dlq.sqlite"
    target = buffer(path, max_memory_entries=1)  # reads go to the file (memory keeps the newest)
    try:
        await fill(target)
        spill = target._spill
        assert spill is not None
        spill._db.execute("UPDATE pending SET call = CAST(x'ff' AS TEXT) WHERE seq = 2")
        spill._db.execute("UPDATE pending SET stamp = 'x' WHERE seq = 3")
        spill._db.execute(f"UPDATE pending SET call = CAST(x'{LATE_CALL.hex()}' AS TEXT) WHERE seq = 4")
        assert len(await target.pending_for_scope("save_event", "t")) == 1  # for_scope
        assert target.depth == 3
        spill._db.execute("UPDATE pending SET call = 'oops' WHERE seq = 5")
        assert await target.latest_for_key(MEMORY, "k") is None  # fetch
        assert target.depth == 2
        assert [entry.seq for entry in await target.entries()] == [1, 6]  # page
        # A row whose key is damaged after it was indexed is still deleted when superseded.
        spill._db.execute("UPDATE pending SET key = '{', size = 'x' WHERE seq = 6")
        assert await target.supersede(MEMORY, "j", 100) == 1
        assert target.depth == 1
        sent: list[str] = []

        async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
            sent.append(method)
            return ReplayResult.OK

        summary = await target.replay(send, rate=1_000_000)
        assert (summary.replayed, summary.remaining) == (1, 0)
        assert target.is_empty
        stats = await target.stats()
        assert (stats.quarantined, stats.quarantined_total) == (4, 4)
    finally:
        await target.aclose()


@pytest.mark.asyncio
async def test_the_count_of_waiting_writes_heals_when_the_file_holds_none(tmp_path: Path) -> None:
    """A row deleted behind the buffer's back (not even damaged): a pass that finds the file empty
    counts again, so a drain is not stuck waiting for writes that are gone."""
    target = buffer(tmp_path / "dlq.sqlite")
    try:
        await fill(target)
        spill = target._spill
        assert spill is not None
        spill._db.execute("DELETE FROM pending")
        target._memory.clear()

        async def send(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
            raise AssertionError("nothing to send")

        await target.replay(send, rate=1_000_000)
        assert target.is_empty
    finally:
        await target.aclose()


# --- the spill file itself ------------------------------------------------------------------------


@pytest.mark.parametrize("label", list(ALL_DAMAGE))
def test_a_read_only_open_skips_damaged_rows_in_every_read(tmp_path: Path, label: str) -> None:
    statements, reason = ALL_DAMAGE[label]
    path = tmp_path / "dlq.sqlite"
    prepare(path, statements)
    waiting, parked = expected(label)
    reader = SpillFile.open_read_only(str(path))
    try:
        totals = reader.totals()
        assert (totals.pending, totals.parked, totals.quarantined) == (waiting, parked, 1)
        assert totals.oldest is not None
        assert len(reader.page(0, None)) == waiting
        assert len(reader.page(0, 2)) == 2
        assert len(reader.fetch([1, 2, 3, 4, 5, 6])) == waiting
        assert len(reader.for_scope("save_event", "t")) == (3 if label in PENDING_DAMAGE else 4)
        assert len(reader.parked()) == parked
        assert sum(count for _, count, _ in reader.by_method()) == waiting
        assert len(list(reader.index_rows())) == waiting
        assert reader.max_seq() == 7
        (row,) = reader.quarantined()
        assert row.id is None  # still in its table: a read-only open moves nothing
        assert reason in row.reason
    finally:
        reader.close()
    reader = SpillFile.open_read_only(str(path))  # nothing was written
    try:
        assert reader.totals().quarantined == 1
    finally:
        reader.close()


def test_a_writer_moves_damaged_rows_with_their_raw_bytes(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    raw = LATE_CALL
    prepare(path, [f"UPDATE pending SET call = CAST(x'{raw.hex()}' AS TEXT) WHERE seq = 2"])
    spill = SpillFile.open(str(path))
    try:
        assert [row.seq for row in spill.index_rows()] == [1, 2, 3, 4, 5, 6]  # metadata is fine
        assert [entry.seq for entry in spill.page(0, None)] == [1, 3, 4, 5, 6]  # the call is not
        (found,) = spill.take_set_aside()
        assert (found.seq, found.table, found.counted, found.method) == (2, "pending", True, "save_event")
        assert spill.take_set_aside() == []
        (row,) = spill.quarantined()
        assert row.id is not None
        assert ("call", "text", raw) in row.raw
        assert ("seq", "integer", 2) in row.raw
        assert spill.totals().pending == 5
        assert spill.totals().quarantined == 1
        # Deleting rows that were damaged after they were read never raises either.
        spill._db.execute("UPDATE pending SET key = CAST(x'ff' AS TEXT), size = 'x' WHERE seq = 5")
        (deleted,) = spill.delete([5]).deleted
        assert deleted.damaged
        assert deleted.seq == 5
        assert spill.purge(pending=False, parked=False, quarantined=True) == 1
        assert spill.quarantined() == []
    finally:
        spill.close()


def test_a_layout_2_file_gets_its_quarantine_table_when_opened_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    prepare(path, ["DROP TABLE quarantine", "UPDATE meta SET value = '2' WHERE name = 'schema_version'"])
    reader = SpillFile.open_read_only(str(path))  # a layout 2 file reads as before
    try:
        assert reader.totals().pending == 6
        assert reader.quarantined() == []
    finally:
        reader.close()
    damage(path, ["UPDATE pending SET stamp = 'x' WHERE seq = 1"])
    spill = SpillFile.open(str(path))
    try:
        assert len(list(spill.index_rows())) == 5
        assert len(spill.quarantined()) == 1
    finally:
        spill.close()
    with sqlite3.connect(str(path)) as db:
        (version,) = db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    assert version == str(SCHEMA_VERSION) == "3"


def test_damaged_meta_values_set_the_file_aside_instead_of_raising(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    prepare(path, ["UPDATE meta SET value = 'many' WHERE name = 'generation'"])

    async def run() -> tuple[int, str | None]:
        target = buffer(path)
        try:
            return await target.open(), target.spill_path
        finally:
            await target.aclose()

    waiting, claimed = asyncio.run(run())
    assert waiting == 0  # the damaged file was renamed aside and a fresh one started
    assert claimed == str(path)
    assert list(tmp_path.glob("dlq.sqlite.corrupt-*"))


# --- adoption ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_orphan_with_damaged_rows_is_adopted_and_its_damaged_rows_kept(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    registry = CollectorRegistry()

    def make() -> DeadLetterBuffer:
        return DeadLetterBuffer(config(path), store_name="primary", registry=registry, target="db")

    holder = make()
    await holder.put("save_event", (event("holder", 0),), {}, scope="holder", stamp=0, error="x")
    filler = make()
    await fill(filler)
    orphan = filler.spill_path
    assert orphan is not None
    assert orphan != str(path)
    await filler.aclose()
    await holder.aclose()
    await asyncio.to_thread(
        damage,
        Path(orphan),
        [
            "UPDATE pending SET call = CAST(x'ff' AS TEXT) WHERE seq = 2",  # met only when calls are read
            "UPDATE pending SET key = '{' WHERE seq = 5",
            "UPDATE parked SET parked_at = 'x' WHERE seq = 7",
        ],
    )
    survivor = make()
    try:
        assert await survivor.open() == 1 + 4  # the holder's event, and what the orphan held readable
        assert not await asyncio.to_thread(os.path.exists, orphan)
        assert len(await survivor.pending_for_scope("save_event", "t")) == 3
        assert await survivor.latest_for_key(MEMORY, "j") is not None
        stats = await survivor.stats()
        assert (stats.depth, stats.parked, stats.quarantined, stats.quarantined_total) == (5, 0, 3, 3)
        rows = await survivor.quarantined(with_raw=True)
        assert sorted(row.seq or 0 for row in rows) == [2, 5, 7]  # their seqs in the orphan
        assert sample(registry, "guarded_deadletter_quarantined_total") == 3
    finally:
        await survivor.aclose()


# --- guard() ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("label", ["call not JSON", "stamp not a number", "key not JSON", "method NULL"])
async def test_async_with_guard_over_a_damaged_file_neither_raises_nor_loses_the_good_writes(
    tmp_path: Path, label: str
) -> None:
    statements, _ = ALL_DAMAGE[label]
    path = tmp_path / "dlq.sqlite"
    await written(path, statements)
    inner = InMemoryStateStore()
    registry = CollectorRegistry()
    guard_config = GuardConfig(dead_letter=DeadLetterConfig(path=str(path)))
    # A faulty store with no faults stands for a database: it keeps its data across processes.
    async with guard(FaultyStore(inner), name="primary", registry=registry, config=guard_config) as store:
        assert await store.load_memory_state("j") == {"v": 1}  # held, read back
        buffer_ = controller(store).dead_letters
        assert buffer_ is not None
        assert (await buffer_.stats()).quarantined == 1
    history = [item.payload["i"] for item in await inner.load_history("t")]
    assert history == (GOOD_EVENTS if label in PENDING_DAMAGE else [0, 1, 2, 3])
    assert await inner.load_memory_state("j") == {"v": 1}
    assert sample(registry, "guarded_deadletter_quarantined_total") == 1


# --- the CLI ---------------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("label", list(ALL_DAMAGE))
def test_the_cli_lists_and_counts_around_damaged_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str
) -> None:
    statements, reason = ALL_DAMAGE[label]
    path = tmp_path / "dlq.sqlite"
    prepare(path, statements)
    waiting, parked = expected(label)
    code, out, err = cli(capsys, "dlq", "list", "--path", str(path))
    assert code == 0
    assert f"{waiting} of {waiting} pending write(s)" in out
    assert "could not be read" in err
    assert "Traceback" not in out + err
    code, out, _ = cli(capsys, "dlq", "list", "--path", str(path), "--parked", "--json")
    assert code == 0
    assert len(json.loads(out)["entries"]) == parked
    code, out, _ = cli(capsys, "dlq", "stats", "--path", str(path), "--json")
    assert code == 0
    document = json.loads(out)
    assert (document["pending"], document["parked"], document["quarantined"]) == (waiting, parked, 1)
    code, out, _ = cli(capsys, "dlq", "stats", "--path", str(path))
    assert code == 0
    assert "quarantined: 1" in out
    for argv in (["--json"], [], ["--json", "--show-payload"], ["--show-payload"]):
        code, out, err = cli(capsys, "dlq", "list", "--path", str(path), "--quarantined", *argv)
        assert code == 0, err
        assert reason.split("'")[1] in out  # the column's name
        # Raw bytes are payload: every damaged row but one holds the secret somewhere.
        assert (SECRET in out) == (
            "--show-payload" in argv and label not in ("call a JSON list", "parked call not UTF-8")
        )
    code, out, _ = cli(
        capsys, "dlq", "list", "--path", str(path), "--quarantined", "--json", "--show-payload"
    )
    (entry,) = json.loads(out)["entries"]
    assert entry["moved"] is False  # list reads the file as it is
    assert entry["raw"]["seq"]["type"] in ("integer", "null", "text")


def test_cli_replay_sets_damaged_rows_aside_and_delivers_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.sqlite"
    prepare(
        path,
        [
            "UPDATE pending SET call = 'not json' WHERE seq = 2",
            "UPDATE pending SET method = 'no_such_method' WHERE seq = 6",
        ],
    )
    factories.BUILT.clear()
    code, out, err = cli(
        capsys,
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "tests.deadletter.factories:memory_store",
        "--json",
    )
    document = json.loads(out)
    assert (document["replayed"], document["quarantined"], document["remaining"]) == (4, 1, 0), err
    assert document["parked"] == 1  # the unknown method
    assert code == 1  # parked writes are left
    (store,) = factories.BUILT
    assert [item.payload["i"] for item in asyncio.run(store.load_history("t"))] == GOOD_EVENTS
    code, out, _ = cli(capsys, "dlq", "list", "--path", str(path), "--parked", "--json")
    reasons = [entry["reason"] for entry in json.loads(out)["entries"]]
    assert "the store has no method 'no_such_method'" in reasons
    code, out, _ = cli(capsys, "dlq", "list", "--path", str(path), "--quarantined", "--json")
    (entry,) = json.loads(out)["entries"]
    assert (entry["moved"], entry["seq"], entry["source"]) == (True, 2, "pending")
    code, out, _ = cli(capsys, "dlq", "purge", "--path", str(path), "--quarantined", "--yes", "--json")
    assert (code, json.loads(out)["purged"]) == (0, 1)
    code, out, _ = cli(capsys, "dlq", "list", "--path", str(path), "--quarantined")
    assert "no quarantined rows" in out
