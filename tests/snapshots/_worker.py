"""Processes for the file backend's crash and concurrency tests: ``python -m tests.snapshots._worker``.

* ``killed <root> <spool> <moment>``: saves a snapshot and, at ``moment`` of the save (``sections``:
  while a section is being written; ``blobs``: while a blob is being copied), prints one JSON line
  and waits to be SIGKILLed.
* ``saver <root> <label> <count>``: saves ``count`` snapshots sharing a blob, prints their ids.
* ``collector <root> <seconds>``: runs ``gc`` in a loop for that long.
* ``held <root> <spool>``: a guarded save (guard name ``killed``) while the backend refuses every
  call: held; prints one JSON line (id, content hash) and waits to be SIGKILLed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator

from guarded.snapshots import FileSnapshotStore, Snapshot
from guarded.snapshots.content import SpooledSnapshot
from guarded.testing.snapshot_contract import make_content


class _Stalling:
    """A content that announces itself and stalls at one moment of a save (not a DirectoryContent:
    blobs are read through ``read_blob``)."""

    def __init__(self, inner: SpooledSnapshot, moment: str) -> None:
        self.inner = inner
        self.moment = moment

    @property
    def snapshot(self) -> Snapshot:
        return self.inner.snapshot

    def _stall(self) -> None:
        print(json.dumps({"id": self.snapshot.id, "moment": self.moment}), flush=True)
        time.sleep(120)

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        async for batch in self.inner.lines(section):
            yield batch
            if self.moment == "sections" and section == "tasks":
                self._stall()

    async def read_blob(self, digest: str) -> bytes:
        if self.moment == "blobs":
            self._stall()
        return await self.inner.read_blob(digest)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def killed(root: str, spool: str, moment: str) -> None:
    tempfile.tempdir = spool  # the content's spool dies with the process: keep it in the test's directory
    content = await make_content("s-killed", events=5000, blobs=(b"x" * 100_000,))
    await FileSnapshotStore(root).save(_Stalling(content, moment))


async def saver(root: str, label: str, count: int) -> None:
    store = FileSnapshotStore(root)
    ids = []
    for index in range(count):
        content = await make_content(f"s-{label}", blobs=(b"shared" * 1000, f"{label}-{index}".encode()))
        async with content:
            ids.append((await store.save(content)).id)
    print(json.dumps(ids), flush=True)


async def collector(root: str, seconds: float) -> None:
    store = FileSnapshotStore(root)
    deadline = time.monotonic() + seconds
    runs = 0
    while time.monotonic() < deadline:
        await store.gc()
        runs += 1
    print(json.dumps({"runs": runs}), flush=True)


async def held(root: str, spool: str) -> None:
    from prometheus_client import CollectorRegistry

    from guarded import guard
    from guarded.testing import Fault, FaultPlan, FaultyStore

    os.makedirs(spool, exist_ok=True)
    tempfile.tempdir = spool  # the content's spool dies with the process: keep it in the test's directory
    down = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
    guarded = guard(
        FaultyStore(FileSnapshotStore(root), down),
        name="killed",
        registry=CollectorRegistry(),
        timeout=0.5,
        retries=0,
    )
    async with guarded:  # type: ignore[attr-defined]
        content = await make_content("s-killed", snapshot_id="killed-1", events=500, blobs=(b"k" * 50_000,))
        saved = await guarded.save(content)  # type: ignore[attr-defined]
        print(json.dumps({"id": saved.id, "content_hash": saved.content_hash}), flush=True)
        await asyncio.sleep(120)  # SIGKILLed here: the guard is never closed


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "killed":
        asyncio.run(killed(args[0], args[1], args[2]))
    elif mode == "saver":
        asyncio.run(saver(args[0], args[1], int(args[2])))
    elif mode == "collector":
        asyncio.run(collector(args[0], float(args[1])))
    elif mode == "held":
        asyncio.run(held(args[0], args[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")
