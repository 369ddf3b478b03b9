"""What the live view shows, sampled from the guard's own statistics and metrics registry.

Per method: calls so far by outcome, the call rate and the p99 latency over the last few
seconds (from the call-duration histogram's buckets, so a p99 reads "at most 2.5 ms"). For the
store: circuit breaker state (of each part, for a store guarded part by part), dead-letter depth
and parked writes, acknowledged writes pending in the batcher, replayed writes, and the faults in progress.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from guarded.controller import ComposedController
from guarded.guard import GuardController
from guarded.observability import telemetry_names as names
from guarded.observability.call_stats import CallStats

WINDOW_SECONDS = 5.0
"""Rates and p99 are computed over this trailing window."""
SUCCESS_OUTCOMES = ("ok", "retried", "not_found")
DEGRADED_OUTCOMES = ("dead_lettered", "stale")
FAILED_OUTCOMES = ("timeout", "circuit_open", "fallback", "cancelled")


@dataclass(frozen=True, slots=True)
class MethodRow:
    """One method's line in the live view."""

    method: str
    calls: int
    rate: float
    p99: float | None
    """Upper bound (seconds) of the bucket holding the window's 99th percentile; ``inf`` beyond the
    last bucket, ``None`` without calls in the window."""
    outcomes: dict[str, int]

    def count(self, *outcomes: str) -> int:
        return sum(self.outcomes.get(outcome, 0) for outcome in outcomes)


@dataclass(frozen=True, slots=True)
class Status:
    """One sample of the whole run."""

    elapsed: float
    duration: float
    phase: str
    rows: list[MethodRow]
    circuit: str
    dead_letter_depth: int
    parked: int
    batch_pending: int
    replayed: int
    faults: list[str] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    """Fault events so far: (seconds into the run, what happened)."""

    @property
    def calls(self) -> int:
        return sum(row.calls for row in self.rows)

    @property
    def rate(self) -> float:
        return sum(row.rate for row in self.rows)

    def total(self, *outcomes: str) -> int:
        return sum(row.count(*outcomes) for row in self.rows)


def _percentile(bounds: tuple[float, ...], counts: list[int], share: float) -> float | None:
    total = sum(counts)
    if total <= 0:
        return None
    wanted = share * total
    running = 0
    for index, count in enumerate(counts):
        running += count
        if running >= wanted:
            return bounds[index] if index < len(bounds) else float("inf")
    return float("inf")


class StatusSampler:
    """Samples :class:`Status` for one guard; keeps a short history for rates and p99."""

    def __init__(
        self,
        *,
        stats: CallStats,
        control: GuardController | ComposedController,
        registry: CollectorRegistry,
        duration: float,
        clock: Callable[[], float],
        faults: Callable[[], list[str]] = list,
        events: Callable[[], list[tuple[float, str]]] = list,
        phase: Callable[[], str] = lambda: "running",
    ) -> None:
        self._stats = stats
        self._guards = list(control.parts.values()) if isinstance(control, ComposedController) else [control]
        self._names = {part.name for part in self._guards}
        self._registry = registry
        self._duration = duration
        self._clock = clock
        self._faults = faults
        self._events = events
        self._phase = phase
        self._history: deque[tuple[float, dict[str, list[int]]]] = deque()

    def _buckets(self) -> tuple[dict[str, list[int]], dict[str, dict[str, int]]]:
        buckets: dict[str, list[int]] = {}
        outcomes: dict[str, dict[str, int]] = {}
        for (name, method, outcome), series in list(self._stats.durations.items()):
            if name not in self._names:
                continue
            counts = list(series.counts)
            found = buckets.get(method)
            buckets[method] = counts if found is None else [a + b for a, b in zip(found, counts, strict=True)]
            outcomes.setdefault(method, {})[outcome] = sum(counts)
        return buckets, outcomes

    def _store_samples(self) -> tuple[int, int]:
        pending = replayed = 0.0
        for family in self._registry.collect():
            for sample in family.samples:
                if sample.labels.get(names.LABEL_STORE) not in self._names:
                    continue
                if sample.name == names.BATCH_PENDING:
                    pending += sample.value
                elif sample.name == names.DLQ_REPLAYED:
                    replayed += sample.value
        return int(pending), int(replayed)

    def _circuit(self) -> str:
        """The breaker's state; of each part (``hot open, record closed``) when there are several."""
        if len(self._guards) == 1:
            return self._guards[0].breaker.state.value
        return ", ".join(
            f"{part.name.rsplit('.', 1)[-1]} {part.breaker.state.value}" for part in self._guards
        )

    def sample(self) -> Status:
        """The run as it stands now."""
        now = self._clock()
        buckets, outcomes = self._buckets()
        self._history.append((now, buckets))
        while len(self._history) > 2 and now - self._history[1][0] >= WINDOW_SECONDS:
            self._history.popleft()
        then, old = self._history[0]
        span = now - then
        rows: list[MethodRow] = []
        for method in sorted(buckets):
            counts = buckets[method]
            before = old.get(method, [0] * len(counts))
            window = [a - b for a, b in zip(counts, before, strict=True)]
            in_window = sum(window)
            rows.append(
                MethodRow(
                    method=method,
                    calls=sum(counts),
                    rate=in_window / span if span > 0 else 0.0,
                    p99=_percentile(self._stats.bounds, window, 0.99),
                    outcomes=outcomes[method],
                )
            )
        buffers = [part.dead_letters for part in self._guards if part.dead_letters is not None]
        pending, replayed = self._store_samples()
        return Status(
            elapsed=now,
            duration=self._duration,
            phase=self._phase(),
            rows=rows,
            circuit=self._circuit(),
            dead_letter_depth=sum(buffer.depth for buffer in buffers),
            parked=sum(buffer.gauges().parked for buffer in buffers),
            batch_pending=pending,
            replayed=replayed,
            faults=self._faults(),
            events=list(self._events()),
        )


__all__ = ["DEGRADED_OUTCOMES", "FAILED_OUTCOMES", "SUCCESS_OUTCOMES", "MethodRow", "Status", "StatusSampler"]
