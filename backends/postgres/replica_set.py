"""The read replicas of a store, built from its ``replica_*`` options (:func:`read_router`).

Each replica gets a pool of its own, opened on its first use and holding no connection until then
(``min_size=0``): a replica that is down when the store connects costs nothing and fails nothing,
its checks leave it out until it answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import asyncpg

from .connection import Database, PoolSettings, create_pool
from .options import (
    DEFAULT_REPLICA_CHECK_INTERVAL_SECONDS,
    DEFAULT_REPLICA_MAX_LAG_SECONDS,
    DEFAULT_REPLICA_READ_TIMEOUT_SECONDS,
    StoreOptions,
    check_seconds,
)
from .read_routing import ReadRouter, Replica, RoutingSettings
from .replica_metrics import ReplicaMetrics
from .tables import Tables


def replica_dsns(value: object) -> tuple[str, ...]:
    """``replica_dsn`` as a tuple of DSNs: one string, or a sequence of them; ``None`` for none."""
    if value is None:
        return ()
    dsns = (value,) if isinstance(value, str) else value
    if not isinstance(dsns, list | tuple) or not all(isinstance(dsn, str) and dsn.strip() for dsn in dsns):
        raise TypeError(
            f"replica_dsn takes one DSN (a non-empty string) or a list of them, got {type(value).__name__}"
        )
    return tuple(dsn.strip() for dsn in dsns)


def routing_settings(options: StoreOptions) -> RoutingSettings:
    """The ``replica_*`` timing options, checked (a bad one is a ``ValueError`` naming it)."""
    return RoutingSettings(
        max_lag=check_seconds(
            "replica_max_lag", options.get("replica_max_lag", DEFAULT_REPLICA_MAX_LAG_SECONDS)
        ),
        check_interval=check_seconds(
            "replica_check_interval",
            options.get("replica_check_interval", DEFAULT_REPLICA_CHECK_INTERVAL_SECONDS),
        ),
        read_timeout=check_seconds(
            "replica_read_timeout", options.get("replica_read_timeout", DEFAULT_REPLICA_READ_TIMEOUT_SECONDS)
        ),
    )


def read_router(
    primary_db: Database,
    primary: Tables,
    tables_on: Callable[[Database], Tables],
    options: StoreOptions,
    *,
    pool: PoolSettings,
    store_name: str,
    schema: str,
) -> ReadRouter | None:
    """The router of a store's reads, or ``None`` when ``options`` name no replica."""
    dsns = replica_dsns(options.get("replica_dsn"))
    settings = routing_settings(options)
    if not dsns:
        return None
    replica_pool = dataclasses.replace(pool, min_size=0)
    replicas = []
    for index, dsn in enumerate(dsns):

        async def opener(dsn: str = dsn) -> asyncpg.Pool:
            return await create_pool(dsn, replica_pool)

        db = Database(opener=opener)
        replicas.append(Replica(label=f"replica{index}", db=db, tables=tables_on(db)))
    metrics = (
        ReplicaMetrics(
            store=store_name,
            schema=schema,
            replicas=[replica.label for replica in replicas],
            registry=options.get("registry"),
        )
        if options.get("metrics", True)
        else None
    )
    return ReadRouter(primary_db, primary, replicas, settings, metrics)


__all__ = ["read_router", "replica_dsns", "routing_settings"]
