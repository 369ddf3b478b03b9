"""How full a backend's connection pool is: :class:`PoolUsage`, the snapshot a backend may report
(:class:`ReportsPoolUsage`), read by the guard's health check without waiting on anything."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

logger = logging.getLogger("guarded")

POOL_USAGE = "pool_usage"
"""Name of the method of :class:`ReportsPoolUsage`."""


@dataclass(frozen=True)
class PoolUsage:
    """A snapshot of a connection pool: ``in_use`` connections checked out of at most ``max_size``,
    and ``waiting`` callers waiting for one (``None`` when the pool cannot tell)."""

    in_use: int
    max_size: int
    waiting: int | None = None

    @property
    def saturated(self) -> bool:
        """Whether every connection is checked out and callers wait for one (when the pool cannot
        tell who waits: whether every connection is checked out)."""
        full = self.max_size > 0 and self.in_use >= self.max_size
        return full and (self.waiting is None or self.waiting > 0)


@runtime_checkable
class ReportsPoolUsage(Protocol):
    """A backend with a connection pool may report how full it is; the guard's health check
    (``controller(store).health()``) then answers ``degraded`` with the reason ``pool_saturated``
    while :attr:`PoolUsage.saturated`. Optional: a backend without the method has no such reason."""

    def pool_usage(self) -> PoolUsage | None:
        """The pool's usage now, or ``None`` when there is no pool to report (not opened yet,
        closed). Called on every health check: it must not block, await or do I/O -- read counters
        the pool keeps -- and should not raise (what it raises is logged and taken as ``None``)."""
        ...


def pool_usage_of(store: object) -> PoolUsage | None:
    """What ``store`` reports of its pool (:class:`ReportsPoolUsage`), ``None`` when it reports
    nothing or its report fails."""
    report = getattr(store, POOL_USAGE, None)
    if not callable(report):
        return None
    try:
        usage = report()
    except Exception:
        logger.debug("pool_usage() of %s failed", type(store).__qualname__, exc_info=True)
        return None
    return usage if isinstance(usage, PoolUsage) else None


__all__ = ["POOL_USAGE", "PoolUsage", "ReportsPoolUsage", "pool_usage_of"]
