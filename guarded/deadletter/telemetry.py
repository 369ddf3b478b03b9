"""Dead-letter metrics, exported at scrape time, and the structured log of dropped writes.

Counters are plain integers bumped by the buffers; gauges are read from the live buffers when
Prometheus scrapes. One collector per registry serves every buffer registered with it, so
several guards (different store names) share one registry; buffers with the same store name
are summed.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..observability import telemetry_names as names
from ..observability.per_registry import PerRegistry, registered

logger = logging.getLogger("guarded.deadletter")

LABEL_LOCATION = "location"
LABEL_REASON = "reason"

DROP_MEMORY_FULL = "memory_full"
"""``reason`` of parked writes (bad data, answered ``rejected``) held in memory while no spill file
takes them, dropped past the memory caps. A waiting write is never dropped at the caps: a new one is
refused instead (:data:`REFUSE_MEMORY_FULL`)."""
DROP_SPILL_CORRUPT = "spill_corrupt"
"""``reason`` of waiting writes that only a damaged spill file held: the file is renamed aside
(kept for inspection) and they are no longer replayed. ``method`` is ``unknown`` for them."""

REFUSE_DISK_CAP = "disk_cap"
"""``reason`` of writes refused because the spill file holds ``max_disk_bytes`` already."""
REFUSE_DISK_FULL = "disk_full"
"""``reason`` of writes refused because the spill file's disk has no room for them."""
REFUSE_SPILL_UNAVAILABLE = "spill_unavailable"
"""``reason`` of writes refused because the spill file cannot be used (locked, unwritable, damaged
with no fresh file possible)."""
REFUSE_MEMORY_FULL = "memory_full"
"""``reason`` of writes refused by a buffer without a spill file at its memory caps."""
REFUSAL_REASONS = (REFUSE_DISK_CAP, REFUSE_DISK_FULL, REFUSE_SPILL_UNAVAILABLE, REFUSE_MEMORY_FULL)
"""Every value of the ``reason`` label of ``guarded_deadletter_refused_total``."""


@dataclass(frozen=True, slots=True)
class Gauges:
    """What one buffer contributes to the gauges."""

    depth: int
    memory_bytes: int
    disk_bytes: int
    oldest_age: float
    parked: int
    spill_available: bool | None = None
    """Whether the spill file takes writes; ``None`` for a buffer without a spill file."""


class GaugeSource(Protocol):
    """A buffer, as the collector sees it."""

    @property
    def store_name(self) -> str: ...

    def gauges(self) -> Gauges: ...


class DeadLetterTelemetry:
    """Counters of every dead-letter buffer of one registry, and the live buffers for the gauges."""

    def __init__(self) -> None:
        self.enqueued: dict[tuple[str, str], int] = {}
        self.replayed: dict[tuple[str, str], int] = {}
        self.dropped: dict[tuple[str, str, str], int] = {}
        self.refused: dict[tuple[str, str, str], int] = {}
        self.parked: dict[tuple[str, str], int] = {}
        self.superseded: dict[str, int] = {}
        self.quarantined: dict[str, int] = {}
        self.buffers: weakref.WeakSet[GaugeSource] = weakref.WeakSet()

    def count_enqueued(self, store: str, method: str, amount: int = 1) -> None:
        """Writes of ``method`` dead-lettered."""
        key = (store, method)
        self.enqueued[key] = self.enqueued.get(key, 0) + amount

    def count_replayed(self, store: str, method: str, amount: int = 1) -> None:
        """Dead-lettered writes of ``method`` the backend took on replay."""
        key = (store, method)
        self.replayed[key] = self.replayed.get(key, 0) + amount

    def count_dropped(self, store: str, method: str, reason: str, amount: int = 1) -> None:
        """Writes of ``method`` dropped (``reason``: spill_corrupt / memory_full)."""
        key = (store, method, reason)
        self.dropped[key] = self.dropped.get(key, 0) + amount

    def count_refused(self, store: str, method: str, reason: str, amount: int = 1) -> None:
        """Writes of ``method`` refused at the buffer's limits (``reason``: one of
        :data:`REFUSAL_REASONS`)."""
        key = (store, method, reason)
        self.refused[key] = self.refused.get(key, 0) + amount

    def count_parked(self, store: str, method: str, amount: int = 1) -> None:
        """Writes of ``method`` parked as bad data."""
        key = (store, method)
        self.parked[key] = self.parked.get(key, 0) + amount

    def count_superseded(self, store: str, amount: int = 1) -> None:
        """Dead-lettered writes discarded because a newer write of their key won."""
        self.superseded[store] = self.superseded.get(store, 0) + amount

    def count_quarantined(self, store: str, amount: int = 1) -> None:
        """Unreadable spill-file rows moved to the quarantine table."""
        self.quarantined[store] = self.quarantined.get(store, 0) + amount


_Counts = Mapping[str, int] | Mapping[tuple[str, str], int] | Mapping[tuple[str, str, str], int]
"""A counter of :class:`DeadLetterTelemetry`: its value by label values (the store alone, or the
store and method, with the reason for drops)."""


