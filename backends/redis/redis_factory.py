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

from guarded.backend import DURATION_EXAMPLES, parse_duration

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


class ConfigurationError(ValueError):
    """An environment variable has a value the factory cannot use; the message names it."""


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


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(PREFIX + name)
    return value.strip() if value is not None and value.strip() else None


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{PREFIX}{name}={raw!r}: {exc}; write a duration such as {DURATION_EXAMPLES}"
        ) from None


def _integer(env: Mapping[str, str], name: str) -> int | None:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{PREFIX}{name}={raw!r} is not an integer") from None


def config_from_env(env: Mapping[str, str] | None = None) -> RedisFactoryConfig:
    """Read the factory configuration from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    options: dict[str, Any] = {}
    for name, option in _DURATIONS.items():
        raw = _get(env, name)
        if raw is not None and raw.lower() == "none":
            raise ConfigurationError(f"{PREFIX}{name}=none: no key of the store is kept unbounded")
        seconds = _seconds(env, name)
        if seconds is not None:
            options[option] = seconds
    for name, option in _INTEGERS.items():
        number = _integer(env, name)
        if number is not None:
            options[option] = number
    store_name = _get(env, "STORE_NAME")
    if store_name is not None:
        options["name"] = store_name
    cluster = (_get(env, "CLUSTER") or "0").lower()
    if cluster not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ConfigurationError(f"{PREFIX}CLUSTER={cluster!r} must be 1/0, true/false, yes/no or on/off")
    timeout = _seconds(env, "SOCKET_TIMEOUT")
    return RedisFactoryConfig(
        url=_get(env, "URL") or DEFAULT_URL,
        cluster=cluster in ("1", "true", "yes", "on"),
        prefix=_get(env, "PREFIX") or DEFAULT_PREFIX,
        max_connections=_integer(env, "MAX_CONNECTIONS") or DEFAULT_MAX_CONNECTIONS,
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
