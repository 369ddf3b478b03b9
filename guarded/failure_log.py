"""Structured failure records, rate-limited per (method, error type)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .rate_limited_log import RateLimitedLog

logger = logging.getLogger("guarded")


class FailureLog:
    """Logs one record per failure kind (method, error type) per interval and counts what it
    suppressed.

    Records carry ``event``, ``store``, ``method``, ``error_type``, ``outcome`` and
    ``suppressed`` as ``extra`` fields — never arguments or payloads.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = RateLimitedLog(interval, log=logger, clock=clock)

    def failure(self, *, store: str, method: str, error_type: str, outcome: str, message: str) -> None:
        self._log.log(
            (method, error_type),
            logging.WARNING,
            "statestore %s failed on store %r: %s%s; returned %s",
            method,
            store,
            error_type,
            f" ({message})" if message else "",
            outcome,
            extra={
                "event": "statestore_call_failed",
                "store": store,
                "method": method,
                "error_type": error_type,
                "outcome": outcome,
            },
        )
