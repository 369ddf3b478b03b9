"""Helpers of the batching tests: writes, a recording writer over a real store, a blockable writer."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any, TypeVar, overload

from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.batching.batcher import Batcher, PendingWrite, Writer
from guarded.bulk_forms import bulk_args, bulk_method_for
from guarded.config import BatchConfig
from tests.support.aio import settle  # noqa: F401 - shared, re-exported
from tests.support.records import event

LONG = 60.0
"""A delay no test waits out: flushes happen only for the reason under test."""

_stamps = itertools.count()


def event_write(trace_id: str, index: int = 0) -> PendingWrite:
    """A ``save_event`` call for ``trace_id``, stamped and timed now."""
    return PendingWrite(
        method="save_event",
        args=(event(trace_id, index),),
        kwargs={},
        scope=trace_id,
        stamp=next(_stamps),
        queued_at=asyncio.get_running_loop().time(),
    )


def deadline(seconds: float = LONG) -> float:
    return asyncio.get_running_loop().time() + seconds


class StoreWriter:
    """Writes each flush to a real store (bulk method when there is one, else concurrent singles)
    and records every flush; ``gate`` (when set) holds every flush until it is opened."""

    def __init__(self, store: Any, *, gate: asyncio.Event | None = None) -> None:
        self.store = store
        self.gate = gate
        self.flushes: list[tuple[str, list[PendingWrite]]] = []
        self.started: list[list[PendingWrite]] = []
        self.running = 0
        self.max_running = 0
        self.flushed = asyncio.Event()
        """Set once the first flush is written."""

    async def __call__(self, method: str, writes: Sequence[PendingWrite]) -> None:
        self.started.append(list(writes))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.gate is not None:
                await self.gate.wait()
            bulk = bulk_method_for(self.store, method)
            if bulk is not None:
                await getattr(self.store, bulk)(*bulk_args(method, writes))
            else:
                single = getattr(self.store, method)
                await asyncio.gather(*(single(*write.args, **write.kwargs) for write in writes))
            self.flushes.append((method, list(writes)))
            self.flushed.set()
        finally:
            self.running -= 1

    @property
    def written(self) -> list[PendingWrite]:
        return [write for _, writes in self.flushes for write in writes]


W = TypeVar("W", bound=Writer)


@overload
def make(
    writer: None = None, *, registry: CollectorRegistry | None = None, store_name: str = "test", **config: Any
) -> tuple[Batcher, StoreWriter]: ...


@overload
def make(
    writer: W, *, registry: CollectorRegistry | None = None, store_name: str = "test", **config: Any
) -> tuple[Batcher, W]: ...


def make(
    writer: Writer | None = None,
    *,
    registry: CollectorRegistry | None = None,
    store_name: str = "test",
    **config: Any,
) -> tuple[Batcher, Writer]:
    """A batcher (``max_delay`` 60 s unless given) whose writer defaults to a :class:`StoreWriter`
    over a fresh in-memory store; ``config`` fields override :class:`BatchConfig`."""
    writer = writer or StoreWriter(InMemoryStateStore())
    fields: dict[str, Any] = {"max_delay": LONG} | config
    batcher = Batcher(
        BatchConfig(**fields), writer, store_name=store_name, registry=registry or CollectorRegistry()
    )
    return batcher, writer
