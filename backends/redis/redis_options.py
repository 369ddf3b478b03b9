"""The Redis store's settings: a time to live for every key class (none unbounded), the consume
grace of pauses, the largest value stored, and the replicas each write waits for."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """What a :class:`~.redis_store.RedisStateStore` is built with (every field has a default).

    Every key the store writes has a time to live of its class, refreshed by each write of it:
    nothing in Redis is kept unbounded. ``0``, a negative or a missing TTL is refused
    (:func:`check_settings`, naming the setting)."""

    pause_ttl: float = 3600.0
    """Seconds a saved pause is consumable; a consumed pause's tombstone is kept as long again."""
    consume_grace: float = 60.0
    """Seconds a consume is answered again to a retry with the same idempotency key (and may be
    recovered by the guard's unanswered keys)."""
    memory_ttl: float = 30 * DAY
    """Seconds a memory state (and its session's key index) lives after its last write."""
    session_ttl: float = 7 * DAY
    """Seconds a session's tasks, updates, steering events and indexes live after the last write."""
    trace_ttl: float = 7 * DAY
    """Seconds a trace's events, planner events, trajectory and remote bindings live after the last
    write."""
    artifact_ttl: float = 7 * DAY
    """Seconds an artifact lives when its retention sets no ``ttl_seconds`` of its own."""
    max_value_bytes: int = 16 * 1024 * 1024
    """The largest JSON text stored as one value (Redis takes up to 512 MB): larger is refused as
    bad data (:class:`~guarded.errors.InvalidPayloadError`), so the guard parks it."""
    replicas_to_ack: int = 0
    """Replicas each write waits for (``WAIT``) before it returns; fewer in ``ack_timeout`` raise
    :class:`~.redis_errors.ReplicasNotAcknowledgedError`, which the guard holds and replays."""
    ack_timeout: float = 1.0
    """Seconds a write waits for its ``replicas_to_ack``."""

    def ms(self, name: str) -> int:
        """A TTL setting in milliseconds (at least 1)."""
        return max(1, round(float(getattr(self, name)) * 1000))


_POSITIVE_SECONDS = ("pause_ttl", "memory_ttl", "session_ttl", "trace_ttl", "artifact_ttl", "ack_timeout")


def check_settings(settings: RedisSettings) -> RedisSettings:
    """``settings`` when every value is usable; :class:`ValueError` naming the first that is not."""
    for name in _POSITIVE_SECONDS:
        _seconds(name, getattr(settings, name), allow_zero=False)
    _seconds("consume_grace", settings.consume_grace, allow_zero=True)
    for name, least in (("max_value_bytes", 1), ("replicas_to_ack", 0)):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
    return settings


def _seconds(name: str, value: Any, *, allow_zero: bool) -> None:
    if value is None:
        raise ValueError(f"{name} must be a number of seconds: no Redis key of the store is kept unbounded")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{name} must be more than 0 seconds, got {value!r}: no Redis key of the store is kept unbounded"
        )


SETTING_NAMES: tuple[str, ...] = tuple(field.name for field in fields(RedisSettings))
"""Every setting's name, as :class:`RedisSettings` and the store's keyword arguments spell it."""

__all__ = ["DAY", "SETTING_NAMES", "RedisSettings", "check_settings"]
