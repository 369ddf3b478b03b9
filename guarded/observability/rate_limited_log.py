"""Warnings that repeat at most once per interval per kind, counting what they held back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

_MAX_KINDS = 1024
"""Kinds remembered at most; beyond it the oldest are forgotten (and may log again)."""


class RateLimitedLog:
    """Logs the first record of each kind, then at most one per ``interval`` seconds.

    A record logged after a quiet period says how many of its kind were suppressed
    (``suppressed`` in ``extra``).
    """

    def __init__(
        self,
        interval: float = 60.0,
        *,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval
        self._log = log
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def admit(self, kind: Hashable) -> int | None:
        """Whether a record of ``kind`` may be logged now: ``None`` when one was logged less than
        ``interval`` seconds ago (this one is counted as suppressed), else how many were suppressed
        since the last (the caller logs the record now)."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return None
        if last is None and len(self._last) >= _MAX_KINDS:
            oldest = next(iter(self._last))
            del self._last[oldest]
            self._suppressed.pop(oldest, None)
        self._last[kind] = now
        return self._suppressed.pop(kind, 0)

    def log(
        self,
        kind: Hashable,
        level: int,
        message: str,
        *args: object,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Log ``message % args`` unless a record of ``kind`` was logged less than ``interval``
        seconds ago; returns whether it was logged."""
        suppressed = self.admit(kind)
        if suppressed is None:
            return False
        self.emit(suppressed, level, message, *args, extra=extra)
        return True

    def emit(
        self, suppressed: int, level: int, message: str, *args: object, extra: Mapping[str, Any] | None = None
    ) -> None:
        """Log a record :meth:`admit` let through, saying how many of its kind it suppressed."""
        if suppressed:
            message += " [%d similar suppressed]"
            args = (*args, suppressed)
        self._log.log(level, message, *args, extra={**(extra or {}), "suppressed": suppressed})
