"""The whole contract suite against RedisStateStore on a real server."""

from __future__ import annotations

import pytest_asyncio

from guarded.backends.redis import RedisStateStore
from guarded.codec import penguiflow_types
from guarded.testing import StateStoreContract

from .conftest import RedisStoreFactory


class TestRedisStore(StateStoreContract):
    """Every contract of :mod:`guarded.testing.contract`; the ``store`` fixture is in conftest."""


class TestRedisStoreReturningPenguiFlowTypes(StateStoreContract):
    """The same contracts when reads build PenguiFlow's own classes (``types=penguiflow_types()``)."""

    @pytest_asyncio.fixture
    async def store(self, make_redis_store: RedisStoreFactory) -> RedisStateStore:
        return await make_redis_store(types=penguiflow_types())
