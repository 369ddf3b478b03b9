"""Store factories for command-line tools, configured from environment variables.

PenguiFlow's admin CLI (and ``guarded check``) load a store from ``module:callable``, sync or
async. Two callables are offered::

    penguiflow-admin history --state-store guarded.backends.postgres.factory:create_store TRACE
    guarded check guarded.backends.postgres.factory:create_store

* :func:`create_store` (async): connects, applies migrations, returns a ready store.
* :func:`create_store_lazy` (sync): returns at once; the pool opens on the first call.
* :func:`create_snapshot_store` (async): the snapshot store (``guarded snapshot --snapshots``) of
  the same database and schema.

Environment variables (all optional; durations as the command line takes them: ``30s``, ``15m``,
``12h``, ``30d``, ``1h30m`` or a plain number of seconds; ``none`` disables a timeout):

=====================================  ===========================================================
``GUARDED_PG_DSN``                     connection string; else ``DATABASE_URL``; else asyncpg's
                                       ``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD``/``PGDATABASE``
``GUARDED_PG_SCHEMA``                  schema (tenant) of the store's tables, default ``public``
``GUARDED_PG_STORE_NAME``              ``store`` label of the metrics, default ``postgres``
``GUARDED_PG_POOL_MIN_SIZE``           pool minimum size, default 2
``GUARDED_PG_POOL_MAX_SIZE``           pool maximum size, default 10
``GUARDED_PG_COMMAND_TIMEOUT``         client-side timeout per statement, default 10
``GUARDED_PG_STATEMENT_TIMEOUT``       server ``statement_timeout``, default 30
``GUARDED_PG_CONNECT_TIMEOUT``         connection timeout, default 10
``GUARDED_PG_APPLICATION_NAME``        ``application_name`` shown in ``pg_stat_activity``, default ``guarded``
``GUARDED_PG_POOLER``                  ``transaction`` behind a connection pooler in transaction mode
                                       (PgBouncer, RDS Proxy, Supavisor), default ``session``
``GUARDED_PG_MIGRATE``                 apply pending migrations on connect (``1``/``0``), default 1
``GUARDED_PG_PAUSE_TTL``               pause (planner state) time to live, default 3600
``GUARDED_PG_CONSUME_GRACE``           repeat window of a consumed pause for the same key, default 60
``GUARDED_PG_METRICS``                 export backend metrics (``1``/``0``), default 1
``GUARDED_PG_STATS_INTERVAL``          seconds between table row/size samples, default 60
``GUARDED_PG_RETENTION_EVENTS``        max age of ``flow_events`` rows for ``cleanup()``, default keep
``GUARDED_PG_RETENTION_UPDATES``       max age of ``state_updates`` rows, default keep
``GUARDED_PG_RETENTION_STEERING``      max age of ``steering_events`` rows, default keep
``GUARDED_PG_RETENTION_PLANNER_EVENTS`` max age of ``planner_events`` rows, default keep
``GUARDED_PG_REPLICA_DSN``             read replicas: one connection string, or several separated by
                                       commas, each beginning ``postgresql://`` (a multi-host
                                       URI's own commas stay with it); default none
``GUARDED_PG_REPLICA_MAX_LAG``         a replica further behind is left out of the reads, default 10
``GUARDED_PG_REPLICA_CHECK_INTERVAL``  seconds between two measures of a replica's lag, default 1
``GUARDED_PG_REPLICA_READ_TIMEOUT``    wait for a replica before the primary answers, default 0.5
``GUARDED_PG_PARTITIONING``            ``daily``, ``weekly`` or ``monthly``: keep the history tables
                                       partitioned by time (see docs/postgres.md, "Partitioned
                                       history"), default unset (``none``): no partition upkeep
``GUARDED_PG_ARTIFACT_<FIELD>``        any ``ArtifactRetentionConfig`` field, upper case, e.g.
                                       ``GUARDED_PG_ARTIFACT_TTL_SECONDS``,
                                       ``GUARDED_PG_ARTIFACT_CLEANUP_STRATEGY``
=====================================  ===========================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from guarded.backend import ConfigurationError, EnvSettings
from guarded.models import ArtifactRetentionConfig

from .connection import PoolSettings
from .options import RetentionPolicy
from .partitioning import check_period
from .pooler import check_pooler
from .schema_names import validate_schema_name
from .snapshots import PostgresSnapshotStore
from .store import PostgresStateStore, StoreOptions

PREFIX = "GUARDED_PG_"
_NEXT_URI = re.compile(r"\s*,\s*(?=postgres(?:ql)?://)")
"""A comma that starts another connection URI (a multi-host URI's own commas do not)."""


@dataclass(frozen=True, slots=True)
class FactoryConfig:
    """Everything :func:`create_store` reads from the environment."""

    dsn: str | None
    schema: str
    pool: PoolSettings
    options: StoreOptions


def _env(env: Mapping[str, str]) -> EnvSettings:
    return EnvSettings(env, PREFIX)


def _pooler(env: Mapping[str, str]) -> str | None:
    raw = _env(env).text("POOLER")
    if raw is None:
        return None
    try:
        return check_pooler(raw, f"{PREFIX}POOLER")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def _artifact_retention(env: Mapping[str, str]) -> ArtifactRetentionConfig:
    values: dict[str, Any] = {}
    for field_name, info in ArtifactRetentionConfig.model_fields.items():
        raw = _env(env).text(f"ARTIFACT_{field_name.upper()}")
        if raw is None:
            continue
        if info.annotation is int:
            values[field_name] = _env(env).integer(f"ARTIFACT_{field_name.upper()}", 0)
        else:
            values[field_name] = raw
    try:
        return ArtifactRetentionConfig(**values)
    except ValueError as exc:
        raise ConfigurationError(f"invalid {PREFIX}ARTIFACT_* setting: {exc}") from None


def config_from_env(env: Mapping[str, str] | None = None) -> FactoryConfig:
    """Read the factory configuration from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    dsn = _env(env).text("DSN") or (env.get("DATABASE_URL") or None)
    schema = _env(env).text("SCHEMA") or "public"
    try:
        validate_schema_name(schema)
    except ValueError as exc:
        raise ConfigurationError(f"{PREFIX}SCHEMA: {exc}") from None
    defaults = PoolSettings()
    pool = PoolSettings(
        min_size=_env(env).integer("POOL_MIN_SIZE", defaults.min_size),
        max_size=_env(env).integer("POOL_MAX_SIZE", defaults.max_size),
        command_timeout=_env(env).duration("COMMAND_TIMEOUT", defaults.command_timeout, nullable=True),
        statement_timeout=_env(env).duration("STATEMENT_TIMEOUT", defaults.statement_timeout, nullable=True),
        connect_timeout=_env(env).duration("CONNECT_TIMEOUT", defaults.connect_timeout)
        or defaults.connect_timeout,
        application_name=_env(env).text("APPLICATION_NAME") or defaults.application_name,
        pooler=_pooler(env),
    )
    options: StoreOptions = {
        "migrate": _env(env).flag("MIGRATE", True),
        "metrics": _env(env).flag("METRICS", True),
        "stats_interval": _env(env).duration("STATS_INTERVAL", 60.0, nullable=True),
        "artifact_retention": _artifact_retention(env),
        "retention": RetentionPolicy(
            events_max_age=_env(env).duration("RETENTION_EVENTS", None, nullable=True),
            updates_max_age=_env(env).duration("RETENTION_UPDATES", None, nullable=True),
            steering_max_age=_env(env).duration("RETENTION_STEERING", None, nullable=True),
            planner_events_max_age=_env(env).duration("RETENTION_PLANNER_EVENTS", None, nullable=True),
        ),
    }
    replicas = _env(env).text("REPLICA_DSN")
    if replicas is not None:
        options["replica_dsn"] = tuple(dsn for dsn in _NEXT_URI.split(replicas) if dsn.strip())
    for setting, option in (
        ("REPLICA_MAX_LAG", "replica_max_lag"),
        ("REPLICA_CHECK_INTERVAL", "replica_check_interval"),
        ("REPLICA_READ_TIMEOUT", "replica_read_timeout"),
    ):
        seconds = _env(env).duration(setting, None)
        if seconds is not None:
            options[option] = seconds  # type: ignore[literal-required]
    name = _env(env).text("STORE_NAME")
    if name is not None:
        options["name"] = name
    pause_ttl = _env(env).duration("PAUSE_TTL", None)
    if pause_ttl is not None:
        options["pause_ttl"] = pause_ttl
    grace = _env(env).text("CONSUME_GRACE")
    if grace is not None:
        try:
            options["consume_grace"] = float(grace)
        except ValueError:
            raise ConfigurationError(f"{PREFIX}CONSUME_GRACE={grace!r} is not a number of seconds") from None
    partitioning = _env(env).text("PARTITIONING")
    if partitioning is not None and partitioning.lower() != "none":
        try:
            options["partitioning"] = check_period(partitioning.lower(), f"{PREFIX}PARTITIONING")
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
    return FactoryConfig(dsn=dsn, schema=schema, pool=pool, options=options)


async def create_store() -> PostgresStateStore:
    """Async factory (``module:callable``): a connected, migrated store configured from the environment."""
    config = config_from_env()
    return await PostgresStateStore.connect(
        config.dsn, schema=config.schema, pool=config.pool, **config.options
    )


async def create_snapshot_store() -> PostgresSnapshotStore:
    """Async factory of the snapshot store in the same schema (``guarded snapshot --snapshots``):
    the ``DSN``, ``SCHEMA``, pool and ``MIGRATE`` variables above."""
    config = config_from_env()
    return await PostgresSnapshotStore.connect(
        config.dsn, schema=config.schema, pool=config.pool, migrate=config.options.get("migrate", True)
    )


def create_store_lazy() -> PostgresStateStore:
    """Sync factory (``module:callable``): a store from the environment that connects on first use."""
    config = config_from_env()
    return PostgresStateStore.lazy(config.dsn, schema=config.schema, pool=config.pool, **config.options)


__all__ = [
    "PREFIX",
    "ConfigurationError",
    "FactoryConfig",
    "config_from_env",
    "create_snapshot_store",
    "create_store",
    "create_store_lazy",
]
