"""The alerts fire on what a real guard exports, not only on hand-written series.

A real ``guard()`` over the in-memory store (a :class:`~guarded.testing.FaultyStore` makes the
pause calls fail) is scraped through prometheus-client's own exposition format; the samples
become promtool input series (scraped every minute, with the ``job`` and ``instance`` labels
Prometheus would add) and promtool evaluates the committed rule file on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dashboards import alerts
from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import Batcher, PendingWrite
from guarded.config import BatchConfig, GuardConfig, RetryConfig
from guarded.guard import guard
from guarded.observability import telemetry_names as names
from guarded.testing import Fault, FaultPlan, FaultyStore

from ..batching.support import event_write
from . import promtool_cases as cases
from .test_promtool import REPO, RULE_FILE, _run

Scrape = dict[str, float]
"""Series text (``name{labels}``) to value."""


def _samples(registry: CollectorRegistry) -> list[Sample]:
    """What Prometheus would scrape from ``registry`` (guarded's series only)."""
    return [
        sample
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name.startswith("guarded_") and not sample.name.endswith("_created")
    ]


def _scrape(registry: CollectorRegistry) -> Scrape:
    target = {alerts.LABEL_JOB: cases.JOB, alerts.LABEL_INSTANCE: cases.INSTANCE}
    return {
        cases.series(sample.name, "", {**target, **sample.labels})["series"]: sample.value
        for sample in _samples(registry)
    }


def _outcomes(registry: CollectorRegistry, method: str) -> set[str]:
    return {
        sample.labels[names.LABEL_OUTCOME]
        for sample in _samples(registry)
        if sample.name == alerts.CALLS_TOTAL and sample.labels[names.LABEL_METHOD] == method and sample.value
    }


def _input_series(timeline: list[Scrape]) -> list[dict[str, str]]:
    """One series per sample ever seen: its value at each minute, ``_`` before it existed."""
    every = sorted({key for scrape in timeline for key in scrape})
    return [
        {"series": key, "values": " ".join(cases.sample_text(scrape.get(key)) for scrape in timeline)}
        for key in every
    ]


async def _pause_failures(registry: CollectorRegistry) -> list[Scrape]:
    """Six healthy minutes, then one pause save and one pause load fail; scraped every minute."""
    faulty = FaultyStore(
        InMemoryStateStore(),
        FaultPlan.script(
            {
                cases.SAVE: [Fault.error_before(ConnectionRefusedError)],
                cases.LOAD: [Fault.error_before(ConnectionRefusedError)],
            }
        ),
    )
    config = GuardConfig(retry=RetryConfig(enabled=False))
    guarded: Any = guard(faulty, name=cases.STORE, registry=registry, config=config)
    async with guarded as store:
        await store.save_memory_state("memory-key", {"turns": []})
        healthy = _scrape(registry)
        await store.save_planner_state("token-1", {"step": 1})
        await store.load_planner_state("token-2")
        failed = _scrape(registry)
    return [healthy] * 7 + [failed] * 4


@pytest.mark.asyncio
async def test_pause_alerts_fire_on_a_real_guards_metrics(promtool: str, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    timeline = await _pause_failures(registry)
    # the pause is held for replay, not in the store; the load found nothing to fall back on
    assert _outcomes(registry, cases.SAVE) == {"dead_lettered"}
    assert _outcomes(registry, cases.LOAD) == {"fallback"}

    test = cases.case(
        "a real guard whose pause save and load fail",
        _input_series(timeline),
        [
            cases.at(6, names.ALERT_PAUSE_SAVE_FAILED),
            cases.at(8, names.ALERT_PAUSE_SAVE_FAILED, cases.save_failed("1")),
            # one failed save is a ticket; only saves failing for minutes page
            cases.at(10, names.ALERT_PAUSE_SAVES_FAILING),
            cases.at(6, names.ALERT_PAUSE_LOAD_FAILED),
            cases.at(8, names.ALERT_PAUSE_LOAD_FAILED, cases.load_failed("fallback", "1")),
        ],
    )
    document = {**cases.unit_test_file(test), "rule_files": [str(RULE_FILE)]}
    test_file = tmp_path / "real-guard.yml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = _run(promtool, "test", "rules", str(test_file), cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_series_the_process_alerts_read_is_exported_from_the_start() -> None:
    registry = CollectorRegistry()
    guard(InMemoryStateStore(), name=cases.STORE, registry=registry)
    exported = {sample.name for sample in _samples(registry)}
    assert alerts.ALIVE in exported  # the "process up and scraped" anchor of events_in_window
    assert names.MEMORY_HEALTH_KEYS in exported


async def _batcher_timeline(registry: CollectorRegistry) -> list[Scrape]:
    """A real batcher: four healthy minutes, then a writer that raises on its first flush and a
    flush that never ends, so the queue fills to ``queue_size`` and stays full; scraped every minute."""
    gate = asyncio.Event()
    flushes: list[int] = []

    async def writer(method: str, writes: Sequence[PendingWrite]) -> None:
        flushes.append(len(writes))
        if len(flushes) == 1:
            raise RuntimeError("a bug in the writer")
        await gate.wait()

    config = BatchConfig(ack="enqueue", max_batch=2, max_delay=0, queue_size=4, max_concurrent_flushes=1)
    batcher = Batcher(config, writer, store_name=cases.STORE, registry=registry)
    loop = asyncio.get_running_loop()
    healthy = _scrape(registry)
    for index in range(2):
        assert await batcher.submit(event_write("trace", index), deadline=loop.time() + 5)
    await batcher.flush()
    assert batcher.failed == 2
    for index in range(2, 6):
        assert await batcher.submit(event_write("trace", index), deadline=loop.time() + 5)
    assert batcher.pending == config.queue_size
    assert not await batcher.submit(
        event_write("trace", 6), deadline=loop.time() + 0.01
    )  # full: dead-letter it
    full = _scrape(registry)
    gate.set()
    await batcher.aclose()
    return [healthy] * 5 + [full] * 12


@pytest.mark.asyncio
async def test_batch_alerts_fire_on_a_real_batchers_metrics(promtool: str, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    timeline = await _batcher_timeline(registry)
    full = timeline[-1]

    def scraped(metric: str, **labels: str) -> float:
        target = {alerts.LABEL_JOB: cases.JOB, alerts.LABEL_INSTANCE: cases.INSTANCE}
        own = dict(sorted({names.LABEL_STORE: cases.STORE, **labels}.items()))  # exposition order
        return full[cases.series(metric, "", {**target, **own})["series"]]

    assert scraped(names.BATCH_CAPACITY) == 4
    assert scraped(names.BATCH_PENDING) == 4
    assert scraped(names.BATCH_FAILED_WRITES, method="save_event") == 2

    queue_full = names.ALERT_BATCH_QUEUE_FULL
    dropped = names.ALERT_BATCH_WRITES_FAILED
    test = cases.case(
        "a real batcher whose writer raised once and whose queue then stayed full",
        # the guard around a batcher exports its breaker from the start: the process is alive
        [*_input_series(timeline), *cases.alive(len(timeline))],
        [
            cases.at(4, queue_full),
            cases.at(4, dropped),
            cases.at(6, dropped, cases.batch_failed("save_event", "2")),
            cases.at(8, queue_full),
            cases.at(11, queue_full, cases.queue_full("4")),
        ],
    )
    document = {**cases.unit_test_file(test), "rule_files": [str(RULE_FILE)]}
    test_file = tmp_path / "real-batcher.yml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = _run(promtool, "test", "rules", str(test_file), cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
