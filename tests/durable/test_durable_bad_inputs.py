"""Values JSON (or the store) cannot carry are refused by every durable store before any I/O,
naming the method and the field path; a bulk call with one bad item writes nothing.

:func:`unreachable_store` is a store on which any I/O fails (PostgreSQL: its pool closed; Redis: a
client of a port nobody listens on): an ``InvalidPayloadError`` rather than a connection error
proves the refusal came first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from redis import asyncio as redis_asyncio

from guarded.backends.redis import RedisStateStore
from guarded.errors import InvalidPayloadError
from guarded.testing.redis import free_port
from tests.postgres.conftest import StoreFactory
from tests.support.records import plain_event as event

from .bad_input_cases import CASES, NAN, SURROGATE, Call
from .conftest import DURABLE_STORES


@pytest_asyncio.fixture(params=DURABLE_STORES)
async def unreachable_store(request: pytest.FixtureRequest, make_store: StoreFactory) -> AsyncIterator[Any]:
    if request.param == "postgres":
        store = await make_store()
        await store.close()  # any I/O would now fail with asyncpg's "pool is closed"
        yield store
        return
    client = redis_asyncio.Redis(port=free_port())  # nothing listens: any I/O is a connection error
    yield RedisStateStore(client)
    await client.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "call", "method", "path"), CASES, ids=[case[0] for case in CASES])
async def test_refused_before_io_with_method_and_path(
    unreachable_store: Any, name: str, call: Call, method: str, path: str
) -> None:
    with pytest.raises(InvalidPayloadError) as caught:
        await call(unreachable_store)
    assert caught.value.method == method
    assert caught.value.path == path
    assert method in str(caught.value)
    assert path in str(caught.value)
    assert isinstance(caught.value, ValueError)  # never retryable


@pytest.mark.asyncio
async def test_bad_bulk_stores_nothing(store: Any) -> None:
    with pytest.raises(InvalidPayloadError):
        await store.save_events([event(trace_id="bulk"), event(trace_id="bulk", payload={"x": NAN})])
    assert await store.load_history("bulk") == []


@pytest.mark.asyncio
async def test_artifact_bad_inputs(store: Any) -> None:
    artifacts = store.artifact_store
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_bytes("not bytes")
    assert caught.value.path == "data"
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_text(SURROGATE)
    assert caught.value.path == "text"
    with pytest.raises(InvalidPayloadError) as caught:
        await artifacts.put_bytes(b"x", meta={"m": NAN})
    assert caught.value.path == "meta[key #0 (str)]"
