"""Metrics: one latency observation per logical call, by store, method and final outcome.

Observations go to :class:`~guarded.observability.call_stats.CallStats` (plain counters, exported at scrape
time); the breaker's state is read at scrape time and its transitions are counted by a
prometheus-client counter. Exemplars carry the trace id when the call's span is recording.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ..layers.breaker import BreakerState, CircuitBreaker
from ..observability import telemetry_names as names
from ..observability.call_stats import CallStats, DurationSeries, call_stats
from ..observability.failure_log import OperationalErrors, operational_errors
from ..observability.per_registry import PerRegistry
from ..observability.scrape_time_gauges import ScrapeTimeGauge, scrape_time_gauge
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.loops import abandoned_by_caller
from ..pipeline.steps import Step, StepLayer

_OK = Outcome.OK


@dataclass(frozen=True, slots=True)
class GuardInstruments:
    stats: CallStats
    circuit_state: ScrapeTimeGauge
    circuit_transitions: Counter
    operational: OperationalErrors


def _guard_instruments(registry: CollectorRegistry) -> GuardInstruments:
    return GuardInstruments(
        stats=call_stats(registry),
        circuit_state=scrape_time_gauge(
            registry,
            names.CIRCUIT_STATE,
            "Circuit breaker state: 1 for the current state, 0 for the others.",
            [names.LABEL_STORE, names.LABEL_STATE],
        ),
        circuit_transitions=Counter(
            names.CIRCUIT_TRANSITIONS,
            "Circuit breaker state changes.",
            [names.LABEL_STORE, "from_state", "to_state"],
            registry=registry,
        ),
        operational=operational_errors(registry),
    )


guard_instruments: PerRegistry[GuardInstruments] = PerRegistry(_guard_instruments)
"""The guard's instruments in a registry, created on first use and shared by every guard."""


def publish_breaker_state(instruments: GuardInstruments, store: str, breaker: CircuitBreaker) -> None:
    """Make the state gauge read ``breaker`` at scrape time: exactly its current state reads 1 for
    ``store`` — an open breaker whose wait is over reads ``half_open`` even if no call came since."""
    found = weakref.ref(breaker)
    for candidate in BreakerState:

        def is_current(candidate: BreakerState = candidate) -> float:
            live = found()
            return 1.0 if live is not None and live.peek_state() is candidate else 0.0

        instruments.circuit_state.set_function((store, candidate.value), is_current)


class MetricsLayer(StepLayer):
    """Observes latency and counts each call by its final outcome (cancellations included), and
    each call that failed on an operational condition (``guarded_store_operational_errors_total``)."""

    def __init__(self, instruments: GuardInstruments) -> None:
        self._stats = instruments.stats
        self._operational = instruments.operational

    def step(self, method: MethodSetup, inner: Service) -> Step:
        observe, raised = self._observers(method)

        def failed(call: Call, exc: BaseException) -> Any:
            raised(call, exc)  # strict mode: a rejected call raised, its outcome set
            raise exc

        return Step(ok=observe, failed=failed)

    def _observers(
        self, method: MethodSetup
    ) -> tuple[Callable[[Call, Any], Any], Callable[[Call, BaseException], None]]:
        """Of ``method``: one observation of a call that ended (its duration by outcome, with the
        trace id as exemplar when a span recorded it; its retries; its operational error), which
        returns the call's result it is given (an ``after`` hook as it is), and the same for a
        call that raised (a ``BaseException``: outcome ``cancelled``)."""
        stats = self._stats
        operational = self._operational
        store, label = method.store_name, method.label
        series: dict[Outcome, DurationSeries] = {}
        ok_series: DurationSeries | None = None
        """The usual series, found without hashing an ``Outcome`` (a Python-level ``__hash__``)."""

        def observe(call: Call, result: Any) -> Any:
            nonlocal ok_series
            outcome = call.outcome
            found: DurationSeries | None = ok_series if outcome is _OK else None
            if found is None:
                found = series.get(outcome)
                if found is None:
                    found = series[outcome] = stats.series(store, label, outcome.value)
                if outcome is _OK:
                    ok_series = found
            elapsed = call.loop.time() - call.started  # the loop's own clock (a test's may be set on it)
            span = call.span
            if span is None:
                found.observe(elapsed)
            else:
                found.observe(elapsed, format(span.get_span_context().trace_id, "032x"))
            if call.attempts > 1:
                stats.add_retries(store, label, call.attempts - 1)
            if call.error is not None:
                operational.count(store, label, call.error)
            return result

        def raised(call: Call, exc: BaseException) -> None:
            if not isinstance(exc, Exception):
                if abandoned_by_caller():
                    return  # its caller, on another thread's loop, gave up and counted it
                call.settle(Outcome.CANCELLED)
            observe(call, None)

        return observe, raised
