"""The whole contract suite against RedisStateStore on a real Redis Cluster (a fresh key prefix per
contract). The record types do not meet the cluster: PenguiFlow's are covered on one server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from guarded.backends.redis import RedisStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.testing import StateStoreContract
from guarded.testing.redis_cluster import RedisCluster


class TestRedisClusterStore(StateStoreContract):
    """Every contract of :mod:`guarded.testing.contract`."""

    @pytest_asyncio.fixture
    async def store(self, cluster: RedisCluster, key_prefix: str) -> AsyncIterator[RedisStateStore]:
        store = RedisStateStore(
            cluster.async_client(), prefix=key_prefix, types=DEFAULT_TYPES, owns_client=True
        )
        yield store
        await store.close()
