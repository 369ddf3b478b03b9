"""prometheus-client's multiprocess mode (``uvicorn --workers N``, gunicorn): two worker
processes guard a store named alike under one ``PROMETHEUS_MULTIPROC_DIR``, and one scrape
through a ``MultiProcessCollector`` gives every guard metric combined over both, as each
process's own registry gave it: counters and histograms summed, gauges summed or taken at their
worst as their mode says. The workers are real processes (:mod:`tests.telemetry.multiprocess_worker`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from guarded.observability.telemetry_names import gauge_multiprocess_mode
from tests.killed_process import REPO

WAIT = 120.0
"""Seconds a worker has to run its workload on a loaded machine."""

AGE_SLACK = 60.0
"""Seconds an age gauge may grow between a worker's own view and the scrape."""

Series = tuple[str, str, tuple[tuple[str, str], ...]]
"""(family, sample name, labels) of one sample; a histogram's ``le`` as a float's text."""


def series(family: str, name: str, labels: dict[str, str]) -> Series:
    normal = {key: repr(float(value)) if key == "le" else value for key, value in labels.items()}
    return family, name, tuple(sorted(normal.items()))


def combined(views: list[list[dict[str, Any]]]) -> tuple[dict[Series, float], dict[str, str]]:
    """What one scrape of both workers should read, from each worker's own view, and each
    family's type."""
    expected: dict[Series, float] = {}
    types: dict[str, str] = {}
    for view in views:
        for sample in view:
            family, kind, name = sample["family"], sample["type"], sample["name"]
            if name.endswith("_created"):
                continue  # no multiprocess file keeps a creation time
            types[family] = kind
            key = series(family, name, sample["labels"])
            value = float(sample["value"])
            mode = gauge_multiprocess_mode(family) if kind == "gauge" else "livesum"
            if key not in expected:
                expected[key] = value
            elif mode == "livemax":
                expected[key] = max(expected[key], value)
            elif mode == "livemin":
                expected[key] = min(expected[key], value)
            else:
                expected[key] = expected[key] + value
    return expected, types


def scrape(directory: Path) -> dict[Series, float]:
    """One scrape through prometheus-client's ``MultiProcessCollector``: its ``guarded_`` samples."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    text = generate_latest(registry).decode()
    return {
        series(family.name, sample.name, sample.labels): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("guarded_")
        for sample in family.samples
    }


def mismatches(scraped: dict[Series, float], expected: dict[Series, float]) -> list[str]:
    """How one scrape differs from the workers' views combined (nothing: it matches)."""
    found = [f"missing {key}" for key in expected.keys() - scraped.keys()]
    found += [f"unexpected {key}" for key in scraped.keys() - expected.keys()]
    for key in expected.keys() & scraped.keys():
        value = expected[key]
        slack = AGE_SLACK if key[0].endswith("_age_seconds") else 1e-9 * max(1.0, abs(value))
        if abs(scraped[key] - value) > slack:
            found.append(f"{key}: scraped {scraped[key]}, the workers' {value}")
    return found[:10]


def worker_environment(directory: Path) -> dict[str, str]:
    directory.mkdir()
    return {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}


@pytest.fixture(params=["written", "timer"])
def workers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, list[subprocess.Popen[str]]]]:
    """Two workers; ``written``: each writes its metrics before it prints its view, ``timer``:
    the writer's thread does, within a second or so."""
    directory = tmp_path / "prometheus"
    environment = worker_environment(directory)
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.telemetry.multiprocess_worker",
                str(index),
                str(tmp_path),
                request.param,
            ],
            cwd=REPO,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(tmp_path / f"worker-{index}.log").open("w"),
            text=True,
        )
        for index in (1, 2)
    ]
    try:
        yield directory, processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(WAIT)


def test_one_scrape_sums_every_guard_metric_of_two_workers(
    workers: tuple[Path, list[subprocess.Popen[str]]], tmp_path: Path
) -> None:
    directory, processes = workers
    views: list[list[dict[str, Any]]] = []
    for index, process in enumerate(processes, start=1):
        assert process.stdout is not None
        line = process.stdout.readline()
        log = (tmp_path / f"worker-{index}.log").read_text()
        assert line, f"worker {index} printed no view; its log:\n{log}"
        views.append(json.loads(line))
    expected, types = combined(views)
    deadline = time.monotonic() + WAIT
    scraped = scrape(directory)
    while mismatches(scraped, expected) and time.monotonic() < deadline:
        time.sleep(0.1)  # the timer's next write is on its way
        scraped = scrape(directory)
    assert not mismatches(scraped, expected)

    families = {key[0] for key in expected}
    for name in (
        "guarded_store_calls",
        "guarded_store_call_duration_seconds",
        "guarded_store_retries",
        "guarded_circuit_state",
        "guarded_circuit_transitions",
        "guarded_deadletter_depth",
        "guarded_deadletter_oldest_age_seconds",
        "guarded_deadletter_enqueued",
        "guarded_bulkhead_in_use",
        "guarded_bulkhead_wait_seconds",
        "guarded_batch_size",
        "guarded_batch_pending",
        "guarded_stale_cache_entries",
        "guarded_task_events",
        "guarded_tasks_in_flight",
    ):
        assert name in families, f"the workload exercises {name}"
    # The workload's own numbers, as a check on the check: worker 1 made 5 calls of a method,
    # worker 2 made 10; worker 1's breaker is forced open, worker 2's closed.
    calls = ("guarded_store_calls", "guarded_store_calls_total")
    ok_saves = (("method", "save_memory_state"), ("outcome", "ok"), ("store", "agents"))
    assert scraped[(*calls, ok_saves)] == 15
    state = {
        dict(key[2])["state"]: value for key, value in scraped.items() if key[0] == "guarded_circuit_state"
    }
    assert state["forced_open"] == 1, state
    assert state["closed"] == 1, state
    held = ("guarded_deadletter_depth", "guarded_deadletter_depth", (("store", "agents"),))
    assert scraped[held] == 2
    assert types["guarded_circuit_state"] == "gauge"

    for process in processes:
        assert process.stdin is not None
        process.stdin.write("\n")
        process.stdin.flush()
    for process in processes:
        assert process.wait(WAIT) == 0
    after = scrape(directory)
    assert after == {key: value for key, value in expected.items() if types[key[0]] != "gauge"}, (
        "after both exit: their counts stay, their gauges go"
    )


