"""A real Redis Cluster for the cluster tests: one cluster of three masters with one replica each
per session (see :mod:`guarded.testing.redis_cluster`); a fresh key prefix per test is the parent
directory's ``key_prefix``.

A test that fails a master over brings the killed node back before it ends (it rejoins as a
replica), so the next test finds three masters with a replica each again; the roles and ports of
the masters may have changed, so tests ask the cluster (``master_for_slot``) rather than remember.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.asyncio.cluster import RedisCluster as ClusterClient

from guarded.testing.redis_cluster import RedisCluster, redis_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[RedisCluster]:
    with redis_cluster() as started:
        yield started


@pytest.fixture
def healthy_cluster(cluster: RedisCluster) -> Iterator[RedisCluster]:
    """The session's cluster; any node the test killed is started again afterwards."""
    yield cluster
    for node in cluster.nodes:
        if not node.running:
            cluster.restart(node)


@pytest_asyncio.fixture
async def cluster_client(cluster: RedisCluster) -> AsyncIterator[ClusterClient]:
    """A cluster-aware asyncio client of the session's cluster, closed after the test."""
    client = cluster.async_client()
    yield client
    await client.aclose()
