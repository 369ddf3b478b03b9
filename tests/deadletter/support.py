"""Helpers of the dead-letter tests: configurations, records, metric readers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer
from guarded.models import StoredEvent
from tests.support import metrics, records

STORE = "primary"


def config(path: Path | str | None, **fields: Any) -> DeadLetterConfig:
    """A dead-letter configuration with ``path`` (``None``: memory only)."""
    return DeadLetterConfig(path=None if path is None else str(path), **fields)


def buffer(
    path: Path | str | None,
    registry: CollectorRegistry | None = None,
    *,
    store: str = STORE,
    monotonic: Callable[[], float] | None = None,
    **fields: Any,
) -> DeadLetterBuffer:
    """A buffer with its own registry unless one is given (``monotonic``: the clock of replay
    backoffs and spill-file retries, for tests that step time)."""
    if monotonic is None:
        return DeadLetterBuffer(
            config(path, **fields), store_name=store, registry=registry or CollectorRegistry()
        )
    return DeadLetterBuffer(
        config(path, **fields),
        store_name=store,
        registry=registry or CollectorRegistry(),
        monotonic=monotonic,
    )


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def event(trace_id: str | None, index: int, **payload: Any) -> StoredEvent:
    return records.event(
        trace_id, index, base=1_700_000_000.0, kind="node_success", payload={"i": index, **payload}
    )


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value, 0 when the series does not exist."""
    return metrics.sample(registry, name, **{"store": STORE, **labels})


async def put_events(target: DeadLetterBuffer, trace_id: str, count: int, *, start: int = 0) -> None:
    for index in range(start, start + count):
        await target.put(
            "save_event", (event(trace_id, index),), {}, scope=trace_id, stamp=index, error="ConnectionError"
        )
