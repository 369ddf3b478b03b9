"""A write the backend does not take and the dead-letter buffer cannot keep ends ``refused``: each
caller is answered for its own write (batched or not), the refusal is counted and logged at
ERROR, raised in strict mode, and nothing already acknowledged is evicted. In-memory store with
injected faults; the spill file's limits against PostgreSQL are in tests/durability."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, DeadLetterConfig
from guarded.errors import WriteNotKeptError
from guarded.guard import controller, guard
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import calls, sample

from .support import event, fast_config

pytestmark = pytest.mark.asyncio

OUTAGE = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
CAP = 5


def capped(*, strict: bool, ack: str = "commit") -> tuple[Any, InMemoryStateStore, Any, CollectorRegistry]:
    """A guard whose buffer holds at most :data:`CAP` writes (memory only), its backend down."""
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, OUTAGE)
    config = fast_config(
        batching=BatchConfig(max_delay=0.001, ack=ack),  # type: ignore[arg-type]
        dead_letter=DeadLetterConfig(path=None, max_memory_entries=CAP, replay_rate=10_000),
        strict=strict,
    )
    return guard(faulty, registry=registry, config=config), backend, fault_injector(faulty), registry


def refused_total(registry: CollectorRegistry, method: str) -> float:
    return sample(
        registry, "guarded_deadletter_refused_total", store="default", method=method, reason="memory_full"
    )


async def test_each_caller_of_a_group_commit_is_answered_for_its_own_write() -> None:
    store, backend, injector, registry = capped(strict=True)
    try:
        answers = await asyncio.gather(
            *(store.save_event(event("t", index, i=index)) for index in range(20)), return_exceptions=True
        )
        kept = [index for index, answer in enumerate(answers) if answer is None]
        refused = [answer for answer in answers if isinstance(answer, WriteNotKeptError)]
        assert len(kept) == CAP
        assert len(refused) == 20 - CAP
        assert calls(registry, "save_event", "dead_lettered") == CAP
        assert calls(registry, "save_event", "refused") == 20 - CAP
        assert refused_total(registry, "save_event") == 20 - CAP
        injector.plan = FaultPlan()
        assert await controller(store).drain(timeout=5) == 0
        assert sorted(item.payload["i"] for item in await backend.load_history("t")) == kept
    finally:
        await controller(store).aclose()


@pytest.mark.lenient  # as in production: the refused call returns, answered refused
async def test_a_refused_write_is_answered_refused_and_logged_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, backend, injector, registry = capped(strict=False)
    try:
        with caplog.at_level(logging.ERROR):
            for index in range(CAP + 3):
                assert await store.save_memory_state(f"k{index}", {"v": index}) is None
        assert calls(registry, "save_memory_state", "dead_lettered") == CAP
        assert calls(registry, "save_memory_state", "refused") == 3
        assert refused_total(registry, "save_memory_state") == 3
        records = [
            record for record in caplog.records if getattr(record, "event", None) == "deadletter_refused"
        ]
        assert records
        assert records[0].levelno == logging.ERROR
        injector.plan = FaultPlan()
        assert await controller(store).drain(timeout=5) == 0
        for index in range(CAP):  # the first ones, acknowledged, were not evicted for the later ones
            assert await backend.load_memory_state(f"k{index}") == {"v": index}
        for index in range(CAP, CAP + 3):
            assert await backend.load_memory_state(f"k{index}") is None
    finally:
        await controller(store).aclose()


async def test_write_behind_counts_a_refusal_its_caller_no_longer_waits_for() -> None:
    store, backend, injector, registry = capped(strict=True, ack="enqueue")
    try:
        for index in range(CAP + 4):
            assert await store.save_event(event("t", index, i=index)) is None  # acknowledged at enqueue
        await controller(store).flush()
        buffer = controller(store).dead_letters
        assert buffer is not None
        assert buffer.depth == CAP
        assert refused_total(registry, "save_event") == 4
        injector.plan = FaultPlan()
        assert await controller(store).drain(timeout=5) == 0
        assert len(await backend.load_history("t")) == CAP
    finally:
        await controller(store).aclose()
