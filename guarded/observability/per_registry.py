"""One object per Prometheus registry: the instruments every guard of a registry shares.

prometheus-client refuses a second metric of the same name in one registry, so each family of
guarded's metrics is built once per registry, on first use, and shared by every guard, buffer and
batcher that reports through it. A registry that is collected takes its objects with it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.registry import Collector

from .multiprocess_metrics import register_scrape_time

T = TypeVar("T")


class PerRegistry(Generic[T]):
    """``per_registry(registry)`` returns the object ``build(registry)`` made for ``registry`` the
    first time it was asked for (the process's default registry when none is given)."""

    def __init__(self, build: Callable[[CollectorRegistry], T]) -> None:
        self._build = build
        self._built: weakref.WeakKeyDictionary[CollectorRegistry, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, registry: CollectorRegistry = REGISTRY) -> T:
        found = self._built.get(registry)
        if found is None:
            with self._lock:  # two threads building at once would register a metric twice
                found = self._built.get(registry)
                if found is None:
                    found = self._built[registry] = self._build(registry)
        return found


def registered(build: Callable[[], T], collector: Callable[[T], Collector] | None = None) -> PerRegistry[T]:
    """One ``build()`` per registry, registered with that registry on first use: through
    ``collector(it)`` when given (statistics a collector reads at scrape time), else itself (it is
    the collector). Either computes its samples when collected
    (:func:`~guarded.observability.multiprocess_metrics.register_scrape_time`)."""

    def make(registry: CollectorRegistry) -> T:
        found = build()
        register_scrape_time(registry, collector(found) if collector is not None else found)  # type: ignore[arg-type]
        return found

    return PerRegistry(make)


__all__ = ["PerRegistry", "registered"]
