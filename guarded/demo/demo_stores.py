"""The stores ``guarded demo --backend`` runs on, opened unguarded, each with its read-back.

* ``postgres``: ``PostgresStateStore`` on the embedded PostgreSQL (partitioned daily, history and
  list reads on a streaming replica when there is one);
* ``redis``: ``RedisStateStore`` on a ``redis-server`` (or a Redis Cluster, every write waiting
  for one replica's acknowledgement so a failover loses none);
* ``hybrid``: ``HybridStateStore`` over both (pauses and memory in Redis, memory written through
  to PostgreSQL; the rest in PostgreSQL), which ``guard()`` guards part by part.

The read-back of each reads the servers behind the store's back: PostgreSQL's tables with a plain
connection (:mod:`.readback`), Redis through a fresh store of its own (:mod:`.redis_readback`);
the hybrid takes each kind of write from the part its method is routed to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.models import ArtifactRetentionConfig
from guarded.testing.postgres import EmbeddedPostgres

from .ledger import Ledger, WriteKind
from .readback import KIND_METHODS, Snapshot, merge_snapshots, read_back
from .redis_readback import CONCURRENT_READS, read_back_redis

STORE_NAME = "demo"
"""The ``store`` label of every metric the demo exports (``demo.hot`` / ``demo.record`` for the
hybrid's parts)."""
SCHEMA = "demo"
APPLICATION_NAME = "guarded-demo"
"""``application_name`` of the store's connections (what a ``kill`` fault terminates)."""
MAX_ARTIFACT_BYTES = 256 * 1024
"""The demo store's ``max_artifact_bytes``: the ``bad`` fault's oversized artifact is twice this."""
REDIS_PREFIX = "demo"
"""The key prefix of the demo's Redis store."""
POOL_SIZE = 10
"""Connections of the demo store's pool (what the ``overload`` fault crowds)."""
REDIS_EXTRA = "guarded[redis]"
"""What ``pip install`` brings redis-py with."""
REDIS_PACKAGE = "redis-server"
"""The Debian package of the ``redis-server`` the demo starts."""


@dataclass
class DemoStore:
    """The store a run drives (before ``guard()``) and how to read back what it holds."""

    backend: Any
    description: str
    """What the report says the run ran on."""
    stored_in: str
    """Where acknowledged writes must be: ``PostgreSQL``, ``Redis``, ``PostgreSQL and Redis``."""
    read_back: Callable[[Ledger], Awaitable[Snapshot]]
    parts: Mapping[str, str] = field(default_factory=dict)
    """A composed store's parts: name -> the server it runs on (empty for one store)."""


async def open_postgres(
    server: EmbeddedPostgres,
    replica: EmbeddedPostgres | None,
    registry: CollectorRegistry,
    *,
    name: str = STORE_NAME,
) -> PostgresStateStore:
    """The demo's ``PostgresStateStore`` on ``server`` (its reads on ``replica`` when given)."""
    return await PostgresStateStore.connect(
        server.dsn,
        schema=SCHEMA,
        name=name,
        registry=registry,
        stats_interval=2.0,
        pool=PoolSettings(
            min_size=2,
            max_size=POOL_SIZE,
            connect_timeout=2.0,
            command_timeout=10.0,
            application_name=APPLICATION_NAME,
        ),
        artifact_retention=ArtifactRetentionConfig(max_artifact_bytes=MAX_ARTIFACT_BYTES),
        partitioning="daily",  # as a high-volume deployment runs: the dashboard's partition panels show it
        replica_dsn=None if replica is None else replica.dsn,
    )


async def postgres_store(
    server: EmbeddedPostgres, replica: EmbeddedPostgres | None, registry: CollectorRegistry
) -> DemoStore:
    """``--backend postgres``."""
    backend = await open_postgres(server, replica, registry)

    async def read(ledger: Ledger) -> Snapshot:
        return await read_back(server.dsn, SCHEMA)

    replicated = " (reads on a streaming replica)" if replica is not None else ""
    return DemoStore(
        backend, f"guard(PostgresStateStore) on an embedded PostgreSQL{replicated}", "PostgreSQL", read
    )


async def open_redis(
    url: str,
    registry: CollectorRegistry | None,
    *,
    cluster: bool,
    name: str = STORE_NAME,
    metrics: bool = True,
    max_connections: int = POOL_SIZE,
) -> Any:
    """The demo's ``RedisStateStore`` on ``url`` (``cluster``: a Redis Cluster reached through that
    node, every write waiting for one replica), ``max_connections`` per node."""
    from guarded.backends.redis import RedisStateStore  # redis-py is the optional extra REDIS_EXTRA

    return await RedisStateStore.connect(
        url,
        cluster=cluster,
        prefix=REDIS_PREFIX,
        name=name,
        registry=registry,
        metrics=metrics,
        sample_interval=2.0 if metrics else None,
        max_connections=max_connections,
        socket_timeout=2.0,
        artifact_retention=ArtifactRetentionConfig(max_artifact_bytes=MAX_ARTIFACT_BYTES),
        replicas_to_ack=1 if cluster else 0,
    )


def _redis_reader(
    url: str, *, cluster: bool, kinds: tuple[WriteKind, ...]
) -> Callable[[Ledger], Awaitable[Snapshot]]:
    async def read(ledger: Ledger) -> Snapshot:
        reader = await open_redis(
            url,
            None,
            cluster=cluster,
            name="demo-readback",
            metrics=False,
            max_connections=2 * CONCURRENT_READS,
        )
        try:
            return await read_back_redis(reader, ledger, kinds)
        finally:
            await reader.close()

    return read


async def redis_store(url: str, registry: CollectorRegistry, *, cluster: bool, where: str) -> DemoStore:
    """``--backend redis`` on ``url``; ``where`` says which server for the report."""
    backend = await open_redis(url, registry, cluster=cluster)
    return DemoStore(
        backend,
        f"guard(RedisStateStore) on {where}",
        "Redis",
        _redis_reader(url, cluster=cluster, kinds=tuple(WriteKind)),
    )


async def hybrid_store(
    server: EmbeddedPostgres, url: str, registry: CollectorRegistry, *, where: str
) -> DemoStore:
    """``--backend hybrid``: pauses and memory in Redis at ``url`` (memory written through to
    PostgreSQL), the rest in PostgreSQL on ``server``."""
    from guarded.backends.hybrid_store import HOT, HybridStateStore

    record = await open_postgres(server, None, registry, name=f"{STORE_NAME}.record")
    try:
        hot = await open_redis(url, registry, cluster=False, name=f"{STORE_NAME}.hot")
    except BaseException:
        await record.close()
        raise
    hybrid = HybridStateStore(hot=hot, record=record, memory_write_through=True)
    hot_kinds = tuple(kind for kind in WriteKind if hybrid.part_of(KIND_METHODS[kind]) == HOT)
    read_hot = _redis_reader(url, cluster=False, kinds=hot_kinds)

    async def read(ledger: Ledger) -> Snapshot:
        from_record = await read_back(server.dsn, SCHEMA)
        from_hot = await read_hot(ledger)
        return merge_snapshots({kind: from_hot if kind in hot_kinds else from_record for kind in WriteKind})

    hot_names = ", ".join(kind.value for kind in hot_kinds)
    return DemoStore(
        hybrid,
        f"guard(HybridStateStore): {hot_names} in Redis ({where}), the rest in an embedded PostgreSQL",
        "PostgreSQL and Redis",
        read,
        parts={"hot": "Redis", "record": "PostgreSQL"},
    )


__all__ = [
    "APPLICATION_NAME",
    "MAX_ARTIFACT_BYTES",
    "POOL_SIZE",
    "REDIS_EXTRA",
    "REDIS_PACKAGE",
    "REDIS_PREFIX",
    "SCHEMA",
    "STORE_NAME",
    "DemoStore",
    "hybrid_store",
    "open_postgres",
    "open_redis",
    "postgres_store",
    "redis_store",
]
