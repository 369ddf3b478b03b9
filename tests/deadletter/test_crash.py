"""Durability: what a killed process acknowledged is in its spill file; one writer per file."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.cli import main
from guarded.deadletter import SpillFile, store_sender
from tests.deadletter.support import buffer

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import asyncio, sys
from prometheus_client import CollectorRegistry
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer
from tests.deadletter.support import event

async def main():
    path, count = sys.argv[1], int(sys.argv[2])
    dlq = DeadLetterBuffer(DeadLetterConfig(path=path), store_name="crash", registry=CollectorRegistry())
    half = count // 2
    for i in range(half):
        await dlq.put("save_event", (event("t", i),), {}, scope="t", stamp=i, error="ConnectionError")
    await dlq.put_many([("save_event", (event("t", i),), {}, None, "t", i, "x") for i in range(half, count)])
    await dlq.put("save_memory_state", ("m", {"v": "old"}), {}, key="m", stamp=count, error="x")
    await dlq.put("save_memory_state", ("m", {"v": "new"}), {}, key="m", stamp=count + 1, error="x")
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""

COUNT = 200


def exists(name: str) -> bool:
    return os.path.exists(name)


@pytest.mark.asyncio
async def test_entries_acknowledged_before_sigkill_are_all_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "crash.db"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(path), str(COUNT), cwd=REPO, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), timeout=20)
        assert line.strip() == b"ready"

        beside = buffer(path)
        try:  # the child holds slot 0: a second process finds nothing it may take over
            assert await beside.open() == 0
            assert beside.spill_path is None
            assert beside.spill_available
        finally:
            await beside.aclose()
        code = await asyncio.get_running_loop().run_in_executor(
            None, main, ["dlq", "stats", "--path", str(path), "--json"]
        )
        assert code == 0
        assert f'"pending": {COUNT + 1}' in capsys.readouterr().out

        os.kill(child.pid, signal.SIGKILL)
        assert await asyncio.wait_for(child.wait(), timeout=10) == -signal.SIGKILL
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()

    recovered = buffer(path)
    store = InMemoryStateStore()
    try:
        assert await recovered.open() == COUNT + 1
        send, send_bulk = store_sender(store)
        summary = await recovered.replay(send, send_bulk=send_bulk, rate=1_000_000)
        assert (summary.replayed, summary.remaining) == (COUNT + 1, 0)
    finally:
        await recovered.aclose()
    history = await store.load_history("t")
    assert [item.payload["i"] for item in history] == list(range(COUNT))
    assert await store.load_memory_state("m") == {"v": "new"}
    reader = SpillFile.open_read_only(str(path))
    try:
        assert reader.totals().pending == 0
    finally:
        reader.close()


@pytest.mark.asyncio
async def test_a_second_buffer_on_a_locked_file_takes_the_next_slot(tmp_path: Path) -> None:
    path = tmp_path / "dlq.db"
    first = buffer(path)
    second = buffer(path)
    try:
        await first.put("save_memory_state", ("k", {}), {}, key="k", stamp=1, error="x")
        await second.put("save_memory_state", ("j", {}), {}, key="j", stamp=2, error="x")
        assert first.spill_path == str(path)
        assert second.spill_path == f"{path}.1"
        for name in (str(path), f"{path}.1"):
            reader = SpillFile.open_read_only(name)
            try:
                assert reader.totals().pending == 1
            finally:
                reader.close()
    finally:
        await first.aclose()
        await second.aclose()
    third = buffer(path)
    try:  # slot 0 is claimed, slot 1 adopted
        assert await third.open() == 2
        assert third.spill_path == str(path)
        assert not exists(f"{path}.1")
    finally:
        await third.aclose()
