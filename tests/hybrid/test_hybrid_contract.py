"""The whole contract suite against ``guard(HybridStateStore)`` over its real parts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.hybrid_store import HybridStateStore
from guarded.testing import StateStoreContract
from tests.postgres.conftest import StoreFactory

from .conftest import HotFactory


async def guarded_hybrid(make_hot: HotFactory, make_store: StoreFactory, **options: Any) -> Any:
    hybrid = HybridStateStore(hot=await make_hot(), record=await make_store(), **options)
    # Strict: a refused replay raises WriteSupersededError, as the contracts expect of a backend.
    return guard(hybrid, registry=CollectorRegistry(), spill_path=None, strict=True)


class TestGuardedHybridStore(StateStoreContract):
    """Every contract, spec 000's routing: pauses and memory hot, the rest in PostgreSQL."""

    @pytest_asyncio.fixture
    async def store(self, make_hot: HotFactory, make_store: StoreFactory) -> AsyncIterator[Any]:
        store = await guarded_hybrid(make_hot, make_store)
        async with store:
            yield store


class TestGuardedHybridStoreWritingMemoryThrough(StateStoreContract):
    """Every contract with memory written through to PostgreSQL (read hot, falling back)."""

    @pytest_asyncio.fixture
    async def store(self, make_hot: HotFactory, make_store: StoreFactory) -> AsyncIterator[Any]:
        store = await guarded_hybrid(make_hot, make_store, memory_write_through=True)
        async with store:
            yield store
        assert sum(controller(store).stats().values()) >= 0
