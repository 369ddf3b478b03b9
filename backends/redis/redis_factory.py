"""Store factories for command-line tools, configured from environment variables::

    guarded check guarded.backends.redis.redis_factory:create_store
    penguiflow-admin history --state-store guarded.backends.redis.redis_factory:create_store TRACE

Environment variables (all optional; durations as the command line takes them: ``30s``, ``15m``,
``12h``, ``30d`` or a plain number of seconds):

==================================  ==============================================================
``GUARDED_REDIS_URL``               ``redis://[user:password@]host:port/db`` (``rediss://`` for
                                    TLS), default ``redis://localhost:6379/0``
``GUARDED_REDIS_CLUSTER``           ``1``: the URL names a node of a Redis Cluster, default 0
``GUARDED_REDIS_PREFIX``            the key prefix (deployment or tenant), default ``guarded``
``GUARDED_REDIS_STORE_NAME``        the store's name, default ``redis``
``GUARDED_REDIS_MAX_CONNECTIONS``   connection pool size (and the guard's bulkhead), default 32
``GUARDED_REDIS_SOCKET_TIMEOUT``    client timeout of a command and a connect, default 10
``GUARDED_REDIS_PAUSE_TTL``         pause TTL (and its tombstone's), default 1h
``GUARDED_REDIS_CONSUME_GRACE``     repeat window of a consumed pause for the same key, default 60
``GUARDED_REDIS_MEMORY_TTL``        memory state TTL after its last write, default 30d
``GUARDED_REDIS_SESSION_TTL``       tasks, updates, steering, session indexes, default 7d
``GUARDED_REDIS_TRACE_TTL``         events, planner events, trajectories, bindings, default 7d
``GUARDED_REDIS_ARTIFACT_TTL``      artifacts without a retention ``ttl_seconds``, default 7d
``GUARDED_REDIS_MAX_VALUE_BYTES``   the largest JSON value stored, default 16 MiB
``GUARDED_REDIS_REPLICAS_TO_ACK``   replicas each write waits for (``WAIT``), default 0
``GUARDED_REDIS_ACK_TIMEOUT``       how long a write waits for them, default 1
==================================  ==============================================================

A TTL of ``0`` or ``none`` is refused: no key of the store is kept unbounded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from guarded.backend import ConfigurationError, EnvSettings

from .redis_store import DEFAULT_MAX_CONNECTIONS, DEFAULT_PREFIX, RedisStateStore

PREFIX = "GUARDED_REDIS_"
DEFAULT_URL = "redis://localhost:6379/0"

_DURATIONS = {
    "PAUSE_TTL": "pause_ttl",
    "CONSUME_GRACE": "consume_grace",
    "MEMORY_TTL": "memory_ttl",
    "SESSION_TTL": "session_ttl",
    "TRACE_TTL": "trace_ttl",
    "ARTIFACT_TTL": "artifact_ttl",
    "ACK_TIMEOUT": "ack_timeout",
}
_INTEGERS = {"MAX_VALUE_BYTES": "max_value_bytes", "REPLICAS_TO_ACK": "replicas_to_ack"}


@dataclass(frozen=True, slots=True)
class RedisFactoryConfig:
    """Everything :func:`create_store` reads from the environment."""

    url: str
    cluster: bool
    prefix: str
    max_connections: int
    socket_timeout: float
    options: dict[str, Any]

    @property
    def url_without_password(self) -> str:
        """The URL with any password replaced by ``***`` (for messages)."""
        scheme, _, rest = self.url.partition("://")
        credentials, at, place = rest.rpartition("@")
        if not at:
            return self.url
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{place}" if ":" in credentials else f"{scheme}://{user}@{place}"


def config_from_env(env: Mapping[str, str] | None = None) -> RedisFactoryConfig:
    """Read the factory configuration from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    read = EnvSettings(env, PREFIX)
    options: dict[str, Any] = {}
    for name, option in _DURATIONS.items():
        raw = read.text(name)
        if raw is not None and raw.lower() == "none":
            raise ConfigurationError(f"{PREFIX}{name}=none: no key of the store is kept unbounded")
        seconds = read.duration(name, None)
        if seconds is not None:
            options[option] = seconds
    for name, option in _INTEGERS.items():
        number = read.optional_integer(name)
        if number is not None:
            options[option] = number
    store_name = read.text("STORE_NAME")
    if store_name is not None:
        options["name"] = store_name
    timeout = read.duration("SOCKET_TIMEOUT", 10.0)
    return RedisFactoryConfig(
        url=read.text("URL") or DEFAULT_URL,
        cluster=read.flag("CLUSTER", False),
        prefix=read.text("PREFIX") or DEFAULT_PREFIX,
        max_connections=read.optional_integer("MAX_CONNECTIONS") or DEFAULT_MAX_CONNECTIONS,
        socket_timeout=10.0 if timeout is None else timeout,
        options=options,
    )


async def create_store() -> RedisStateStore:
    """A connected :class:`RedisStateStore` configured from the environment (module docs)."""
    config = config_from_env()
    try:
        return await RedisStateStore.connect(
            config.url,
            cluster=config.cluster,
            prefix=config.prefix,
            max_connections=config.max_connections,
            socket_timeout=config.socket_timeout,
            **config.options,
        )
    except ValueError as exc:
        raise ConfigurationError(f"{PREFIX}*: {exc}") from None


__all__ = [
    "DEFAULT_URL",
    "PREFIX",
    "ConfigurationError",
    "RedisFactoryConfig",
    "config_from_env",
    "create_store",
]
