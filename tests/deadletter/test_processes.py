"""Real processes on one spill path: distinct slots, no crash, a killed holder's writes adopted and
replayed exactly once, and never by a process of another backend target."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer, SpillFile, store_sender

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 60.0
"""Seconds a worker may take to start on a loaded machine."""

pytestmark = pytest.mark.asyncio


class Worker:
    """A ``tests.deadletter.worker`` process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), READY_TIMEOUT)
        assert raw, "the worker ended without answering"
        return json.loads(raw)  # type: ignore[no-any-return]

    async def tell(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        await self.process.stdin.drain()

    async def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        assert await asyncio.wait_for(self.process.wait(), READY_TIMEOUT) == -signal.SIGKILL

    async def finish(self) -> str:
        """Wait for a clean exit; returns what it wrote to stderr."""
        assert self.process.stderr is not None
        err = await asyncio.wait_for(self.process.stderr.read(), READY_TIMEOUT)
        assert await asyncio.wait_for(self.process.wait(), READY_TIMEOUT) == 0, err.decode()
        return err.decode()


@asynccontextmanager
async def workers() -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    try:
        yield started
    finally:
        for worker in started:
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()


async def spawn(started: list[Worker], *args: str) -> Worker:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.deadletter.worker",
        *args,
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    worker = Worker(process)
    started.append(worker)
    return worker


def exists(path: str) -> bool:
    return os.path.exists(path)


def pending_scopes(path: str) -> list[str | None]:
    reader = SpillFile.open_read_only(path)
    try:
        return [entry.scope for entry in reader.page(0, None)]
    finally:
        reader.close()


async def test_two_processes_on_one_base_path_both_run(tmp_path: Path) -> None:
    base = str(tmp_path / "dlq.sqlite")
    async with workers() as started:
        first, second = await asyncio.gather(
            spawn(started, "hold", "--path", base, "--target", "db", "--trace", "a", "--events", "5"),
            spawn(started, "hold", "--path", base, "--target", "db", "--trace", "b", "--events", "5"),
        )
        answers = [await first.line(), await second.line()]
        assert sorted(answer["spill_path"] for answer in answers) == [base, base + ".1"]
        assert all(answer["depth"] == 10 and answer["available"] for answer in answers)
        for trace, answer in zip("ab", answers, strict=True):
            assert pending_scopes(answer["spill_path"]).count(trace) == 5
        for worker in (first, second):
            await worker.tell("close")
            assert (await worker.line())["closed"]
            err = await worker.finish()
            assert "Traceback" not in err
            assert "never retrieved" not in err


async def test_a_killed_holders_writes_are_adopted_and_replayed_once(tmp_path: Path) -> None:
    """Two holders are killed; two processes then start together. Each file is taken by exactly
    one of them (claimed or adopted under its lock), so every write is replayed exactly once."""
    base = str(tmp_path / "dlq.sqlite")
    async with workers() as started:
        holders = [
            await spawn(started, "hold", "--path", base, "--target", "db", "--trace", trace, "--events", "20")
            for trace in "ab"
        ]
        assert sorted([(await holder.line())["spill_path"] for holder in holders]) == [base, base + ".1"]
        for holder in holders:
            await holder.kill()
        replayers = await asyncio.gather(
            *(
                spawn(started, "replay", "--path", base, "--target", "db", "--traces", "a", "b")
                for _ in range(2)
            )
        )
        answers = [await replayer.line() for replayer in replayers]
        for replayer in replayers:
            await replayer.finish()
    events = [name for answer in answers for name in answer["events"]]
    assert sorted(events) == sorted(f"{trace}:{index}" for trace in "ab" for index in range(20))
    assert sum(answer["replayed"] for answer in answers) == 80  # 40 events and 40 memory states
    assert all(answer["remaining"] == 0 for answer in answers)


async def test_a_live_process_adopts_the_file_of_a_killed_one(tmp_path: Path) -> None:
    base = str(tmp_path / "dlq.sqlite")
    survivor = DeadLetterBuffer(
        DeadLetterConfig(path=base), store_name="worker", registry=CollectorRegistry(), target="db"
    )
    store = InMemoryStateStore()
    try:
        await survivor.put("save_memory_state", ("mine", {}), {}, key="mine", stamp=1, error="x")
        assert survivor.spill_path == base
        async with workers() as started:
            holder = await spawn(
                started, "hold", "--path", base, "--target", "db", "--trace", "k", "--events", "15"
            )
            assert (await holder.line())["spill_path"] == base + ".1"
            assert await survivor.adopt_orphans() == 0  # its owner is alive
            await holder.kill()
        assert await survivor.adopt_orphans() == 30
        assert not exists(base + ".1")
        send, send_bulk = store_sender(store)
        summary = await survivor.replay(send, send_bulk=send_bulk, rate=math.inf)
        assert (summary.replayed, summary.remaining) == (31, 0)
    finally:
        await survivor.aclose()
    history = await store.load_history("k")
    assert [item.payload["i"] for item in history] == list(range(15))
    assert await store.load_memory_state("k:m14") == {"v": 14}


async def test_a_killed_process_of_another_target_is_left_to_its_own(tmp_path: Path) -> None:
    base = str(tmp_path / "dlq.sqlite")
    async with workers() as started:
        holder = await spawn(
            started, "hold", "--path", base, "--target", "db-b", "--trace", "b", "--events", "4"
        )
        assert (await holder.line())["spill_path"] == base
        await holder.kill()
        other = await spawn(started, "replay", "--path", base, "--target", "db-a", "--traces", "b")
        answer = await other.line()
        await other.finish()
        assert (answer["waiting"], answer["replayed"], answer["events"]) == (0, 0, [])
        assert pending_scopes(base).count("b") == 4
        own = await spawn(started, "replay", "--path", base, "--target", "db-b", "--traces", "b")
        answer = await own.line()
        await own.finish()
    assert answer["waiting"] == 8
    assert sorted(answer["events"]) == sorted(f"b:{index}" for index in range(4))
