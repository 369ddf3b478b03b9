"""``controller(store)``: the operator's controls of a guard (flush, drain, close, breaker,
statistics, policies), kept off the proxy so they never collide with store methods."""

from __future__ import annotations

from .config import GuardConfig
from .deadletter import DeadLetterBuffer
from .guard_core import GuardCore, core_of
from .layers.breaker import CircuitBreaker
from .layers.bulkhead import Bulkhead
from .policy import MethodPolicy


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


__all__ = ["GuardController", "controller"]
