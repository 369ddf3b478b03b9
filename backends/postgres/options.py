"""Settings of a :class:`~guarded.backends.postgres.PostgresStateStore` other than its pool."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from prometheus_client import CollectorRegistry

from guarded.backend import UnknownSettingError, closest_hint
from guarded.codec import RecordTypes
from guarded.models import ArtifactRetentionConfig

DEFAULT_PAUSE_TTL_SECONDS = 3600.0
"""Spec 000 ``save_planner_state``: "SHOULD set expiration (recommended: 1 hour)"."""
DEFAULT_CONSUME_GRACE_SECONDS = 60.0
"""How long a consumed pause can be consumed again by the same idempotency key."""
DEFAULT_STATS_INTERVAL_SECONDS = 60.0
"""How often table row counts and sizes are sampled for the metrics."""
DEFAULT_REPLICA_MAX_LAG_SECONDS = 10.0
"""A replica further behind than this is left out of the reads."""
DEFAULT_REPLICA_CHECK_INTERVAL_SECONDS = 1.0
"""How often each replica's lag is measured."""
DEFAULT_REPLICA_READ_TIMEOUT_SECONDS = 0.5
"""How long a read (or a check) waits for a replica before the primary answers it."""
DEFAULT_CLEANUP_BATCH = 5_000
"""Rows deleted per statement by :meth:`cleanup` (bounded transactions and lock times)."""


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Maximum ages (seconds since a row was stored) enforced by ``cleanup()``; ``None`` keeps rows forever.

    Pauses and artifacts expire by their own TTLs whatever this says.
    """

    events_max_age: float | None = None
    updates_max_age: float | None = None
    steering_max_age: float | None = None
    planner_events_max_age: float | None = None
    batch_size: int = DEFAULT_CLEANUP_BATCH

    def __post_init__(self) -> None:
        for name in ("events_max_age", "updates_max_age", "steering_max_age", "planner_events_max_age"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"RetentionPolicy.{name} must be a positive number of seconds or None")
        if self.batch_size <= 0:
            raise ValueError("RetentionPolicy.batch_size must be positive")


def check_seconds(name: str, value: float, *, allow_zero: bool = False) -> float:
    """``value`` as a float when it is a finite, positive (or zero) number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}")
    return float(value)


def check_options(caller: str, options: Mapping[str, Any], valid: Collection[str]) -> None:
    """Refuse an option ``caller`` (``"Store.connect()"``) does not know, naming the closest
    valid one (a misspelled option silently ignored would leave its default in force)."""
    for name in options:
        if name not in valid:
            known = ", ".join(sorted(valid))
            raise UnknownSettingError(
                f"{caller} got an unknown option {name!r}{closest_hint(name, valid)}; options: {known}"
            )


class StoreOptions(TypedDict, total=False):
    """Keyword options shared by :meth:`PostgresStateStore.connect`, ``from_pool`` and ``lazy``."""

    name: str
    """Store name for metric labels (default ``"postgres"``)."""
    types: RecordTypes
    """Classes returned by reads (default :func:`guarded.codec.installed_types`: PenguiFlow's own
    classes when it is installed, else guarded's models)."""
    pause_ttl: float
    """Seconds a saved pause stays loadable (default 3600)."""
    consume_grace: float
    """Seconds a consumed pause can be consumed again by the same idempotency key (default 60)."""
    artifact_retention: ArtifactRetentionConfig | None
    """Limits of ``artifact_store`` (default ``ArtifactRetentionConfig()``)."""
    retention: RetentionPolicy | None
    """Maximum ages enforced by :meth:`PostgresStateStore.cleanup` (default: keep everything)."""
    registry: CollectorRegistry | None
    """Prometheus registry for the backend metrics (default the global ``REGISTRY``)."""
    metrics: bool
    """Export backend metrics (default ``True``)."""
    stats_interval: float | None
    """Seconds between table row/size samples (default 60; ``None`` disables sampling)."""
    migrate: bool
    """Apply pending migrations when opening (default ``True``); else require an up-to-date schema."""
    replica_dsn: str | Sequence[str] | None
    """Read replicas (streaming standbys of the primary): one DSN or several. History and list
    reads go to a replica that holds what they must see (``docs/postgres.md``, "Read replicas");
    default none."""
    replica_max_lag: float
    """Seconds a replica may be behind before it is left out of the reads (default 10)."""
    replica_check_interval: float
    """Seconds between two measures of each replica's lag (default 1)."""
    replica_read_timeout: float
    """Seconds a read (or a check) waits for a replica before the primary answers it (default 0.5);
    keep it well under the guard's ``timeout.attempt``."""
    partitioning: str | None
    """``"daily"``, ``"weekly"`` or ``"monthly"``: keep the history tables range-partitioned by time
    with partitions of that period, created ahead on open and hourly (default ``None``: the store
    works on either shape and creates no partitions). See :mod:`.partitioning`."""


__all__ = [
    "StoreOptions",
    "DEFAULT_CLEANUP_BATCH",
    "DEFAULT_CONSUME_GRACE_SECONDS",
    "DEFAULT_PAUSE_TTL_SECONDS",
    "DEFAULT_REPLICA_CHECK_INTERVAL_SECONDS",
    "DEFAULT_REPLICA_MAX_LAG_SECONDS",
    "DEFAULT_REPLICA_READ_TIMEOUT_SECONDS",
    "DEFAULT_STATS_INTERVAL_SECONDS",
    "RetentionPolicy",
    "check_options",
    "check_seconds",
]
