"""The faults a :class:`~guarded.testing.FaultyStore` applies, and the plans that choose them.

A :class:`Fault` says what happens to one call (an error before or after the store, a hang, a
delay, a stubborn sleep, a canned answer); a :class:`FaultPlan` chooses the fault of each call:
by method and call index (:class:`ScriptedFaults`), by position among every call
(:class:`SequenceFaults`), always the same (:class:`AlwaysFaults`), or seeded at random
(:class:`RandomFaults`). The store that applies them, its injector and its log are in
:mod:`guarded.testing.faulty`.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

ErrorSpec = type[BaseException] | BaseException | Callable[[], BaseException]
"""An exception class (instantiated with a message), an instance (copied per use), or a factory."""


class FaultKind(str, Enum):
    """What a :class:`Fault` does to a call."""

    OK = "ok"
    ERROR_BEFORE = "error_before"
    ERROR_AFTER = "error_after"
    HANG = "hang"
    DELAY = "delay"
    STUBBORN = "stubborn"
    RESPOND = "respond"


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault to apply to one call; build them with the class methods."""

    kind: FaultKind
    error: ErrorSpec | None = None
    seconds: float = 0.0
    value: Any = None

    @classmethod
    def ok(cls) -> Fault:
        """No fault: call the store."""
        return _OK

    @classmethod
    def error_before(cls, error: ErrorSpec = ConnectionRefusedError) -> Fault:
        """Raise ``error`` without calling the store (marked ``reached_backend = False``)."""
        return cls(FaultKind.ERROR_BEFORE, error=error)

    @classmethod
    def error_after(cls, error: ErrorSpec = ConnectionResetError) -> Fault:
        """Call the store, then raise ``error`` (marked ``reached_backend = True``)."""
        return cls(FaultKind.ERROR_AFTER, error=error)

    @classmethod
    def hang(cls) -> Fault:
        """Never return, until :meth:`FaultInjector.release` (then call the store) or cancellation."""
        return cls(FaultKind.HANG)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Sleep ``seconds``, then call the store."""
        return cls(FaultKind.DELAY, seconds=seconds)

    @classmethod
    def stubborn(cls, seconds: float) -> Fault:
        """Sleep ``seconds`` swallowing every cancellation, then call the store."""
        return cls(FaultKind.STUBBORN, seconds=seconds)

    @classmethod
    def respond(cls, value: Any) -> Fault:
        """Return ``value`` without calling the store."""
        return cls(FaultKind.RESPOND, value=value)

    @property
    def calls_store(self) -> bool:
        """Whether the wrapped store's method runs (or, for a hang, would run once released)."""
        return self.kind not in (FaultKind.ERROR_BEFORE, FaultKind.RESPOND)

    def make_error(self, method: str) -> BaseException:
        """A fresh exception for this fault, marked with whether the request reached the backend."""
        spec = self.error if self.error is not None else ConnectionResetError
        if isinstance(spec, BaseException):
            exc = copy.copy(spec)
        elif isinstance(spec, type):
            exc = spec(f"injected {self.kind.value} fault in {method}")
        else:
            exc = spec()
        with contextlib.suppress(AttributeError):  # an exception class with __slots__
            exc.reached_backend = self.kind is FaultKind.ERROR_AFTER  # type: ignore[attr-defined]
        return exc

    def __repr__(self) -> str:
        if self.kind in (FaultKind.ERROR_BEFORE, FaultKind.ERROR_AFTER):
            error = self.error
            name = error.__name__ if isinstance(error, type) else type(error).__name__
            return f"Fault.{self.kind.value}({name})"
        if self.kind in (FaultKind.DELAY, FaultKind.STUBBORN):
            return f"Fault.{self.kind.value}({self.seconds:g})"
        if self.kind is FaultKind.RESPOND:
            return f"Fault.respond({self.value!r})"
        return f"Fault.{self.kind.value}()"


_OK = Fault(FaultKind.OK)


