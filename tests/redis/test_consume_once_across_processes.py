"""A pause is delivered once across processes, on a real Redis (the cluster suite runs the same
checks on a real Redis Cluster).

* Two worker processes (:mod:`tests.redis._pause_worker`), each ``guard(RedisStateStore)`` with its
  own connections and spill file, resume every token four times each, both starting at the same
  instant: every payload goes to exactly one resume of one process, and none is left.
* A worker partitioned from Redis holds older saves of every token in its spill file and is
  SIGKILLed; this process saves each token newer and resumes it; the killed worker's successor
  adopts the spill file and replays the older saves: each is refused by the consumed token's
  tombstone, and no token is delivered again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.guard import controller, guard
from guarded.testing.redis import RedisServer
from tests.killed_process import REPO, report_then_kill
from tests.postgres.test_pauses_across_workers import resume, worker_config
from tests.redis._pause_worker import PartitionedRedisStore, pause_payload
from tests.redis._processes import open_store

TOKENS = 50
PER_TOKEN = 4


def start_resumer(url: str, prefix: str, spill: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.redis._pause_worker",
            "resume",
            url,
            prefix,
            str(TOKENS),
            str(PER_TOKEN),
            str(spill),
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != "ready":
        process.kill()
        raise AssertionError(f"the worker did not start: {line!r}\n{process.communicate(timeout=30)[1]}")
    return process


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    report: dict[str, Any] = json.loads(out.splitlines()[0])
    return report


async def assert_two_processes_deliver_each_pause_once(url: str, prefix: str, tmp_path: Path) -> None:
    saver = await open_store(url, prefix)
    try:
        tokens = [f"pause-{index}" for index in range(TOKENS)]
        for token in tokens:
            await saver.save_planner_state(token, pause_payload(token))
        workers = [start_resumer(url, prefix, tmp_path / f"worker-{index}.sqlite") for index in range(2)]
        try:
            start = time.time() + 0.5
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write(f"go {start}\n")
                worker.stdin.flush()
            reports = [await asyncio.to_thread(finish, worker) for worker in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait(timeout=30)
        delivered = sum((Counter(report["got"]) for report in reports), Counter())
        assert [report["wrong"] for report in reports] == [[], []]
        assert delivered == Counter({token: 1 for token in tokens})
        assert [await saver.load_planner_state(token) for token in tokens] == [None] * TOKENS
    finally:
        await saver.close()


async def assert_a_killed_workers_older_saves_never_revive_a_consumed_pause(
    url: str, prefix: str, tmp_path: Path
) -> None:
    spill = tmp_path / "b.sqlite"
    report = report_then_kill(
        "tests.redis._pause_worker",
        ["hold", url, prefix, str(TOKENS), "0", str(spill)],
        tmp_path / "worker-b.log",
        timeout=60,
    )
    assert report == {"held": TOKENS}

    raw_a = await open_store(url, prefix)
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    raw_b = await open_store(url, prefix, PartitionedRedisStore)
    try:
        async with a:
            for index in range(TOKENS):
                await a.save_planner_state(f"pause-{index}", {"by": "a", "version": 2})
            resumed = [await resume(a, f"pause-{index}") for index in range(TOKENS)]
            successor = guard(
                raw_b, name="pause-worker", registry=CollectorRegistry(), **worker_config(spill)
            )
            async with successor:
                held = controller(successor).dead_letters
                assert held is not None
                adopted = held.depth  # the killed process's held saves, from its spill file
                assert await controller(successor).drain(10.0) == 0  # replayed: refused by the tombstones
                again = [
                    await resume(store, f"pause-{index}")
                    for store in (a, successor)
                    for index in range(TOKENS)
                ]
    finally:
        await raw_a.close()
        await raw_b.close()
    assert resumed == [{"by": "a", "version": 2}] * TOKENS
    assert adopted == TOKENS
    assert again == [None] * (2 * TOKENS)


@pytest.mark.asyncio
async def test_two_processes_resuming_every_pause_at_once_deliver_each_once(
    redis_server: RedisServer, key_prefix: str, tmp_path: Path
) -> None:
    await assert_two_processes_deliver_each_pause_once(redis_server.url, key_prefix, tmp_path)


@pytest.mark.asyncio
async def test_a_killed_workers_older_saves_never_revive_a_consumed_pause(
    redis_server: RedisServer, key_prefix: str, tmp_path: Path
) -> None:
    await assert_a_killed_workers_older_saves_never_revive_a_consumed_pause(
        redis_server.url, key_prefix, tmp_path
    )
