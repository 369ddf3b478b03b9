"""``controller(store)``: the operator's controls of a guard (flush, drain, close, breaker,
statistics, policies), kept off the proxy so they never collide with store methods."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import overload

from .backend import ComposedStore, store_parts_of
from .config import GuardConfig
from .deadletter import DeadLetterBuffer
from .guard_core import GuardCore, core_of
from .health_status import Health, assess_guard, combine
from .layers.breaker import CircuitBreaker
from .layers.bulkhead import Bulkhead
from .policy import MethodPolicy
from .pool_usage import pool_usage_of


@overload
def controller(proxy: ComposedStore) -> ComposedController: ...  # type: ignore[overload-overlap]


@overload
def controller(proxy: object) -> GuardController: ...


def controller(proxy: object) -> GuardController | ComposedController:
    """The controls of a guard proxy: flush, close, breaker, statistics, policies. For a guarded
    composed store (:class:`~guarded.backend.ComposedStore`), the controls of every part."""
    core = core_of(proxy)
    if core is not None:
        return GuardController(core)
    parts = store_parts_of(proxy)
    if parts is not None:
        unguarded = [name for name, part in parts.items() if core_of(part) is None]
        if not unguarded:
            return ComposedController({name: controller(part) for name, part in parts.items()})
    raise TypeError(f"{type(proxy).__qualname__} is not a guarded store (use guarded.guard(store))")


class GuardController:
    """Operator controls of one guard, kept off the proxy so they never collide with store methods."""

    def __init__(self, core: GuardCore) -> None:
        self._core = core

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def config(self) -> GuardConfig:
        return self._core.config

    @property
    def store(self) -> object:
        """The wrapped store."""
        return self._core.target

    @property
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker (``state``, ``force_open()``, ``disable()``, ``reset()``)."""
        return self._core.breaker

    @property
    def bulkhead(self) -> Bulkhead | None:
        """The concurrency limit in front of the backend (``limit``, ``in_use``, ``waiting``),
        ``None`` when there is none (disabled, or a backend that declares no limit)."""
        return self._core.bulkhead

    def policy(self, method: str) -> MethodPolicy:
        """The policy the guard applies to ``method``."""
        return self._core.policies.get(method)

    def stats(self) -> dict[tuple[str, str], int]:
        """Calls made through this guard so far, by (method, outcome); artifact methods are
        ``artifact_store.*``. The same numbers Prometheus scrapes as ``guarded_store_calls_total``."""
        return self._core.instruments.stats.counts(self._core.name)

    def guarded_methods(self) -> list[str]:
        """Names of the store methods the guard wraps."""
        return sorted(self._core.setups)

    @property
    def dead_letters(self) -> DeadLetterBuffer | None:
        """The dead-letter buffer (``stats()``, ``entries()``, ``parked()``), ``None`` when disabled."""
        durability = self._core.durability
        return durability.buffer if durability is not None else None

    def health(self) -> Health:
        """Whether the guard keeps the writes it is given: ``ok``, ``degraded`` (every write is
        kept, but e.g. the breaker is open and writes wait in the spill file) or ``failing`` (the
        guard is closed, or writes are held while the spill file is unusable), with the reasons.
        Reads the guard's state and what the backend reports of its connection pool
        (:class:`~guarded.backend.ReportsPoolUsage`): never waits, never calls the backend's I/O."""
        durability = self._core.durability
        return assess_guard(
            breaker=self._core.breaker,
            bulkhead=self._core.bulkhead,
            buffer=self.dead_letters,
            closed=durability is not None and durability.closed,
            pool=pool_usage_of(self._core.target),
        )

    async def flush(self) -> None:
        """Hand every batched write to the backend now (what fails is dead-lettered)."""
        await self._core.flush()

    @property
    def artifact_dead_letters(self) -> DeadLetterBuffer | None:
        """The dead-letter buffer of artifact puts (its own spill file), ``None`` until the guarded
        ``artifact_store`` was first used, or when artifacts are not dead-lettered."""
        durability = self._core.artifact_durability()
        return durability.buffer if durability is not None else None

    async def drain(self, timeout: float | None = None) -> int:  # noqa: ASYNC109 - a budget
        """Flush, then replay dead-lettered writes (artifact puts too) until none is left or
        ``timeout`` seconds (default ``dead_letter.drain_timeout``) pass; returns how many remain."""
        return await self._core.drain(timeout)

    async def aclose(self) -> None:
        """Flush batches and drain the dead-letter buffer within ``dead_letter.drain_timeout``
        (what is left stays in the spill file for the next process), then close the wrapped store
        when it has ``aclose()`` or ``close()``, within what is left of that budget (at least
        half a second; a close still running then is cancelled and logged)."""
        await self._core.aclose()


class ComposedController:
    """Operator controls of a guarded composed store: one :class:`GuardController` per part
    (``parts["hot"].breaker``); flushing, draining and closing cover every part at once."""

    def __init__(self, parts: Mapping[str, GuardController]) -> None:
        self._parts = MappingProxyType(dict(parts))

    @property
    def parts(self) -> Mapping[str, GuardController]:
        """The controls of each part, by the part's name."""
        return self._parts

    def stats(self) -> dict[tuple[str, str], int]:
        """Calls made through the parts' guards so far, by (method, outcome), summed over the
        parts (a memory write written through to two parts counts once in each)."""
        total: dict[tuple[str, str], int] = {}
        for part in self._parts.values():
            for key, count in part.stats().items():
                total[key] = total.get(key, 0) + count
        return total

    def guarded_methods(self) -> list[str]:
        """Names of the store methods the parts' guards wrap."""
        return sorted({method for part in self._parts.values() for method in part.guarded_methods()})

    def health(self) -> Health:
        """The worst health of the parts (see :meth:`GuardController.health`), every reason's
        message prefixed by the part's name."""
        return combine({name: part.health() for name, part in self._parts.items()})

    async def flush(self) -> None:
        """Hand every part's batched writes to its backend now."""
        await asyncio.gather(*(part.flush() for part in self._parts.values()))

    async def drain(self, timeout: float | None = None) -> int:  # noqa: ASYNC109 - a budget
        """Drain every part at once (see :meth:`GuardController.drain`); how many writes remain
        held in all."""
        left = await asyncio.gather(*(part.drain(timeout) for part in self._parts.values()))
        return sum(left)

    async def aclose(self) -> None:
        """Close every part's guard at once (see :meth:`GuardController.aclose`): a part whose
        backend is down spends its drain budget without delaying the others."""
        await asyncio.gather(*(part.aclose() for part in self._parts.values()))


__all__ = ["ComposedController", "GuardController", "controller"]
