"""Keep the library's log records off the terminal while the live view draws, and remember them.

The guard logs each failure kind once per interval (must-not-throw: log, do not raise). During
the demo those records are collected here instead of being printed over the live view; the
verdict takes the reason of each ``rejected`` call from them.
"""

from __future__ import annotations

import logging
from collections import Counter
from types import TracebackType

CAPTURED_LOGGERS = ("guarded", "asyncpg", "penguiflow", "asyncio")


class LogCapture(logging.Handler):
    """Collects WARNING and above from :data:`CAPTURED_LOGGERS` while active (a context manager)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        """Records by logger name."""
        self.rejections: dict[str, str] = {}
        """Method -> the guard's description of why a call of it was rejected."""
        self._saved: list[tuple[logging.Logger, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.name] += 1
        failed_call = getattr(record, "event", None) == "statestore_call_failed"
        if failed_call and getattr(record, "outcome", None) == "rejected":
            method = str(getattr(record, "method", "?"))
            message = record.getMessage()
            reason = message.split(": ", 1)[-1].rsplit("; returned", 1)[0]
            self.rejections.setdefault(method, reason)

    def __enter__(self) -> LogCapture:
        for name in CAPTURED_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.propagate))
            logger.addHandler(self)
            logger.propagate = False
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for logger, propagate in self._saved:
            logger.removeHandler(self)
            logger.propagate = propagate
        self._saved.clear()


__all__ = ["CAPTURED_LOGGERS", "LogCapture"]
