"""At the spill file's limits a write is refused, never acknowledged and forgotten: the spill file at
its byte cap, a full disk (a small tmpfs, then SIGKILL of the writing process), and more held writes
than the memory caps. Every write is either refused (strict mode raises ``WriteNotKeptError``) or,
once the database is back and a guard drained, in PostgreSQL. Own server (it is stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import DeadLetterConfig
from guarded.errors import WriteNotKeptError
from guarded.guard import controller, guard
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres._outages import differences, drain_all, open_store, write_call

from ._support import Worker, eventually
from ._worker import MixedLedger, describe, fast_config, landed_differences, read_back_mixed

WRITERS, PER_WRITER = 10, 300
"""3,000 writes of every write method during the outage."""


def refusals(worker: Worker) -> list[str]:
    """The worker's writes that raised: every one must be a refusal."""
    refused = [line for line in worker.errors if "WriteNotKeptError" in line]
    assert refused == worker.errors, f"writes failed otherwise than refused: {worker.errors[:3]}"
    return refused


async def write_through_an_outage(
    server: EmbeddedPostgres, schema_name: str, state_home: Path, tmp_path: Path, *options: str
) -> Worker:
    """With the server down, a worker process (strict mode, short timeouts, the spill file and cap
    given by ``options``) makes every write of :data:`WRITERS` writers, then holds; it is killed."""
    await asyncio.to_thread(server.stop)
    worker = Worker(
        [
            "ack",
            "--dsn",
            server.dsn,
            "--schema",
            schema_name,
            "--writers",
            str(WRITERS),
            "--per-writer",
            str(PER_WRITER),
            "--fast",
            "--lazy",
            "--strict",
            "--hold",
            *options,
        ],
        state_home=state_home,
        log=tmp_path / "worker.log",
    )
    try:
        await eventually(lambda: worker.has("H") or worker.exited(), what="every write answered")
        assert not worker.exited(), worker.stderr()
    finally:
        worker.kill()  # SIGKILL: what it acknowledged must be on disk
    assert worker.acked + len(worker.errors) == WRITERS * PER_WRITER
    return worker


async def drain_and_compare(server: EmbeddedPostgres, schema_name: str, spill: Path, worker: Worker) -> None:
    """The server back, a guard of this process on the same spill path adopts the killed worker's
    file and drains it: PostgreSQL holds exactly the acknowledged writes."""
    await asyncio.to_thread(server.start)
    store = guard(
        await open_store(server.dsn, schema_name),
        registry=CollectorRegistry(),
        config=fast_config(str(spill)),
    )
    try:
        left = await drain_all(store, seconds=120)
    finally:
        await controller(store).aclose()
    assert left == 0
    acked, at_most = worker.ledgers(range(WRITERS))
    found = await read_back_mixed(server.dsn, schema_name)
    problems = landed_differences(acked, at_most, found)
    assert not problems, f"{worker.acked} acknowledged, {len(worker.errors)} refused; " + describe(problems)


@pytest.mark.asyncio
async def test_at_the_spill_cap_new_writes_are_refused_and_none_acknowledged_is_evicted(
    server: EmbeddedPostgres, schema_name: str, state_home: Path, tmp_path: Path
) -> None:
    """``max_disk_bytes=200 KB`` during an outage: the file fills, then writes are refused; the
    oldest acknowledged writes are not deleted to make room."""
    spill = tmp_path / "spill" / "dlq.sqlite"
    spill.parent.mkdir()
    worker = await write_through_an_outage(
        server, schema_name, state_home, tmp_path, "--spill", str(spill), "--max-disk-bytes", "200000"
    )
    assert worker.acked > 0
    assert refusals(worker), "3,000 writes cannot fit in 200 KB: some must be refused"
    await drain_and_compare(server, schema_name, spill, worker)


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (the test runs as root, in CI too), unmounted afterwards."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.asyncio
async def test_on_a_full_disk_writes_are_refused_and_a_sigkill_loses_nothing_acknowledged(
    server: EmbeddedPostgres, schema_name: str, state_home: Path, tmp_path: Path
) -> None:
    """The spill file on a 256 KiB tmpfs: the disk fills mid-outage, then writes are refused rather
    than held in memory only; the worker is SIGKILLed. The operator then grows the disk and a later
    guard drains: every acknowledged write is in PostgreSQL."""
    assert os.geteuid() == 0, "mounting a tmpfs needs root (as in CI)"
    with small_tmpfs(tmp_path) as disk:
        spill = disk / "dlq.sqlite"
        worker = await write_through_an_outage(
            server, schema_name, state_home, tmp_path, "--spill", str(spill)
        )
        assert worker.acked > 0
        assert refusals(worker), "3,000 writes cannot fit in 256 KiB: some must be refused"
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,size=16m", str(disk)], check=True)
        await drain_and_compare(server, schema_name, spill, worker)


async def append_through_an_outage(
    store: object, ledger: MixedLedger, *, writers: int, per_writer: int
) -> None:
    """``writers`` concurrent writers, ``per_writer`` appends each: events (batched, group commit)
    and steering (written alone) in turn; appends never coalesce, so every one is held."""

    async def one(writer: int) -> None:
        for number in range(per_writer):
            _, make_call, record = write_call(writer, 8 * (number // 2) + (0 if number % 2 == 0 else 7))
            try:
                await make_call(store)
            except Exception as exc:
                ledger.errors.append(exc)
            else:
                record(ledger)
            finally:
                ledger.calls += 1

    await asyncio.gather(*(one(writer) for writer in range(writers)))


@pytest.mark.asyncio
@pytest.mark.parametrize("spilled", [True, False], ids=["spill_file", "memory_only"])
async def test_past_the_memory_cap_none_acknowledged_is_lost(
    spilled: bool, server: EmbeddedPostgres, schema_name: str, tmp_path: Path
) -> None:
    """15,000 appends held during an outage, past the default memory cap of 10,000 entries. With a
    spill file the memory copies are a cache of the file, and every write is kept; memory only, the
    writes past the cap are refused instead of dropping the oldest."""
    spill = tmp_path / "spill" / "dlq.sqlite"
    config = fast_config(str(spill), strict=True)
    if not spilled:
        memory_only = config.dead_letter.model_copy(update={"path": None})
        config = config.model_copy(update={"dead_letter": memory_only})
    assert config.dead_letter.max_memory_entries == DeadLetterConfig().max_memory_entries == 10_000
    store = guard(await open_store(server.dsn, schema_name), registry=CollectorRegistry(), config=config)
    ledger = MixedLedger()
    try:
        await asyncio.to_thread(server.stop)
        await append_through_an_outage(store, ledger, writers=50, per_writer=300)
        await asyncio.to_thread(server.start)
        left = await drain_all(store, seconds=120)
    finally:
        await controller(store).aclose()
    refused = [exc for exc in ledger.errors if isinstance(exc, WriteNotKeptError)]
    assert refused == ledger.errors, ledger.errors[:3]
    if spilled:
        assert refused == []
    else:
        assert len(refused) == 5_000
    assert left == 0
    acknowledged = ledger.calls - len(refused)
    problems = differences(ledger, await read_back_mixed(server.dsn, schema_name))
    assert not problems, f"{acknowledged} acknowledged, {len(refused)} refused; " + describe(problems)
