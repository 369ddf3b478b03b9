"""The health of a guard: ``ok``, ``degraded`` or ``failing``, with the reasons, read from the
guard's breaker, bulkhead and dead-letter buffer, and what the backend reports of its connection
pool, without waiting on anything.

The rule it follows: a guard that keeps every write it acknowledges is at worst ``degraded``
(its backend may be down while the spill file takes the writes); one that cannot keep writes
(no usable spill file while writes are held or the breaker is open, dead-lettering off while
the breaker is open, or the guard closed) is ``failing``. Messages carry counts, ages and states
only, never a payload, and are bounded in length.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .deadletter import DeadLetterBuffer
from .layers.breaker import BreakerState, CircuitBreaker
from .layers.bulkhead import Bulkhead
from .pool_usage import PoolUsage

SPILL_NEAR_CAP = 0.9
"""The share of ``dead_letter.max_disk_bytes`` held on disk from which the spill file counts as
near its cap (past the cap, new writes are refused)."""

MESSAGE_LIMIT = 200
"""The longest message of a reason, in characters."""


class HealthStatus(str, enum.Enum):
    """How well a guard keeps the writes it is given, best first."""

    OK = "ok"
    """Nothing is wrong."""
    DEGRADED = "degraded"
    """Every acknowledged write is kept, but something needs attention (the backend is down and
    writes are held in the spill file, the bulkhead is full, ...)."""
    FAILING = "failing"
    """Writes cannot be kept: the guard is closed, or writes are refused or held in memory only."""

    @property
    def rank(self) -> int:
        """0 for ``ok``, 1 for ``degraded``, 2 for ``failing``."""
        return _RANKS[self]


_RANKS = {HealthStatus.OK: 0, HealthStatus.DEGRADED: 1, HealthStatus.FAILING: 2}


@dataclass(frozen=True)
class HealthReason:
    """One thing wrong with a guard: a short stable ``code`` (for alerts and dashboards), a
    ``message`` for people, and the ``status`` it brings the guard to at least."""

    code: str
    message: str
    status: HealthStatus

    def as_json(self) -> dict[str, str]:
        """The reason as a JSON object."""
        return {"code": self.code, "status": self.status.value, "message": self.message}


@dataclass(frozen=True)
class Health:
    """A guard's health: its ``status`` (the worst of its ``reasons``; ``ok`` without any)."""

    status: HealthStatus
    reasons: tuple[HealthReason, ...] = field(default=())

    @property
    def ready(self) -> bool:
        """Whether the guard keeps every write it acknowledges (``ok`` or ``degraded``)."""
        return self.status is not HealthStatus.FAILING

    def as_json(self) -> dict[str, Any]:
        """The health as a JSON object: ``{"status": ..., "reasons": [...]}``."""
        return {"status": self.status.value, "reasons": [reason.as_json() for reason in self.reasons]}


def health_of(reasons: tuple[HealthReason, ...]) -> Health:
    """The health whose status is the worst of ``reasons``."""
    status = max(
        (reason.status for reason in reasons), key=lambda status: status.rank, default=HealthStatus.OK
    )
    return Health(status, reasons)


def _reason(code: str, status: HealthStatus, message: str) -> HealthReason:
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return HealthReason(code, message, status)


def _breaker_reasons(breaker: CircuitBreaker) -> tuple[bool, list[HealthReason]]:
    state = breaker.peek_state()
    if state in (BreakerState.OPEN, BreakerState.FORCED_OPEN):
        how = "forced open" if state is BreakerState.FORCED_OPEN else "open"
        message = f"the circuit breaker is {how}: calls do not reach the backend"
        return True, [_reason("breaker_open", HealthStatus.DEGRADED, message)]
    if state is BreakerState.HALF_OPEN:
        message = "the circuit breaker is half-open: trial calls test whether the backend is back"
        return False, [_reason("breaker_half_open", HealthStatus.DEGRADED, message)]
    return False, []


