"""Redis backend on redis-py's asyncio client: ``from guarded.backends.redis import RedisStateStore``.

Single node or Redis Cluster, plain Redis 6.2+ / Valkey commands (no modules). See docs/redis.md
for configuration, the key layout, TTLs, durability (``replicas_to_ack``) and error classes.

redis-py is the optional extra ``redis`` (``pip install 'guarded[redis]'``): this package imports
without it (``guarded``'s command line loads the backend's command line from here), and a name
that needs it raises an :class:`ImportError` saying what to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .redis_artifacts import RedisArtifactStore
    from .redis_errors import REDIS_ERRORS, RedisErrors, ReplicasNotAcknowledgedError
    from .redis_keys import KeyLayout, escape_id, unescape_id
    from .redis_options import RedisSettings
    from .redis_store import RedisStateStore

_MODULE_OF = {
    "KeyLayout": "redis_keys",
    "REDIS_ERRORS": "redis_errors",
    "RedisArtifactStore": "redis_artifacts",
    "RedisErrors": "redis_errors",
    "RedisSettings": "redis_options",
    "RedisStateStore": "redis_store",
    "ReplicasNotAcknowledgedError": "redis_errors",
    "escape_id": "redis_keys",
    "unescape_id": "redis_keys",
}

__all__ = [
    "KeyLayout",
    "REDIS_ERRORS",
    "RedisArtifactStore",
    "RedisErrors",
    "RedisSettings",
    "RedisStateStore",
    "ReplicasNotAcknowledgedError",
    "escape_id",
    "unescape_id",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        found = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    except ModuleNotFoundError as exc:
        if exc.name != "redis" and not (exc.name or "").startswith("redis."):
            raise
        raise ImportError(
            f"guarded.backends.redis.{name} needs redis-py: pip install 'guarded[redis]'"
        ) from exc
    globals()[name] = found
    return found