class _Collector(Collector):
    def __init__(self, telemetry: DeadLetterTelemetry) -> None:
        self._telemetry = telemetry

    def collect(self) -> Iterator[Metric]:
        telemetry = self._telemetry
        store = [names.LABEL_STORE]
        store_method = [*store, names.LABEL_METHOD]
        counters: tuple[tuple[str, str, list[str], _Counts], ...] = (
            (names.DLQ_ENQUEUED, "Writes dead-lettered.", store_method, telemetry.enqueued),
            (
                names.DLQ_REPLAYED,
                "Dead-lettered writes replayed to the backend.",
                store_method,
                telemetry.replayed,
            ),
            (names.DLQ_PARKED, "Writes parked as bad data.", store_method, telemetry.parked),
            (
                names.DLQ_DROPPED,
                "Dead-lettered writes lost: only a damaged spill file held them, or parked writes past "
                "the memory caps.",
                [*store_method, LABEL_REASON],
                telemetry.dropped,
            ),
            (
                names.DLQ_REFUSED,
                "Writes refused at the dead-letter buffer's limits (never acknowledged as kept).",
                [*store_method, LABEL_REASON],
                telemetry.refused,
            ),
            (
                names.DLQ_SUPERSEDED,
                "Dead-lettered writes discarded because a newer write for the same key won.",
                store,
                telemetry.superseded,
            ),
            (
                names.DLQ_QUARANTINED,
                "Unreadable spill-file rows moved to the quarantine table (a damaged file).",
                store,
                telemetry.quarantined,
            ),
        )
        for name, doc, labels, counts in counters:
            family = CounterMetricFamily(name, doc, labels=labels)
            for key, value in list(counts.items()):
                family.add_metric([key] if isinstance(key, str) else list(key), value)
            yield family
        yield from self._gauges()

    def _gauges(self) -> Iterator[Metric]:
        totals: dict[str, list[float]] = {}
        available: dict[str, bool] = {}
        buffers: list[GaugeSource] = []
        for _ in range(3):
            try:
                buffers = list(self._telemetry.buffers)
                break
            except RuntimeError:  # a buffer was added by the event loop thread mid-copy
                continue
        for buffer in buffers:
            gauges = buffer.gauges()
            found = totals.setdefault(buffer.store_name, [0, 0, 0, 0.0, 0])
            found[0] += gauges.depth
            found[1] += gauges.memory_bytes
            found[2] += gauges.disk_bytes
            found[3] = max(found[3], gauges.oldest_age)
            found[4] += gauges.parked
            if gauges.spill_available is not None:
                store = buffer.store_name
                available[store] = available.get(store, True) and gauges.spill_available
        depth = GaugeMetricFamily(
            names.DLQ_DEPTH, "Writes waiting in the dead-letter buffer.", labels=[names.LABEL_STORE]
        )
        size = GaugeMetricFamily(
            names.DLQ_BYTES,
            "Encoded size of the waiting writes, by location.",
            labels=[names.LABEL_STORE, LABEL_LOCATION],
        )
        oldest = GaugeMetricFamily(
            names.DLQ_OLDEST_AGE,
            "Age of the oldest waiting write (0 when empty).",
            labels=[names.LABEL_STORE],
        )
        parked = GaugeMetricFamily(
            names.DLQ_PARKED_DEPTH, "Writes parked as bad data.", labels=[names.LABEL_STORE]
        )
        for store, (depth_value, memory, disk, age, parked_value) in totals.items():
            depth.add_metric([store], depth_value)
            size.add_metric([store, "memory"], memory)
            size.add_metric([store, "disk"], disk)
            oldest.add_metric([store], age)
            parked.add_metric([store], parked_value)
        spill = GaugeMetricFamily(
            names.DLQ_SPILL_AVAILABLE,
            "1 while the spill file takes writes, 0 while it cannot (writes that need holding are refused).",
            labels=[names.LABEL_STORE],
        )
        for store, value in available.items():
            spill.add_metric([store], 1.0 if value else 0.0)
        yield depth
        yield size
        yield oldest
        yield parked
        yield spill

    def describe(self) -> Iterator[Metric]:
        store = [names.LABEL_STORE]
        store_method = [names.LABEL_STORE, names.LABEL_METHOD]
        yield CounterMetricFamily(names.DLQ_ENQUEUED, "", labels=store_method)
        yield CounterMetricFamily(names.DLQ_REPLAYED, "", labels=store_method)
        yield CounterMetricFamily(names.DLQ_PARKED, "", labels=store_method)
        yield CounterMetricFamily(names.DLQ_DROPPED, "", labels=[*store_method, LABEL_REASON])
        yield CounterMetricFamily(names.DLQ_REFUSED, "", labels=[*store_method, LABEL_REASON])
        yield CounterMetricFamily(names.DLQ_SUPERSEDED, "", labels=store)
        yield CounterMetricFamily(names.DLQ_QUARANTINED, "", labels=store)
        yield GaugeMetricFamily(names.DLQ_DEPTH, "", labels=store)
        yield GaugeMetricFamily(names.DLQ_BYTES, "", labels=[*store, LABEL_LOCATION])
        yield GaugeMetricFamily(names.DLQ_OLDEST_AGE, "", labels=store)
        yield GaugeMetricFamily(names.DLQ_PARKED_DEPTH, "", labels=store)
        yield GaugeMetricFamily(names.DLQ_SPILL_AVAILABLE, "", labels=store)


