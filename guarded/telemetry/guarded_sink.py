"""``guard_sink(sink)``: a task telemetry sink that can fail or hang without harming its caller.

PenguiFlow emits task telemetry from tasks it creates and never awaits, so an exception from a
sink ends up as "Task exception was never retrieved" and a hanging sink piles up tasks. The
guarded sink gives each emit a time budget, swallows and counts failures
(``guarded_task_sink_errors_total`` by sink and reason), logs them rate-limited with the error
type only, and lets the caller's cancellation through.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from ..error_classes import error_type, safe_message
from ..observability import telemetry_names as names
from ..observability.per_registry import PerRegistry
from ..observability.rate_limited_log import RateLimitedLog

TASK_SINK_ERRORS = names.TASK_SINK_ERRORS
LABEL_SINK = names.LABEL_SINK
LABEL_REASON = names.LABEL_REASON
REASON_TIMEOUT = "timeout"
REASON_ERROR = "error"

DEFAULT_TIMEOUT = 1.0
"""Seconds a guarded sink may spend on one event."""


def _sink_errors(registry: CollectorRegistry) -> Counter:
    return Counter(
        TASK_SINK_ERRORS,
        "Task telemetry events a sink failed to take (raised or timed out).",
        [LABEL_SINK, LABEL_REASON],
        registry=registry,
    )


sink_errors_counter: PerRegistry[Counter] = PerRegistry(_sink_errors)
"""The ``guarded_task_sink_errors_total`` counter of a registry, registered on first use."""


class GuardedTaskTelemetrySink:
    """Wraps a task telemetry sink so that ``emit`` never raises (except the caller's
    cancellation) and never takes longer than ``timeout`` seconds. Build it with :func:`guard_sink`.

    The wrapped sink's ``emit`` runs in its own task (it sees the caller's context, so its
    current span): a sink that ignores cancellation still cannot hold the caller past the timeout.
    """

    def __init__(
        self,
        sink: object,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        name: str | None = None,
        registry: CollectorRegistry = REGISTRY,
        log_interval: float = 60.0,
    ) -> None:
        emit = getattr(sink, "emit", None)
        if not callable(emit):
            raise TypeError(
                f"{type(sink).__qualname__} is not a task telemetry sink: it has no emit(event) method"
            )
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.sink = sink
        """The wrapped sink."""
        self.name = name or type(sink).__name__
        self._emit = emit
        self._timeout = float(timeout)
        self._errors = sink_errors_counter(registry)
        self._timeouts = self._errors.labels(self.name, REASON_TIMEOUT)
        self._failures = self._errors.labels(self.name, REASON_ERROR)
        self._log = RateLimitedLog(log_interval, log=logging.getLogger("guarded.telemetry"))
        self._running: set[asyncio.Future[Any]] = set()

    @property
    def running(self) -> int:
        """Emits of the wrapped sink still running (timed out and not yet finished included)."""
        return len(self._running)

    async def emit(self, event: object) -> None:
        """Hand ``event`` to the wrapped sink; failures and timeouts are counted and logged."""
        try:
            result = self._emit(event)
        except Exception as exc:
            self._failed(REASON_ERROR, exc)
            return
        if not inspect.isawaitable(result):
            return
        future = asyncio.ensure_future(result)
        self._running.add(future)
        future.add_done_callback(self._finished)
        try:
            done, _ = await asyncio.wait((future,), timeout=self._timeout)
        except BaseException:
            future.cancel()
            raise
        if not done:
            future.cancel()
            self._failed(REASON_TIMEOUT, None)
        elif future.cancelled():
            self._failed(REASON_ERROR, asyncio.CancelledError())
        else:
            error = future.exception()
            if error is not None:
                self._failed(REASON_ERROR, error)

    def _finished(self, future: asyncio.Future[Any]) -> None:
        self._running.discard(future)
        if not future.cancelled():
            future.exception()  # retrieved: a late failure after a timeout is not reported again

    def _failed(self, reason: str, error: BaseException | None) -> None:
        (self._timeouts if reason == REASON_TIMEOUT else self._failures).inc()
        kind = error_type(error) if error is not None else "TimeoutError"
        detail = safe_message(error) if error is not None else f"no answer within {self._timeout:g} s"
        self._log.log(
            (reason, kind),
            logging.WARNING,
            "task telemetry sink %r dropped an event: %s%s",
            self.name,
            kind,
            f" ({detail})" if detail else "",
            extra={
                "event": "task_telemetry_sink_failed",
                "sink": self.name,
                "reason": reason,
                "error_type": kind,
            },
        )


def guard_sink(
    sink: object,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    name: str | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> GuardedTaskTelemetrySink:
    """``sink`` made safe for its caller: a time budget per event, failures counted and logged
    (rate-limited, error type only), never raised; the caller's cancellation propagates.

    Args:
        sink: any object with ``emit(event)`` (async or not).
        timeout: seconds one emit may take; beyond it the emit is cancelled and counted.
        name: the ``sink`` label of ``guarded_task_sink_errors_total`` (the class name by default).
        registry: the Prometheus registry of that counter.

    Raises:
        TypeError: ``sink`` has no ``emit`` method.
        ValueError: ``timeout`` is not a positive number.
    """
    if isinstance(sink, GuardedTaskTelemetrySink) and name is None:
        return sink
    return GuardedTaskTelemetrySink(sink, timeout=timeout, name=name, registry=registry)