def _buffer_reasons(buffer: DeadLetterBuffer | None, *, breaker_open: bool) -> list[HealthReason]:
    if buffer is None:
        if not breaker_open:
            return []
        message = "the backend is unavailable and dead-lettering is off: writes are refused"
        return [_reason("writes_refused", HealthStatus.FAILING, message)]
    gauges = buffer.gauges()
    reasons: list[HealthReason] = []
    if gauges.depth:
        message = f"{gauges.depth} writes held for replay, the oldest {gauges.oldest_age:.0f} s old"
        reasons.append(_reason("writes_held", HealthStatus.DEGRADED, message))
    if not buffer.durable:
        if gauges.depth or breaker_open:
            message = "no spill file is configured: held writes are in memory only, lost if the process ends"
            reasons.append(_reason("memory_only", HealthStatus.DEGRADED, message))
        return reasons
    if not buffer.spill_available:
        error = buffer.spill_error
        why = f" ({error})" if error else ""
        if gauges.depth or breaker_open:
            message = f"the spill file takes no writes{why}: writes cannot be kept"
            reasons.append(_reason("spill_unusable", HealthStatus.FAILING, message))
        else:
            message = f"the spill file takes no writes{why}; tried again when a write is held"
            reasons.append(_reason("spill_unusable", HealthStatus.DEGRADED, message))
        return reasons
    cap = buffer.config.max_disk_bytes
    if gauges.disk_bytes >= SPILL_NEAR_CAP * cap:
        share = 100 * gauges.disk_bytes / cap
        message = f"the spill file holds {gauges.disk_bytes} bytes, {share:.0f}% of its cap of {cap}"
        reasons.append(_reason("spill_near_cap", HealthStatus.DEGRADED, message))
    return reasons


def _bulkhead_reasons(bulkhead: Bulkhead | None) -> list[HealthReason]:
    if bulkhead is None or bulkhead.in_use < bulkhead.limit or not bulkhead.waiting:
        return []
    message = (
        f"the bulkhead is saturated: {bulkhead.in_use} of {bulkhead.limit} permits in use, "
        f"{bulkhead.waiting} callers waiting"
    )
    return [_reason("bulkhead_saturated", HealthStatus.DEGRADED, message)]


def _pool_reasons(pool: PoolUsage | None) -> list[HealthReason]:
    if pool is None or not pool.saturated:
        return []
    waiting = ""
    if pool.waiting is not None:
        waiting = f", {pool.waiting} {'caller' if pool.waiting == 1 else 'callers'} waiting"
    message = (
        f"the backend's connection pool is saturated: {pool.in_use} of {pool.max_size} connections "
        f"in use{waiting}"
    )
    return [_reason("pool_saturated", HealthStatus.DEGRADED, message)]


def assess_guard(
    *,
    breaker: CircuitBreaker,
    bulkhead: Bulkhead | None,
    buffer: DeadLetterBuffer | None,
    closed: bool,
    pool: PoolUsage | None = None,
) -> Health:
    """The health of one guard from its parts; ``closed``: the guard was closed; ``pool``: what
    the backend reports of its connection pool (:class:`~guarded.pool_usage.ReportsPoolUsage`)."""
    if closed:
        return health_of(
            (_reason("guard_closed", HealthStatus.FAILING, "the guard is closed: it takes no writes"),)
        )
    breaker_open, reasons = _breaker_reasons(breaker)
    reasons += _buffer_reasons(buffer, breaker_open=breaker_open)
    reasons += _bulkhead_reasons(bulkhead)
    reasons += _pool_reasons(pool)
    return health_of(tuple(reasons))


def combine(parts: Mapping[str, Health]) -> Health:
    """The health of a composed store: the worst part's status, every reason prefixed by the
    part's name (``hot: ...``)."""
    reasons = tuple(
        HealthReason(reason.code, f"{name}: {reason.message}", reason.status)
        for name, health in parts.items()
        for reason in health.reasons
    )
    return health_of(reasons)


__all__ = ["Health", "HealthReason", "HealthStatus", "assess_guard", "combine", "health_of"]
