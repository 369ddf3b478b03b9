"""Opening a Redis store in the cross-process tests, on a single server or a cluster alike: the URL
names any node, and the node says whether it is part of a cluster."""

from __future__ import annotations

from typing import Any, TypeVar

import redis

from guarded.backends.redis import RedisStateStore

StoreT = TypeVar("StoreT", bound=RedisStateStore)


def is_cluster(url: str) -> bool:
    """Whether the server at ``url`` is a node of a Redis Cluster (``INFO cluster``)."""
    with redis.Redis.from_url(url, socket_timeout=5) as probe:
        return bool(probe.info("cluster").get("cluster_enabled"))


async def open_store(
    url: str, prefix: str, store_class: type[StoreT] = RedisStateStore, **options: Any
) -> StoreT:  # type: ignore[assignment]
    """A store of ``store_class`` on the server (or the cluster of the node) at ``url``, under
    key ``prefix``; :meth:`~RedisStateStore.close` closes its client."""
    return await store_class.connect(url, cluster=is_cluster(url), prefix=prefix, **options)
