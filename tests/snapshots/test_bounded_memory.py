"""Capture, save, load and restore stream: the memory they hold does not grow with the snapshot.

Python allocations are measured with ``tracemalloc`` (peak above the start) while 6,000 and then
60,000 events (about 9 MB of JSON) go through each stage (build a content, save it, load and read
it, restore it into a store that keeps nothing): ten times the events may not cost more than a
quarter more memory plus 1 MB. (The constant part, about 15 MB, is mostly the ten sections' gzip
streams and one batch of lines per section.)

``tracemalloc`` counts every thread of the process, so the stages run in a fresh interpreter of
their own (``python -m tests.snapshots.test_bounded_memory``): in the whole suite, threads other
tests left running (a guard's spill writer, an executor) allocated during the measurement.

That interpreter runs the work the stages hand to threads (``asyncio.to_thread``) inline, in the
event loop's thread: the same code, measured alone. With worker threads, on a loaded machine, a
stage's peak came out up to about 4.5 MB higher now and then, at 6,000 events as at 60,000: what the
hand-off between the loop and a descheduled worker keeps alive meanwhile, which does not grow with
the events. Inline, the peaks are the same in every run, loaded or not.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from guarded.snapshots import FileSnapshotStore, restore
from guarded.testing.snapshot_contract import make_content

SMALL, LARGE = 6_000, 60_000
T = TypeVar("T")


async def _peak(step: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = await step()
        return result, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


class _Sink:
    """A StateStore that counts the events it is given and keeps none."""

    def __init__(self) -> None:
        self.count = 0

    async def save_event(self, event: Any) -> None:
        self.count += 1

    async def save_events(self, events: Sequence[Any]) -> None:
        self.count += len(events)

    async def load_history(self, trace_id: str) -> list[Any]:
        return []

    async def save_remote_binding(self, binding: Any) -> None:
        return None


async def _stages(tmp_path: Path, events: int) -> dict[str, int]:
    content, building = await _peak(lambda: make_content("s-big", events=events, updates=0))
    store = FileSnapshotStore(tmp_path / str(events))
    saved, saving = await _peak(lambda: store.save(content))
    await content.aclose()

    async def read_all() -> int:
        async with await store.load(saved.id) as loaded:
            return sum([len(batch) async for batch in loaded.lines("events")])

    count, loading = await _peak(read_all)
    assert count == events
    sink = _Sink()

    async def restore_all() -> None:
        async with await store.load(saved.id) as loaded:
            await restore(loaded, sink, skip_unsupported=True)

    _, restoring = await _peak(restore_all)
    assert sink.count == events
    return {"build": building, "save": saving, "load": loading, "restore": restoring}


REPO = Path(__file__).resolve().parents[2]


async def _measure(directory: Path) -> dict[str, dict[str, int]]:
    await _stages(directory, 100)  # imports and caches
    return {"small": await _stages(directory, SMALL), "large": await _stages(directory, LARGE)}


def test_save_load_and_restore_hold_bounded_memory(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.snapshots.test_bounded_memory", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    small, large = measured["small"], measured["large"]
    grown = {stage: large[stage] - small[stage] for stage in small}
    assert all(large[stage] < small[stage] * 1.25 + 1024 * 1024 for stage in small), (small, large, grown)


class _Inline(ThreadPoolExecutor):
    """Runs what is handed to it at once, in the caller's thread (see the module docs)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)
        return done


async def _measure_inline(directory: Path) -> dict[str, dict[str, int]]:
    asyncio.get_running_loop().set_default_executor(_Inline())
    return await _measure(directory)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir=sys.argv[1] if len(sys.argv) > 1 else None) as scratch:
        print(json.dumps(asyncio.run(_measure_inline(Path(scratch)))))
