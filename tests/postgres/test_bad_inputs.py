"""Bad inputs on PostgreSQL beyond the cases every store refuses before any I/O
(tests/durable/test_durable_bad_inputs.py): steering sanitised as PenguiFlow does, datetimes, a key
too long for its index parked, a caller's bug rejected and logged."""

from __future__ import annotations

import base64
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.guard import controller, guard
from guarded.models import (
    SteeringEvent,
    SteeringEventType,
)
from tests.support.metrics import outcome_counts
from tests.support.records import plain_task as task

from .conftest import StoreFactory


@pytest.mark.asyncio
async def test_steering_penguiflow_keeps_is_stored_sanitized_not_validated(store: PostgresStateStore) -> None:
    # PenguiFlow's reference store sanitizes and stores; validation is its sessions' job.
    for event_type, payload in [
        (SteeringEventType.PRIORITIZE, {}),
        (SteeringEventType.PRIORITIZE, {"priority": True}),
    ]:
        await store.save_steering(
            SteeringEvent(session_id="s", task_id="t", event_type=event_type, payload=payload)
        )
    assert [event.payload for event in await store.list_steering("s")] == [{}, {"priority": True}]


@pytest.mark.asyncio
async def test_naive_and_aware_datetimes_round_trip(store: PostgresStateStore) -> None:
    naive = datetime(2025, 1, 1, 12, 0, 0, 123456)
    aware = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    await store.save_task(task(task_id="naive", created_at=naive, updated_at=naive))
    await store.save_task(task(task_id="aware", created_at=aware, updated_at=aware))
    by_id = {item.task_id: item for item in await store.list_tasks("s")}
    assert by_id["naive"].updated_at == naive
    assert by_id["naive"].updated_at.tzinfo is None
    assert by_id["aware"].updated_at == aware
    assert by_id["aware"].updated_at.tzinfo is not None


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_a_key_too_long_for_its_index_is_parked_not_retried_forever(make_store: StoreFactory) -> None:
    """PostgreSQL refuses an index row over ~2.7 kB with SQLSTATE 54000 (program limit exceeded):
    the same write can never succeed, so the guard parks it with its reason instead of holding it
    for replay."""
    registry = CollectorRegistry()
    backend = await make_store()
    config = GuardConfig(dead_letter=DeadLetterConfig(path=None))
    async with guard(backend, registry=registry, config=config) as store:
        key = base64.b64encode(random.Random(7).randbytes(15_000)).decode()  # incompressible
        await store.save_memory_state(key, {"turns": []})
        labels = {"store": "default", "method": "save_memory_state", "outcome": "rejected"}
        assert registry.get_sample_value("guarded_store_calls_total", labels) == 1
        dead_letters = controller(store).dead_letters
        assert dead_letters.depth == 0
        [parked] = await dead_letters.parked()
        assert parked.method == "save_memory_state"
        assert "54000" in parked.reason


BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("load_memory_state", ("k",), {"extra": 1}, "unexpected keyword argument 'extra'"),
    ("save_memory_state", ("k",), {}, "missing a required argument: 'state'"),
    ("save_event", ("not an event",), {}, "argument 'event' must be a StoredEvent"),
]


@pytest.mark.lenient
@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "args", "kwargs", "message"), BAD_CALLS)
async def test_a_callers_bug_is_rejected_and_logged_never_held_or_sent(
    make_store: StoreFactory,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's three bad calls, against the real store with the default guard."""
    registry = CollectorRegistry()
    backend = await make_store()
    async with guard(backend, registry=registry) as store:
        assert await getattr(store, method)(*args, **kwargs) is None
        await controller(store).flush()
        dead_letters = controller(store).dead_letters
        assert dead_letters is not None
        assert (dead_letters.depth, await dead_letters.parked()) == (0, [])
    samples = outcome_counts(registry, store=None)
    assert samples == {"rejected": 1}
    [record] = [record for record in caplog.records if record.levelname == "ERROR"]
    assert message in record.getMessage()


@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "args", "kwargs", "message"), BAD_CALLS)
async def test_in_strict_mode_a_callers_bug_raises(
    make_store: StoreFactory, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    backend = await make_store()
    async with guard(backend, registry=CollectorRegistry()) as store:  # the suite runs strict
        with pytest.raises(TypeError, match=message):
            await getattr(store, method)(*args, **kwargs)
