"""The cross-process promises of the single-server suite, on a real Redis Cluster: two processes
resuming every pause at once deliver each once, a killed worker's older held saves never revive a
consumed pause, and last write wins across two processes with one clock ahead by 50 ms."""

from __future__ import annotations

from pathlib import Path

import pytest

from guarded.testing.redis_cluster import RedisCluster
from tests.postgres.test_clock_skew import Worker
from tests.redis.test_consume_once_across_processes import (
    assert_a_killed_workers_older_saves_never_revive_a_consumed_pause,
    assert_two_processes_deliver_each_pause_once,
)
from tests.redis.test_last_write_wins_across_processes import (
    assert_last_write_wins_across_two_processes,
    workers,
)

__all__ = ["workers"]


@pytest.mark.asyncio
async def test_two_processes_resuming_every_pause_at_once_deliver_each_once(
    cluster: RedisCluster, key_prefix: str, tmp_path: Path
) -> None:
    await assert_two_processes_deliver_each_pause_once(cluster.url, key_prefix, tmp_path)


@pytest.mark.asyncio
async def test_a_killed_workers_older_saves_never_revive_a_consumed_pause(
    cluster: RedisCluster, key_prefix: str, tmp_path: Path
) -> None:
    await assert_a_killed_workers_older_saves_never_revive_a_consumed_pause(cluster.url, key_prefix, tmp_path)


@pytest.mark.asyncio
async def test_a_clock_ahead_never_drops_another_processes_acknowledged_write(
    cluster: RedisCluster, key_prefix: str, workers: list[Worker], tmp_path: Path
) -> None:
    await assert_last_write_wins_across_two_processes(cluster.url, key_prefix, 0.05, workers, tmp_path)