def test_a_worker_forked_after_calls_reports_only_its_own(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    subprocess.run(
        [sys.executable, "-m", "tests.telemetry.multiprocess_worker", "fork"],
        cwd=REPO,
        env=worker_environment(directory),
        check=True,
        timeout=WAIT,
    )
    ok_saves = (("method", "save_memory_state"), ("outcome", "ok"), ("store", "agents"))
    assert scrape(directory)[("guarded_store_calls", "guarded_store_calls_total", ok_saves)] == 3 + 4


A_COLLECTOR_FAILS = """
import asyncio, time
from prometheus_client import REGISTRY
from prometheus_client.registry import Collector
from guarded import guard
from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.observability.multiprocess_metrics import register_scrape_time, write_scrape_time_metrics

class Broken(Collector):
    def describe(self):
        return []

    def collect(self):
        raise RuntimeError("a collector that fails")

register_scrape_time(REGISTRY, Broken())
config = GuardConfig(dead_letter=DeadLetterConfig(path=None))
store = guard(InMemoryStateStore(), name="agents", config=config)

async def saves():
    for number in range(3):
        await store.save_memory_state(f"key-{number}", {"n": number})

asyncio.run(saves())
write_scrape_time_metrics()
write_scrape_time_metrics()
time.sleep(2.5)  # the writer's thread writes twice meanwhile, and goes on
"""


def test_a_collector_that_fails_leaves_the_others_written_and_warns_once(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    finished = subprocess.run(
        [sys.executable, "-c", A_COLLECTOR_FAILS],
        cwd=REPO,
        env=worker_environment(directory),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    ok_saves = (("method", "save_memory_state"), ("outcome", "ok"), ("store", "agents"))
    assert scrape(directory)[("guarded_store_calls", "guarded_store_calls_total", ok_saves)] == 3
    warnings = [line for line in finished.stderr.splitlines() if "could not collect Broken" in line]
    assert len(warnings) == 1, finished.stderr
    assert "Traceback" not in finished.stderr


FORK_DURING_A_WRITE = """
import os, sys, threading, time
from prometheus_client import REGISTRY, Counter
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from guarded.observability.multiprocess_metrics import register_scrape_time, write_scrape_time_metrics

class Many(Collector):
    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily("guarded_fork_test", "Many series.", labels=["n"])
        for number in range(20_000):
            family.add_metric([str(number)], number)
        yield family

register_scrape_time(REGISTRY, Many())
write_scrape_time_metrics()  # the files and their keys exist: later writes only set values
writing = threading.Thread(target=write_scrape_time_metrics)
writing.start()
children = []
while writing.is_alive() and len(children) < 20:  # forks all along the write
    child = os.fork()
    if child == 0:
        Counter("guarded_fork_child", "A child's own counter.").inc()  # takes prometheus-client's lock
        os._exit(0)
    children.append(child)
    time.sleep(0.02)
deadline = time.monotonic() + 30
hung = set(children)
while hung and time.monotonic() < deadline:
    hung = {child for child in hung if not os.waitpid(child, os.WNOHANG)[0]}
    time.sleep(0.05)
for child in hung:
    os.kill(child, 9)
print(f"{len(children)} children, {len(hung)} hung", flush=True)
writing.join()
"""


def test_a_fork_during_a_write_leaves_the_child_free_to_write(tmp_path: Path) -> None:
    """gunicorn --preload forks workers from a process whose writer thread may be mid-write: a
    child must not inherit prometheus-client's lock held (its first metric write would hang)."""
    finished = subprocess.run(
        [sys.executable, "-c", FORK_DURING_A_WRITE],
        cwd=REPO,
        env=worker_environment(tmp_path / "prometheus"),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert finished.stdout.strip().endswith(" 0 hung"), finished.stdout + finished.stderr
