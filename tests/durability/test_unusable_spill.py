"""A spill file that cannot be used never costs a write the database can take: locked by another
process, corrupt, on a full disk, or under a regular file. A healthy database still receives every
write; during an outage a write is held where a file can take it (a slot file of the guard's own
when the configured one is locked, a fresh file beside a corrupt one) and delivered once the
database is back, and refused (``WriteNotKeptError``) where none can (a full disk, a path under a
regular file), never held in memory only; ``aclose()`` does not raise. Own server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import DeadLetterConfig, GuardConfig
from guarded.errors import WriteNotKeptError
from guarded.guard import controller, guard
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres._outages import differences, drain_all, open_store

from ._support import REPO, pending_on_disk
from ._worker import MixedLedger, describe, read_back_mixed, run_mixed

WRITERS, PER_PHASE = 10, 27
"""Each phase: 10 writers, 27 writes each (three of every write method)."""

HOLDER = """
import fcntl, os, sys, time
handles = []
for name in sys.argv[1:]:
    fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handles.append(fd)
print("locked", flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def locked_by_another_process(tmp_path: Path) -> Iterator[Path]:
    """The configured spill file's lock held by another live process (its ``flock`` on
    ``<path>.lock``, the lock file a writer of the path takes, and on ``<path>`` itself)."""
    path = tmp_path / "spill" / "dlq.sqlite"
    path.parent.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"{path}.lock", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield path
    finally:
        holder.kill()
        holder.wait(timeout=30)


@contextlib.contextmanager
def corrupt(tmp_path: Path) -> Iterator[Path]:
    """Garbage bytes where the spill file should be."""
    path = tmp_path / "spill" / "dlq.sqlite"
    path.parent.mkdir()
    path.write_bytes(b"not a database\x00" + random.Random(12).randbytes(16 * 1024))
    yield path


@contextlib.contextmanager
def on_a_full_disk(tmp_path: Path) -> Iterator[Path]:
    """The spill file's directory on a small tmpfs filled to the last byte (needs root to mount)."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs mount, and mounting needs root")
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full disk: {mounted.stderr.strip()}")
    try:
        filler = os.open(mount_point / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for block in (65536, 4096, 512, 1):  # to the last byte
                with contextlib.suppress(OSError):
                    while True:
                        os.write(filler, b"\0" * block)
        finally:
            os.close(filler)
        yield mount_point / "dlq.sqlite"
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


@contextlib.contextmanager
def under_a_regular_file(tmp_path: Path) -> Iterator[Path]:
    """A path whose parent directory is a regular file."""
    parent = tmp_path / "not-a-directory"
    parent.write_text("a file\n")
    yield parent / "dlq.sqlite"


REFUSING = frozenset({"full_disk", "under_a_file"})
"""The cases where no spill file can take a write: every write of the outage is refused."""

CASES = {
    "locked": locked_by_another_process,
    "corrupt": corrupt,
    "full_disk": on_a_full_disk,
    "under_a_file": under_a_regular_file,
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(CASES))
async def test_an_unusable_spill_file_never_costs_a_write(
    case: str, server: EmbeddedPostgres, schema_name: str, tmp_path: Path
) -> None:
    with CASES[case](tmp_path) as spill:
        config = GuardConfig(dead_letter=DeadLetterConfig(path=str(spill)))
        store = guard(await open_store(server.dsn, schema_name), registry=CollectorRegistry(), config=config)
        ledger = MixedLedger()
        closed = False
        try:
            # A healthy database receives every write (flush: a no-op when each write waits for its
            # commit, and it keeps this check about the spill file whatever the batching).
            await run_mixed(store, ledger, writers=WRITERS, per_writer=PER_PHASE)
            await controller(store).flush()
            problems = differences(ledger, await read_back_mixed(server.dsn, schema_name))
            assert not problems, "healthy database: " + describe(problems)

            # An outage: a write is acknowledged once a spill file holds it, else refused.
            await asyncio.to_thread(server.stop)
            await run_mixed(store, ledger, writers=WRITERS, per_writer=PER_PHASE, start=PER_PHASE)
            await controller(store).flush()
            refused = [error for error in ledger.errors if isinstance(error, WriteNotKeptError)]
            assert refused == ledger.errors
            held = controller(store).dead_letters
            assert held is not None
            assert held.memory_only == 0
            if case in REFUSING:
                assert len(refused) == WRITERS * PER_PHASE
            else:
                assert refused == []
            if case == "locked":
                # Another process holds the configured file: the guard claims a slot file of its own
                # beside it, and what it holds is on disk there.
                buffer = controller(store).dead_letters
                assert buffer is not None
                assert buffer.depth > 0
                assert await asyncio.to_thread(pending_on_disk, spill.parent) == buffer.depth
            await asyncio.to_thread(server.start)
            left = await drain_all(store, seconds=60)
            try:
                await controller(store).aclose()
            except Exception as exc:
                pytest.fail(f"aclose() raised {exc!r}")
            closed = True
        finally:
            if not closed:
                with contextlib.suppress(Exception):
                    await controller(store).aclose()

    assert left == 0
    problems = differences(ledger, await read_back_mixed(server.dsn, schema_name))
    assert not problems, describe(problems)
