"""Helpers shared by the guard tests: fast configurations, records, a stopwatch (metric readers are
in tests/support/metrics.py)."""

from __future__ import annotations

import time
from typing import Any

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
from guarded.guard_core import core_of
from guarded.models import StoredEvent
from tests.support import records

ATTEMPT = 0.05
DEADLINE = 0.2
MARGIN = 0.05
"""A call must return within its deadline plus this much (watchdog tick and scheduling)."""


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


def event(trace_id: str, index: int = 0, **payload: Any) -> StoredEvent:
    return records.event(trace_id, index, payload=payload or None)


class Stopwatch:
    """``with Stopwatch() as watch: ...``; then ``watch.elapsed`` in seconds."""

    def __enter__(self) -> Stopwatch:
        self._started = time.perf_counter()
        self.elapsed = 0.0
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = time.perf_counter() - self._started


def no_background_replay(store: Any) -> None:
    """Held writes wait for the drain at close: the background replay is paced by the clock, and
    its calls to the store (drawing faults from the plan) would make two runs differ."""
    core = core_of(store)
    assert core is not None
    assert core.durability is not None
    core.durability.kick_replay = lambda: None  # type: ignore[method-assign]
