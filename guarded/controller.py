"""``controller(store)``: the operator's controls of a guard (flush, drain, close, breaker,
statistics, policies), kept off the proxy so they never collide with store methods."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from .config import GuardConfig
from .deadletter import DeadLetterBuffer
from .durability.artifact_side import artifact_durability
from .pipeline.breaker import CircuitBreaker
from .pipeline.bulkhead import Bulkhead
from .pipeline.cores import core_of
from .pipeline.loops import FORWARD_GRACE
from .policy import MethodPolicy

if TYPE_CHECKING:
    from .guard import GuardCore

logger = logging.getLogger("guarded")

_CLOSE_AT_LEAST = 0.5
"""Seconds ``aclose()`` gives the wrapped store's own close when the drain used the budget."""

R = TypeVar("R")


def controller(proxy: object) -> GuardController:
    """The controls of a guard proxy: flush, close, breaker, statistics, policies."""
    core = core_of(proxy)
    if core is None:
        raise TypeError(f"{type(proxy).__qualname__} is not a guarded store (use guarded.guard(store))")
    return GuardController(core)


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

    async def flush(self) -> None:
        """Hand every batched write to the backend now (what fails is dead-lettered)."""
        durability = self._core.durability
        if durability is not None:
            await self._on_home_loop(durability.flush, self._core.config.dead_letter.drain_timeout)

    async def _on_home_loop(self, start: Callable[[], Awaitable[R]], budget: float) -> R:
        """``start()`` on the event loop that runs the guard (:mod:`guarded.pipeline.loops`),
        waited for at most ``budget`` seconds plus the forwarding grace."""
        result: R = await self._core.home.run(start, budget + FORWARD_GRACE)
        return result

    @property
    def artifact_dead_letters(self) -> DeadLetterBuffer | None:
        """The dead-letter buffer of artifact puts (its own spill file), ``None`` until the guarded
        ``artifact_store`` was first used, or when artifacts are not dead-lettered."""
        durability = artifact_durability(self._core)
        return durability.buffer if durability is not None else None

    async def drain(self, timeout: float | None = None) -> int:  # noqa: ASYNC109 - a budget
        """Flush, then replay dead-lettered writes (artifact puts too) until none is left or
        ``timeout`` seconds (default ``dead_letter.drain_timeout``) pass; returns how many remain."""
        budget = self._core.config.dead_letter.drain_timeout if timeout is None else timeout
        return await self._on_home_loop(lambda: self._drain(budget), budget)

    async def _drain(self, budget: float) -> int:
        durabilities = [
            durability
            for durability in (self._core.durability, artifact_durability(self._core))
            if durability is not None
        ]
        remaining = await asyncio.gather(*(durability.drain(budget) for durability in durabilities))
        return sum(remaining)

    async def aclose(self) -> None:
        """Flush batches and drain the dead-letter buffer within ``dead_letter.drain_timeout``
        (what is left stays in the spill file for the next process), then close the wrapped store
        when it has ``aclose()`` or ``close()``, within what is left of that budget (at least
        half a second; a close still running then is cancelled and logged)."""
        budget = self._core.config.dead_letter.drain_timeout
        await self._on_home_loop(self._aclose, budget + budget + _CLOSE_AT_LEAST)

    async def _aclose(self) -> None:
        budget = self._core.config.dead_letter.drain_timeout
        loop = asyncio.get_running_loop()
        started = loop.time()
        durabilities = [
            durability
            for durability in (self._core.durability, artifact_durability(self._core))
            if durability is not None
        ]
        # Artifact puts drain beside the other writes, within the same budget.
        await asyncio.gather(*(durability.aclose(budget) for durability in durabilities))
        for closer_name in ("aclose", "close"):
            closer = getattr(self._core.target, closer_name, None)
            if callable(closer):
                result = closer()
                if inspect.isawaitable(result):
                    # The store's close gets what is left of the budget (at least
                    # _CLOSE_AT_LEAST): on a server that never answers it would wait on it.
                    left = max(started + budget - loop.time(), _CLOSE_AT_LEAST)
                    try:
                        await asyncio.wait_for(result, timeout=left)
                    except TimeoutError:
                        logger.warning(
                            "store %r did not close within %.1fs; abandoned", self._core.name, left
                        )
                return


__all__ = ["GuardController", "controller"]
