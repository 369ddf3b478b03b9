"""A series one worker stops exporting (its store closed) leaves the combined gauge as the other
workers make it, whatever the gauge's multiprocess mode: it must not read as a 0 written just now
(``livemin``: a spill file that takes writes would read unavailable; ``livemostrecent``: the
server's latest figure would read 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.killed_process import REPO

from .test_multiprocess_metrics import WAIT, scrape, worker_environment


def started(kind: str, environment: dict[str, str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.telemetry.gone_series_worker", kind],
        cwd=REPO,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def test_a_series_gone_in_one_worker_leaves_the_others_value(tmp_path: Path) -> None:
    environment = worker_environment(tmp_path / "prometheus")
    processes = []
    try:
        processes.append(started("live", environment))
        processes.append(started("gone", environment))  # its writes come after the live one's
        scraped = scrape(tmp_path / "prometheus")
        agents = (("store", "agents"),)
        spill = "guarded_deadletter_spill_available"
        assert scraped[(spill, spill, agents)] == 1.0, "the live worker's spill file takes writes"
        rows = "guarded_pg_table_rows"
        assert scraped[(rows, rows, agents)] == 7.0, "the live worker's sample is the latest one"
    finally:
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("\n")
            process.stdin.flush()
            process.wait(WAIT)


REDIS_NODE_REMOVED = """
import dataclasses
from prometheus_client import CollectorRegistry
from guarded.backends.redis.redis_metrics import NodeInfo, RedisStoreMetrics
metrics = RedisStoreMetrics(store="agents", registry=CollectorRegistry())
metrics.add_node("n1")
metrics.node_answered("n1", 0.001, NodeInfo(**{field.name: 1 for field in dataclasses.fields(NodeInfo)}))
metrics.remove_node("n1")
print("ready", flush=True)
input()
"""


def test_a_redis_node_removed_in_multiprocess_mode_leaves_no_gauge_and_no_warning(tmp_path: Path) -> None:
    environment = worker_environment(tmp_path / "prometheus")
    process = subprocess.Popen(
        [sys.executable, "-W", "error::UserWarning", "-c", REDIS_NODE_REMOVED],
        cwd=REPO,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline().strip()
        assert ready == "ready", "removing a node's series raised nothing into the store"
        gauges = [key for key in scrape(tmp_path / "prometheus") if key[0] == "guarded_redis_node_up"]
        assert gauges == [], "the removed node's gauge is gone"
    finally:
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.write("\n")
            process.stdin.flush()
        process.wait(WAIT)
