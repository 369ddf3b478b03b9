"""Helpers shared by the guard tests: fast configurations, metric readers, records."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry

from guarded.config import (
    BatchConfig,
    BreakerConfig,
    DeadLetterConfig,
    GuardConfig,
    LoggingConfig,
    RetryConfig,
    StaleConfig,
    TimeoutConfig,
)
from guarded.models import StoredEvent

ATTEMPT = 0.05
DEADLINE = 0.2
MARGIN = 0.05
"""A call must return within its deadline plus this much (watchdog tick and scheduling)."""

CALLS = "guarded_store_calls_total"
DURATION_COUNT = "guarded_store_call_duration_seconds_count"
RETRIES = "guarded_store_retries_total"


def fast_config(
    *,
    attempt: float = ATTEMPT,
    deadline: float = DEADLINE,
    max_attempts: int = 3,
    breaker: BreakerConfig | None = None,
    retry: RetryConfig | None = None,
    log_interval: float = 60.0,
    **fields: Any,
) -> GuardConfig:
    """Small timeouts, tiny backoff, breaker off unless given: tests run in milliseconds.

    Batching, dead-lettering and stale reads are off unless given, so the tests of the other
    layers see each call's own outcome; tests/guard/test_durability.py turns them on.
    """
    fields.setdefault("batching", BatchConfig(enabled=False))
    fields.setdefault("dead_letter", DeadLetterConfig(enabled=False, path=None))
    fields.setdefault("stale", StaleConfig(enabled=False))
    return GuardConfig(
        timeout=TimeoutConfig(attempt=attempt, deadline=deadline, critical_deadline=deadline),
        retry=retry
        or RetryConfig(
            max_attempts=max_attempts,
            critical_max_attempts=max_attempts,
            initial_backoff=0.001,
            max_backoff=0.004,
            jitter=0.001,
        ),
        breaker=breaker or BreakerConfig(enabled=False),
        logging=LoggingConfig(interval=log_interval),
        **fields,
    )


def calls(registry: CollectorRegistry, method: str, outcome: str, store: str = "default") -> float:
    """Calls counted for (store, method, outcome); 0 when the series does not exist."""
    value = registry.get_sample_value(CALLS, {"store": store, "method": method, "outcome": outcome})
    return value or 0.0


def retries(registry: CollectorRegistry, method: str, store: str = "default") -> float:
    return registry.get_sample_value(RETRIES, {"store": store, "method": method}) or 0.0


def outcome_counts(registry: CollectorRegistry, store: str = "default") -> dict[str, int]:
    """Calls of ``store`` by outcome (every method), from the registry; outcomes that never
    happened (exported as 0) are left out."""
    counts: dict[str, int] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == CALLS and sample.labels.get("store") == store and sample.value:
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0) + int(sample.value)
    return counts


def event(trace_id: str, index: int = 0, **payload: Any) -> StoredEvent:
    return StoredEvent(trace_id, 1000.0 + index, "node_end", "node", f"n{index}", payload or {"i": index})


class Stopwatch:
    """``with Stopwatch() as watch: ...``; then ``watch.elapsed`` in seconds."""

    def __enter__(self) -> Stopwatch:
        self._started = time.perf_counter()
        self.elapsed = 0.0
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = time.perf_counter() - self._started
