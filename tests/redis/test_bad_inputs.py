"""Bad data is refused as the PostgreSQL store refuses it, before any I/O, naming the method and the
field path (the same cases); under the guard it is parked with its reason, never retried or held."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from redis import asyncio as redis_asyncio

from guarded.backends.redis import RedisStateStore
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.errors import InvalidPayloadError
from guarded.guard import controller, guard
from guarded.testing.redis import free_port
from tests.postgres.test_bad_inputs import CASES, NAN, SURROGATE, Call
from tests.support.records import plain_event as event

from .conftest import RedisStoreFactory


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "call", "method", "path"), CASES, ids=[case[0] for case in CASES])
async def test_refused_before_io_with_method_and_path(name: str, call: Call, method: str, path: str) -> None:
    client = redis_asyncio.Redis(port=free_port())  # nothing listens: any I/O is a connection error
    store = RedisStateStore(client)
    try:
        with pytest.raises(InvalidPayloadError) as caught:
            await call(store)  # type: ignore[arg-type]
    finally:
        await client.aclose()
    assert caught.value.method == method
    assert caught.value.path == path
    assert isinstance(caught.value, ValueError)  # never retryable


@pytest.mark.asyncio
async def test_bad_bulk_stores_nothing(store: RedisStateStore) -> None:
    with pytest.raises(InvalidPayloadError):
        await store.save_events([event(trace_id="bulk"), event(trace_id="bulk", payload={"x": NAN})])
    assert await store.load_history("bulk") == []


@pytest.mark.asyncio
async def test_artifact_bad_inputs(store: RedisStateStore) -> None:
    artifacts = store.artifact_store
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_bytes("not bytes")  # type: ignore[arg-type]
    assert caught.value.path == "data"
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_text(SURROGATE)
    assert caught.value.path == "text"
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_bytes(b"x", meta={"m": NAN})
    assert caught.value.path == "meta[key #0 (str)]"


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
