"""A task telemetry sink that drops every event."""

from __future__ import annotations


class NoOpTaskTelemetrySink:
    """A PenguiFlow ``TaskTelemetrySink`` that does nothing (telemetry switched off)."""

    async def emit(self, event: object) -> None:
        """Drop ``event``."""
        del event
