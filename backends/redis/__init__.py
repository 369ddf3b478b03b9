"""Redis backend on redis-py's asyncio client: ``from guarded.backends.redis import RedisStateStore``.

Single node or Redis Cluster, plain Redis 6.2+ / Valkey commands (no modules). See docs/redis.md
for configuration, the key layout, TTLs, durability (``replicas_to_ack``) and error classes.
"""

from .redis_artifacts import RedisArtifactStore
from .redis_errors import REDIS_ERRORS, RedisErrors, ReplicasNotAcknowledgedError  # registers the classifier
from .redis_keys import KeyLayout, escape_id, unescape_id
from .redis_options import RedisSettings
from .redis_store import RedisStateStore

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
