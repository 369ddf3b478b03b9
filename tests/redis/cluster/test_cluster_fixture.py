"""The cluster fixture is what the cluster tests assume: three masters, each with a replica that
holds its data, and a failover that really promotes the replica and keeps what was replicated."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio.cluster import RedisCluster as ClusterClient

from guarded.testing.redis_cluster import SLOTS, RedisCluster


def test_three_masters_serve_every_slot_and_each_has_a_replica(cluster: RedisCluster) -> None:
    masters = cluster.masters()
    assert len(masters) == 3
    serving = {cluster.master_for_slot(slot).port for slot in (0, SLOTS // 2, SLOTS - 1)}
    assert serving == {master.port for master in masters}
    for master in masters:
        assert len(cluster.replicas_of(master)) == 1


@pytest.mark.asyncio
async def test_a_failover_promotes_the_replica_with_the_replicated_data(
    healthy_cluster: RedisCluster, cluster_client: ClusterClient
) -> None:
    cluster = healthy_cluster
    key = f"fixture:{{{uuid.uuid4().hex}}}"
    slot = cluster.key_slot(key)
    master = cluster.master_for_slot(slot)
    (replica,) = cluster.replicas_of(master)
    with master.client() as direct:
        direct.set(key, "kept")
        assert direct.execute_command("WAIT", 1, 10_000) == 1

    promoted = cluster.fail_over(master)

    assert promoted is replica
    assert not master.running
    assert cluster.master_for_slot(slot) is replica
    assert await cluster_client.get(key) == b"kept"  # the client follows the move by itself

    cluster.restart(master)
    assert cluster.replicas_of(replica) == [master]
    with master.client() as direct:
        direct.execute_command("READONLY")  # a replica answers reads of its own slots
        assert direct.get(key) == "kept"