deadletter_telemetry: PerRegistry[DeadLetterTelemetry] = registered(DeadLetterTelemetry, _Collector)
"""The dead-letter telemetry of a registry, registered on first use and shared by every buffer."""


class DropLog:
    """Logs dropped writes at most once per interval per (method, reason), counting the rest.

    Records carry ``event``, ``store``, ``method``, ``reason``, ``dropped`` and ``suppressed``
    as ``extra`` fields, never payload contents. With ``refused``, the same for writes refused at
    the buffer's limits (``event`` ``deadletter_refused``; the count is in ``refused``).
    """

    def __init__(
        self,
        store: str,
        *,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        refused: bool = False,
    ) -> None:
        self._store = store
        self._interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], int] = {}
        self._what = "refused" if refused else "dropped"

    def dropped(self, method: str, reason: str, count: int) -> None:
        """Record ``count`` dropped (or refused) writes of ``method``; logs now or folds them into
        the next record."""
        key = (method, reason)
        now = self._clock()
        total = self._pending.pop(key, 0) + count
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._pending[key] = total
            return
        self._last[key] = now
        what = self._what
        logger.error(
            "dead-letter buffer of store %r %s %d %s write(s) (%s): %s",
            self._store,
            what,
            total,
            method,
            reason,
            "not acknowledged, nothing kept was evicted" if what == "refused" else "data loss",
            extra={
                "event": f"deadletter_{what}",
                "store": self._store,
                "method": method,
                "reason": reason,
                what: total,
                "suppressed": total - count,
            },
        )


class BufferCounters:
    """The totals of one buffer (its :meth:`~.buffer.DeadLetterBuffer.stats`), counted with its metrics."""

    def __init__(self, store_name: str, registry: CollectorRegistry) -> None:
        self.store_name = store_name
        self.telemetry: DeadLetterTelemetry = deadletter_telemetry(registry)
        self._drop_log = DropLog(store_name)
        self._refusal_log = DropLog(store_name, refused=True)
        self.enqueued_total = 0
        self.replayed_total = 0
        self.dropped_total = 0
        self.refused_total = 0
        self.parked_total = 0
        self.superseded_total = 0
        self.adopted_total = 0
        self.quarantined_total = 0

    def enqueued(self, methods: Sequence[str]) -> None:
        """Writes of ``methods`` were kept (committed, or held in memory)."""
        for method in methods:
            self.telemetry.count_enqueued(self.store_name, method)
        self.enqueued_total += len(methods)

    def replayed(self, method: str) -> None:
        self.telemetry.count_replayed(self.store_name, method)
        self.replayed_total += 1

    def dropped(self, methods: Sequence[str], reason: str) -> None:
        """Writes of ``methods`` dropped (data loss): counted and logged."""
        self.dropped_total += self._tally(methods, reason, self.telemetry.count_dropped, self._drop_log)

    def refused(self, methods: Sequence[str], reason: str) -> None:
        """Writes of ``methods`` refused at the buffer's limits (never acknowledged): counted and
        logged at ERROR (rate-limited)."""
        self.refused_total += self._tally(methods, reason, self.telemetry.count_refused, self._refusal_log)

    def _tally(
        self, methods: Sequence[str], reason: str, count: Callable[[str, str, str, int], None], log: DropLog
    ) -> int:
        counts: dict[str, int] = {}
        for method in methods:
            counts[method] = counts.get(method, 0) + 1
        for method, amount in counts.items():
            count(self.store_name, method, reason, amount)
            log.dropped(method, reason, amount)
        return len(methods)

    def superseded(self, count: int) -> None:
        if count:
            self.superseded_total += count
            self.telemetry.count_superseded(self.store_name, count)

    def parked(self, method: str) -> None:
        self.parked_total += 1
        self.telemetry.count_parked(self.store_name, method)

    def export(self, source: GaugeSource) -> None:
        """Export ``source``'s gauges (read at scrape time) until :meth:`stop_exporting`."""
        self.telemetry.buffers.add(source)

    def stop_exporting(self, source: GaugeSource) -> None:
        self.telemetry.buffers.discard(source)

    def adopted(self, count: int) -> None:
        self.adopted_total += count

    def quarantined(self, count: int) -> None:
        self.quarantined_total += count
        self.telemetry.count_quarantined(self.store_name, count)


__all__ = [
    "BufferCounters",
    "DROP_MEMORY_FULL",
    "DROP_SPILL_CORRUPT",
    "LABEL_LOCATION",
    "LABEL_REASON",
    "REFUSAL_REASONS",
    "REFUSE_DISK_CAP",
    "REFUSE_DISK_FULL",
    "REFUSE_MEMORY_FULL",
    "REFUSE_SPILL_UNAVAILABLE",
    "DeadLetterTelemetry",
    "DropLog",
    "GaugeSource",
    "Gauges",
    "deadletter_telemetry",
]
