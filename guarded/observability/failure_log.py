"""Structured failure records, rate-limited per (method, error type), and the count of failures on
an operational condition (``guarded_store_operational_errors_total``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from ..error_classes import error_type, operational_condition, safe_message
from ..outcome import Outcome
from . import telemetry_names as names
from .per_registry import PerRegistry
from .rate_limited_log import RateLimitedLog

logger = logging.getLogger("guarded")


class FailedMethod(Protocol):
    """The method a failure is logged for (a layer's :class:`~guarded.pipeline.call.MethodSetup`)."""

    @property
    def store_name(self) -> str: ...

    @property
    def label(self) -> str:
        """The ``method`` label: ``save_event``, ``artifact_store.get`` ..."""
        ...


class FailureLog:
    """Logs one record per failure kind (method, error type) per interval and counts what it
    suppressed.

    Records carry ``event``, ``store``, ``method``, ``error_type``, ``outcome`` and
    ``suppressed`` as ``extra`` fields — never arguments or payloads.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = RateLimitedLog(interval, log=logger, clock=clock)

    def failure(
        self,
        *,
        store: str,
        method: str,
        error_type: str,
        outcome: str,
        message: str | Callable[[], str],
        level: int = logging.WARNING,
        distinct: bool = False,
    ) -> None:
        """Log one failure of ``method`` (at ``level``: ERROR for a programming error). With
        ``distinct``, failures of one error type with different messages are rate-limited apart.
        ``message`` may be a function making it: only called for a record that is logged (most
        failures of an outage are suppressed), or to tell ``distinct`` ones apart."""
        if distinct and not isinstance(message, str):
            message = message()
        kind = (
            (method, error_type, message[:100])
            if isinstance(message, str) and distinct
            else (method, error_type)
        )
        suppressed = self._log.admit(kind)
        if suppressed is None:
            return
        if not isinstance(message, str):
            message = message()
        self._log.emit(
            suppressed,
            level,
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

    def dead_lettered(self, method: FailedMethod, exc: BaseException) -> None:
        """Log the failure ``exc`` of a write of ``method`` that was dead-lettered (held for
        replay, the caller answered normally)."""
        self.failure(
            store=method.store_name,
            method=method.label,
            error_type=error_type(exc),
            outcome=Outcome.DEAD_LETTERED.value,
            message=safe_message(exc),
        )


class OperationalErrors:
    """``guarded_store_operational_errors_total{store, method, condition}`` of one registry: failures
    on an operational condition (see :func:`guarded.error_classes.operational_condition`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter(
            names.OPERATIONAL_ERRORS,
            "Calls that failed on an operational condition (missing table, missing grant, read-only "
            "database, server shutting down, too many connections ...): held and replayed, never "
            "parked; an operator must act.",
            [names.LABEL_STORE, names.LABEL_METHOD, names.LABEL_CONDITION],
            registry=registry,
        )

    def count(self, store: str, method: str, error: BaseException | None, times: int = 1) -> str | None:
        """Count ``error`` when it reports an operational condition (``times`` writes failed on
        it); returns the condition, ``None`` (and counts nothing) for any other error."""
        condition = operational_condition(error) if error is not None else None
        if condition is not None and times > 0:
            self.counter.labels(store, method, condition).inc(times)
        return condition


operational_errors: PerRegistry[OperationalErrors] = PerRegistry(OperationalErrors)
"""The operational-error counter of a registry, created on first use and shared by every guard."""
