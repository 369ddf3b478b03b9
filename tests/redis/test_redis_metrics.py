"""The Redis store's own metrics, read from a real server: per node memory, maxmemory, clients,
PING, node up, evicted and expired keys, errors by node; pauses saved and consumed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from redis import asyncio as redis_asyncio
from redis import exceptions as redis_errors

from guarded.backends.redis import RedisStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.guard import guard
from guarded.observability import telemetry_names as names
from guarded.testing.redis import RedisServer

pytestmark = pytest.mark.asyncio


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def _node(server: RedisServer) -> str:
    return f"127.0.0.1:{server.port}"


async def _store(server: RedisServer, registry: CollectorRegistry, **options: object) -> RedisStateStore:
    return await RedisStateStore.connect(
        server.url,
        prefix=f"t{uuid.uuid4().hex[:12]}",
        name="cache",
        registry=registry,
        types=DEFAULT_TYPES,
        **options,  # type: ignore[arg-type]
    )


async def test_every_node_series_is_exported_from_the_first_sample(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    store = await _store(redis_server, registry, sample_interval=3600)
    labels = {"store": "cache", "node": _node(redis_server)}
    try:
        for counter in (names.GUARDED_REDIS_EVICTED_KEYS_TOTAL, names.GUARDED_REDIS_EXPIRED_KEYS_TOTAL):
            assert _value(registry, counter, **labels) == 0
        for kind in names.REDIS_NODE_ERROR_KINDS:
            assert _value(registry, names.GUARDED_REDIS_NODE_ERRORS_TOTAL, **labels, kind=kind) == 0
        assert _value(registry, names.GUARDED_REDIS_PAUSES_SAVED_TOTAL, store="cache") == 0
        answered = await store.sampling.sampler.sample()  # type: ignore[union-attr]
        assert answered == {_node(redis_server): True}
        assert _value(registry, names.GUARDED_REDIS_NODE_UP, **labels) == 1
        assert (_value(registry, names.GUARDED_REDIS_MEMORY_USED_BYTES, **labels) or 0) > 100_000
        assert _value(registry, names.GUARDED_REDIS_MAXMEMORY_BYTES, **labels) == 0  # the test server's
        assert (_value(registry, names.GUARDED_REDIS_CONNECTED_CLIENTS, **labels) or 0) >= 1
        assert (_value(registry, f"{names.GUARDED_REDIS_PING_SECONDS}_count", **labels) or 0) >= 1
        assert _value(registry, names.GUARDED_REDIS_SAMPLE_TIMESTAMP, store="cache") is not None
    finally:
        await store.close()
    assert _value(registry, names.GUARDED_REDIS_NODE_UP, **labels) is None
    assert _value(registry, names.GUARDED_REDIS_PAUSES_SAVED_TOTAL, store="cache") is None


async def test_pauses_saved_and_consumed_are_counted_through_the_guard(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    backend = await _store(redis_server, registry, sample_interval=None)
    async with guard(backend, name="cache", registry=registry) as store:
        await store.save_planner_state("a", {"step": "a"})
        await store.save_planner_states([("b", {"step": "b"}), ("c", {"step": "c"})])
        assert await store.load_planner_state("a") == {"step": "a"}
        assert await store.load_planner_state("b") == {"step": "b"}
        assert await store.load_planner_state("a") is None  # consumed once: not counted again
        assert _value(registry, names.GUARDED_REDIS_PAUSES_SAVED_TOTAL, store="cache") == 3
        assert _value(registry, names.GUARDED_REDIS_PAUSES_CONSUMED_TOTAL, store="cache") == 2
    await backend.close()


@pytest.fixture(scope="module")
def small_server() -> Iterator[RedisServer]:
    """A server of its own: the test changes its maxmemory and kills it."""
    with RedisServer.started() as server:
        yield server


async def test_expiry_eviction_and_a_killed_node_show_in_the_metrics(small_server: RedisServer) -> None:
    registry = CollectorRegistry()
    labels = {"store": "cache", "node": _node(small_server)}
    store = await _store(small_server, registry, sample_interval=3600)
    sampler = store.sampling.sampler
    assert sampler is not None
    raw = redis_asyncio.Redis.from_url(small_server.url)
    try:
        await sampler.sample()
        await raw.set("short", "x", px=1)
        await asyncio.sleep(0.01)
        assert not await raw.exists("short")  # a read of an expired key expires it
        await sampler.sample()
        assert (_value(registry, names.GUARDED_REDIS_EXPIRED_KEYS_TOTAL, **labels) or 0) >= 1

        used = int((await raw.info("memory"))["used_memory"])
        await raw.config_set("maxmemory-policy", "volatile-lru")
        await raw.config_set("maxmemory", used + 512 * 1024)
        for index in range(64):  # 2 MB of keys with a TTL, four times the room left
            await raw.set(f"filler{index}", b"x" * 32 * 1024, ex=600)
        await sampler.sample()
        assert (_value(registry, names.GUARDED_REDIS_EVICTED_KEYS_TOTAL, **labels) or 0) > 0
        assert _value(registry, names.GUARDED_REDIS_MAXMEMORY_BYTES, **labels) == used + 512 * 1024
        await raw.config_set("maxmemory", 0)

        small_server.kill()
        assert await sampler.sample() == {_node(small_server): False}
        assert _value(registry, names.GUARDED_REDIS_NODE_UP, **labels) == 0
        failed = sum(
            _value(registry, names.GUARDED_REDIS_NODE_ERRORS_TOTAL, **labels, kind=kind) or 0
            for kind in names.REDIS_NODE_ERROR_KINDS
        )
        assert failed >= 1
        with pytest.raises(redis_errors.ConnectionError):
            await store.save_planner_state("lost", {"n": 1})
        errors = sum(
            _value(registry, names.GUARDED_REDIS_NODE_ERRORS_TOTAL, **labels, kind=kind) or 0
            for kind in names.REDIS_NODE_ERROR_KINDS
        )
        assert errors > failed
        small_server.restart()
        assert await sampler.sample() == {_node(small_server): True}
        assert _value(registry, names.GUARDED_REDIS_NODE_UP, **labels) == 1
    finally:
        await raw.aclose()
        await store.close()
