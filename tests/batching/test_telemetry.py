"""Metrics on the given registry, and the writer's failures contained, counted and logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import PendingWrite
from tests.support.metrics import sample

from .support import StoreWriter, deadline, event_write, make, settle

SECRET = "s3cr3t-PAYLOAD-77"


@pytest.mark.asyncio
async def test_batch_size_flush_duration_and_pending_metrics() -> None:
    registry = CollectorRegistry()
    gate = asyncio.Event()
    batcher, _ = make(
        StoreWriter(InMemoryStateStore(), gate=gate), registry=registry, store_name="primary", max_batch=3
    )
    labels = {"store": "primary", "method": "save_event"}
    for index in range(7):
        await batcher.submit(event_write("t", index), deadline=deadline())
    await settle()
    assert sample(registry, "guarded_batch_pending", store="primary") == 7
    assert sample(registry, "guarded_batch_size_count", **labels) == 0

    gate.set()
    await batcher.flush()
    assert sample(registry, "guarded_batch_pending", store="primary") == 0
    assert sample(registry, "guarded_batch_size_count", **labels) == 3
    assert sample(registry, "guarded_batch_size_sum", **labels) == 7
    assert sample(registry, "guarded_batch_size_bucket", **labels, le="2.0") == 1
    assert sample(registry, "guarded_batch_size_bucket", **labels, le="5.0") == 3
    assert sample(registry, "guarded_batch_flush_duration_seconds_count", **labels) == 3
    assert sample(registry, "guarded_batch_flush_duration_seconds_sum", **labels) > 0
    await batcher.aclose()


@pytest.mark.asyncio
async def test_batchers_of_one_registry_share_instruments_and_sum_pending_by_store() -> None:
    registry = CollectorRegistry()
    first, _ = make(registry=registry, store_name="a")
    second, _ = make(registry=registry, store_name="a")
    third, _ = make(registry=registry, store_name="b")
    for batcher, count in ((first, 2), (second, 3), (third, 4)):
        for index in range(count):
            await batcher.submit(event_write("t", index), deadline=deadline())
    assert sample(registry, "guarded_batch_pending", store="a") == 5
    assert sample(registry, "guarded_batch_pending", store="b") == 4
    for batcher in (first, second, third):
        await batcher.aclose()
    assert sample(registry, "guarded_batch_pending", store="a") == 0
    assert sample(registry, "guarded_batch_size_count", store="a", method="save_event") == 2


@pytest.mark.asyncio
async def test_a_raising_writer_is_contained_counted_and_logged_without_payloads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[int] = []

    async def writer(method: str, writes: Sequence[PendingWrite]) -> None:
        attempts.append(len(writes))
        if len(attempts) == 1:
            raise RuntimeError(f"cannot write {SECRET}")

    registry = CollectorRegistry()
    batcher, _ = make(writer=writer, registry=registry, max_batch=3)
    with caplog.at_level(logging.ERROR, logger="guarded.batching"):
        for index in range(6):
            assert await batcher.submit(event_write(SECRET, index), deadline=deadline())
        await batcher.flush()

    assert attempts == [3, 3]
    assert batcher.failed == 3
    assert batcher.pending == 0
    assert batcher.pending_for_scope("save_event", SECRET) == []
    assert batcher.drain_unwritten() == []
    records = [record for record in caplog.records if record.name == "guarded.batching"]
    assert len(records) == 1
    assert "RuntimeError" in records[0].getMessage()
    assert getattr(records[0], "writes", None) == 3
    assert all(SECRET not in repr(vars(record)) for record in records)
    assert sample(registry, "guarded_batch_size_count", store="test", method="save_event") == 2
    await batcher.aclose()


def test_a_flush_of_one_is_observed_as_any_flush_of_one_write() -> None:
    from guarded.observability.batch_stats import FlushSeries

    general, lone = FlushSeries(), FlushSeries()
    for seconds in (0.0001, 0.002, 0.3, 7.0):
        general.observe(1, seconds)
        lone.observe_one(seconds)
    assert lone.size.counts == general.size.counts
    assert lone.size.total == general.size.total == 4
    assert lone.duration.counts == general.duration.counts
    assert lone.duration.total == general.duration.total
