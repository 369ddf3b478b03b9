"""What :func:`guarded.otlp.configure_otlp_from_env` returns: the providers it set up (if any) and
how to flush and stop them."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

__all__ = ["OtlpSetup"]


@dataclass(eq=False)
class OtlpSetup:
    """What :func:`~guarded.otlp.configure_otlp_from_env` set up; ``shutdown()`` flushes and stops it.

    Attributes:
        tracer_provider: the SDK tracer provider exporting spans over OTLP, or ``None`` when
            traces are not exported by guarded (turned off, no endpoint, or the application's
            own provider was kept). With ``set_global=False`` pass it to
            ``guard(..., tracer_provider=...)``.
        meter_provider: the same for metrics.
        traces_endpoint: where spans go, without credentials or query; ``None`` when not exported.
        metrics_endpoint: where metrics go, likewise.
        global_providers: whether the providers above are the OpenTelemetry globals (``set_global``).
        notes: why a signal is not exported (no endpoint set, an application provider kept, ...).
    """

    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    traces_endpoint: str | None
    metrics_endpoint: str | None
    global_providers: bool
    notes: tuple[str, ...] = ()
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    @property
    def exporting(self) -> bool:
        """Whether any signal is exported over OTLP (``False``: OTLP export is off; ``notes`` says why)."""
        return self.tracer_provider is not None or self.meter_provider is not None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export everything recorded so far; ``True`` when every provider finished in time."""
        flushed = True
        if self.tracer_provider is not None:
            flushed = self.tracer_provider.force_flush(timeout_millis) and flushed
        if self.meter_provider is not None:
            flushed = self.meter_provider.force_flush(timeout_millis) and flushed
        return flushed

    def shutdown(self) -> None:
        """Flush queued spans and a last metric collection, then stop exporting. Idempotent.

        Blocks while the exporters send (each request is bounded by the OTLP timeout); from a
        coroutine use :meth:`aclose`. Spans and measurements recorded afterwards are dropped.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()

    async def aclose(self) -> None:
        """:meth:`shutdown` in a worker thread, so the event loop keeps running meanwhile."""
        await asyncio.to_thread(self.shutdown)
