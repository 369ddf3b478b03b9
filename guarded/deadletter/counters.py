"""One dead-letter buffer's totals since creation, counted together with the registry's metrics
(:mod:`.telemetry`) and the log of dropped writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from .entries import DeadLetterStats
from .held import HeldIndex
from .telemetry import DeadLetterTelemetry, DropLog, Gauges, deadletter_telemetry


class BufferCounters:
    """The totals of one buffer (its :meth:`~.buffer.DeadLetterBuffer.stats`) and its metrics."""

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

    def enqueued(self, method: str) -> None:
        self.telemetry.count_enqueued(self.store_name, method)

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

    def quarantined(self, count: int) -> None:
        self.quarantined_total += count
        self.telemetry.count_quarantined(self.store_name, count)

    def gauges(self, held: HeldIndex, now: float, spill_available: bool | None) -> Gauges:
        """The buffer's gauge values (``spill_available``: ``None`` without a spill file)."""
        return Gauges(
            depth=held.depth,
            memory_bytes=held.memory_bytes,
            disk_bytes=held.disk_bytes,
            oldest_age=held.oldest_age(now),
            parked=held.parked,
            spill_available=spill_available,
        )

    def stats(
        self,
        held: HeldIndex,
        now: float,
        *,
        spill_path: str | None,
        spill_available: bool | None,
        memory_only: int,
    ) -> DeadLetterStats:
        """A snapshot of what ``held`` holds and the totals since creation."""
        return DeadLetterStats(
            depth=held.depth,
            memory_entries=len(held.memory) + len(held.volatile),
            memory_bytes=held.memory_bytes,
            disk_bytes=held.disk_bytes,
            oldest_age=held.oldest_age(now),
            parked=held.parked,
            enqueued_total=self.enqueued_total,
            replayed_total=self.replayed_total,
            dropped_total=self.dropped_total,
            refused_total=self.refused_total,
            parked_total=self.parked_total,
            superseded_total=self.superseded_total,
            adopted_total=self.adopted_total,
            spill_path=spill_path,
            spill_available=spill_available,
            memory_only=memory_only,
            quarantined=held.file_quarantined,
            quarantined_total=self.quarantined_total,
        )


__all__ = ["BufferCounters"]