class FaultPlan:
    """Decides the fault of each call. This base class never injects anything.

    Subclass and override :meth:`choose`, or use the constructors below.
    """

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        """The fault for the ``call_index``-th call of ``method``, the ``index``-th call overall."""
        return _OK

    @staticmethod
    def script(
        methods: Mapping[str, Sequence[Fault | None] | Mapping[int, Fault]],
        *,
        default: Fault | None = None,
    ) -> ScriptedFaults:
        """Faults by method and call index: a list (``None`` for no fault) or ``{index: fault}``.

        Calls past the end of a list, and methods not listed, get ``default`` (no fault).
        """
        return ScriptedFaults(methods, default=default)

    @staticmethod
    def sequence(faults: Iterable[Fault | None], *, default: Fault | None = None) -> SequenceFaults:
        """The n-th call of any method gets the n-th fault; calls past the end get ``default``."""
        return SequenceFaults(faults, default=default)

    @staticmethod
    def always(fault: Fault, *, methods: Iterable[str] | None = None) -> AlwaysFaults:
        """Every call (of ``methods``, when given) gets ``fault``: an outage, a slow database."""
        return AlwaysFaults(fault, methods=methods)

    @staticmethod
    def random(
        seed: int | str | None = None,
        *,
        error_before: float = 0.0,
        error_after: float = 0.0,
        hang: float = 0.0,
        delay: float = 0.0,
        stubborn: float = 0.0,
        errors: Sequence[ErrorSpec] = (ConnectionResetError,),
        delay_range: tuple[float, float] = (0.001, 0.01),
        stubborn_seconds: float = 0.05,
        methods: Iterable[str] | None = None,
    ) -> RandomFaults:
        """Each call independently gets a fault with the given probabilities (seeded, reproducible).

        Errors are drawn from ``errors``; delays uniformly from ``delay_range``. The rates must sum
        to at most 1. Only ``methods`` get faults when given.
        """
        return RandomFaults(
            seed,
            rates={
                FaultKind.ERROR_BEFORE: error_before,
                FaultKind.ERROR_AFTER: error_after,
                FaultKind.HANG: hang,
                FaultKind.DELAY: delay,
                FaultKind.STUBBORN: stubborn,
            },
            errors=errors,
            delay_range=delay_range,
            stubborn_seconds=stubborn_seconds,
            methods=methods,
        )


class ScriptedFaults(FaultPlan):
    """See :meth:`FaultPlan.script`."""

    def __init__(
        self,
        methods: Mapping[str, Sequence[Fault | None] | Mapping[int, Fault]],
        *,
        default: Fault | None = None,
    ) -> None:
        self._methods: dict[str, dict[int, Fault]] = {}
        for method, faults in methods.items():
            if isinstance(faults, Mapping):
                self._methods[method] = dict(faults)
            else:
                self._methods[method] = {i: fault for i, fault in enumerate(faults) if fault is not None}
        self._default = default or _OK

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        script = self._methods.get(method)
        if script is None:
            return self._default
        return script.get(call_index, self._default)


class SequenceFaults(FaultPlan):
    """See :meth:`FaultPlan.sequence`."""

    def __init__(self, faults: Iterable[Fault | None], *, default: Fault | None = None) -> None:
        self._faults = [fault or _OK for fault in faults]
        self._default = default or _OK

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        return self._faults[index] if index < len(self._faults) else self._default


class AlwaysFaults(FaultPlan):
    """See :meth:`FaultPlan.always`."""

    def __init__(self, fault: Fault, *, methods: Iterable[str] | None = None) -> None:
        self._fault = fault
        self._methods = None if methods is None else frozenset(methods)

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if self._methods is not None and method not in self._methods:
            return _OK
        return self._fault


class RandomFaults(FaultPlan):
    """See :meth:`FaultPlan.random`."""

    def __init__(
        self,
        seed: int | str | None,
        *,
        rates: Mapping[FaultKind, float],
        errors: Sequence[ErrorSpec],
        delay_range: tuple[float, float],
        stubborn_seconds: float,
        methods: Iterable[str] | None,
    ) -> None:
        if any(rate < 0 for rate in rates.values()) or sum(rates.values()) > 1 + 1e-9:
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1, got {dict(rates)}")
        if not errors and (rates.get(FaultKind.ERROR_BEFORE) or rates.get(FaultKind.ERROR_AFTER)):
            raise ValueError("error faults need at least one entry in errors")
        self._rng = random.Random(seed)
        self._thresholds: list[tuple[float, FaultKind]] = []
        cumulative = 0.0
        for kind, rate in rates.items():
            if rate > 0:
                cumulative += rate
                self._thresholds.append((cumulative, kind))
        self._errors = list(errors)
        self._delay_range = delay_range
        self._stubborn_seconds = stubborn_seconds
        self._methods = None if methods is None else frozenset(methods)

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if self._methods is not None and method not in self._methods:
            return _OK
        rng = self._rng
        draw = rng.random()
        kind = next((kind for threshold, kind in self._thresholds if draw < threshold), None)
        if kind is None:
            return _OK
        if kind is FaultKind.ERROR_BEFORE:
            return Fault.error_before(rng.choice(self._errors))
        if kind is FaultKind.ERROR_AFTER:
            return Fault.error_after(rng.choice(self._errors))
        if kind is FaultKind.DELAY:
            return Fault.delay(rng.uniform(*self._delay_range))
        if kind is FaultKind.STUBBORN:
            return Fault.stubborn(self._stubborn_seconds)
        return Fault.hang()


__all__ = [
    "AlwaysFaults",
    "ErrorSpec",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "RandomFaults",
    "ScriptedFaults",
    "SequenceFaults",
]
