"""One task telemetry sink that feeds several."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY, CollectorRegistry

from .guarded_sink import DEFAULT_TIMEOUT, GuardedTaskTelemetrySink, guard_sink


class FanOutTaskTelemetrySink:
    """Emits every event to all ``sinks`` concurrently.

    Each sink is guarded (:func:`~guarded.telemetry.guard_sink`; sinks already guarded keep their
    own settings): one that raises or hangs is counted and logged, and neither delays the others
    beyond ``timeout`` nor reaches the caller. The caller's cancellation propagates.

    Raises:
        TypeError: one of ``sinks`` has no ``emit`` method.
    """

    def __init__(
        self,
        *sinks: object,
        timeout: float = DEFAULT_TIMEOUT,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.sinks: tuple[GuardedTaskTelemetrySink, ...] = tuple(
            guard_sink(sink, timeout=timeout, registry=registry) for sink in sinks
        )
        """The guarded sinks, in the order given."""

    async def emit(self, event: object) -> None:
        """Hand ``event`` to every sink; returns when all took it, failed or timed out."""
        if len(self.sinks) == 1:
            await self.sinks[0].emit(event)
        elif self.sinks:
            await asyncio.gather(*(sink.emit(event) for sink in self.sinks))
