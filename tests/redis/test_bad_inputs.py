"""Bad data on Redis: a value over ``max_value_bytes`` is parked by the guard with its reason, never
retried or held (the cases every durable store refuses before any I/O, naming the method and the
field path: tests/durable/test_durable_bad_inputs.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import DeadLetterConfig, GuardConfig
from guarded.guard import controller, guard

from .conftest import RedisStoreFactory


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_a_value_over_max_value_bytes_is_parked_with_its_reason(
    make_redis_store: RedisStoreFactory,
) -> None:
    registry = CollectorRegistry()
    backend = await make_redis_store(max_value_bytes=1000)
    config = GuardConfig(dead_letter=DeadLetterConfig(path=None))
    async with guard(backend, registry=registry, config=config) as store:
        await store.save_memory_state("t:u:s", {"turns": ["x" * 2000]})
        await store.save_memory_state("t:u:s2", {"turns": ["small"]})
        labels = {"store": "default", "method": "save_memory_state", "outcome": "rejected"}
        assert registry.get_sample_value("guarded_store_calls_total", labels) == 1
        dead_letters = controller(store).dead_letters
        assert dead_letters is not None
        assert dead_letters.depth == 0
        [parked] = await dead_letters.parked()
        assert parked.method == "save_memory_state"
        assert "max_value_bytes" in parked.reason
        assert "xxxx" not in parked.reason
    assert await backend.load_memory_state("t:u:s") is None
    assert await backend.load_memory_state("t:u:s2") == {"turns": ["small"]}
