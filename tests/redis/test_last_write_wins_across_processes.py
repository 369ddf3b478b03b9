"""Last write wins across two processes on a real Redis, under clock skew.

The clock-skew test of the PostgreSQL suite (tests/postgres/test_clock_skew.py) on a Redis store:
two real worker processes (:mod:`tests.redis._skewed_redis_worker`), one with its clock ahead (5 ms,
50 ms, 5 s; zero as the control), write the same memory keys and trajectories alternately, each
write made after the other worker's returned: every write answered ``ok`` is in Redis right after
it returned, and every key ends with the causally last value. The cluster suite runs it on a
cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from guarded.testing.redis import RedisServer
from tests.postgres.test_clock_skew import Worker, assert_alternating_writes_all_kept
from tests.redis._processes import open_store

SKEWS = pytest.mark.parametrize("skew", [0.0, 0.005, 0.05, 5.0], ids=["no-skew", "5ms", "50ms", "5s"])
MODULE = "tests.redis._skewed_redis_worker"


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(timeout=30)


async def assert_last_write_wins_across_two_processes(
    url: str, prefix: str, skew: float, workers: list[Worker], tmp_path: Path
) -> None:
    reader = await open_store(url, prefix)
    try:
        workers.append(Worker(url, prefix, skew, "ahead", tmp_path / "ahead.sqlite", module=MODULE))
        workers.append(Worker(url, prefix, 0.0, "behind", tmp_path / "behind.sqlite", module=MODULE))
        await assert_alternating_writes_all_kept(workers[0], workers[1], reader, skew)
    finally:
        await reader.close()


@pytest.mark.asyncio
@SKEWS
async def test_a_clock_ahead_never_drops_another_processes_acknowledged_write(
    skew: float, redis_server: RedisServer, key_prefix: str, workers: list[Worker], tmp_path: Path
) -> None:
    await assert_last_write_wins_across_two_processes(redis_server.url, key_prefix, skew, workers, tmp_path)
