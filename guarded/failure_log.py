"""Structured failure records, rate-limited per (method, error type)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger("guarded")


class FailureLog:
    """Logs one record per failure kind per interval and counts what it suppressed.

    Records carry ``event``, ``store``, ``method``, ``error_type``, ``outcome`` and
    ``suppressed`` as ``extra`` fields — never arguments or payloads.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def failure(self, *, store: str, method: str, error_type: str, outcome: str, message: str) -> None:
        key = (method, error_type)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        logger.warning(
            "statestore %s failed on store %r: %s%s; returned %s%s",
            method,
            store,
            error_type,
            f" ({message})" if message else "",
            outcome,
            f" [{suppressed} similar suppressed]" if suppressed else "",
            extra={
                "event": "statestore_call_failed",
                "store": store,
                "method": method,
                "error_type": error_type,
                "outcome": outcome,
                "suppressed": suppressed,
            },
        )
