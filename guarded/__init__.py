"""guarded: make any PenguiFlow StateStore production-safe and observable.

``guard(store)`` wraps a backend in composable layers (tracing, metrics, fallback, circuit
breaker, retry, timeout) so every method is must-not-throw and observable, while the proxy keeps
exactly the store's capabilities. See the README and docs/architecture.md.

This package exports what an application uses: :func:`guard` and :func:`controller`, the
configuration (:class:`GuardConfig` and its sections), the :class:`Outcome` of a call, the
breaker's :class:`BreakerState`, the errors a caller catches, and the :class:`StateStore` protocol.
The rest has a module of its own:

* :mod:`guarded.extension`: writing a layer or a method policy of your own (``Layer``, ``Call``,
  ``MethodPolicy``, ``Kind``, ``PolicyTable``, ``CircuitBreaker``, ...);
* :mod:`guarded.telemetry`: PenguiFlow's task-telemetry sinks (``PrometheusTaskTelemetrySink``,
  ``guard_sink``, ...);
* :mod:`guarded.otlp`: OTLP export (``configure_otlp_from_env``, ``OtlpSetup``, its errors);
* :mod:`guarded.protocol`: the StateStore protocol's capabilities (``capabilities``, ...);
* :mod:`guarded.errors`: every error guarded raises; :mod:`guarded.config`: every setting;
* :mod:`guarded.backend`: the backend interface; :mod:`guarded.models` and :mod:`guarded.codec`:
  the records a store keeps and their JSON form.
"""

from typing import TYPE_CHECKING

from .config import (
    ArtifactFallbackConfig,
    BatchConfig,
    BreakerConfig,
    BulkheadConfig,
    DeadLetterConfig,
    GuardConfig,
    LoggingConfig,
    MethodConfig,
    RetryConfig,
    StaleConfig,
    TimeoutConfig,
)
from .errors import GuardClosedError, GuardedError, InvalidPayloadError, WriteNotKeptError
from .guard import GuardController, GuardedStore, controller, guard
from .layers.breaker import BreakerState
from .outcome import Outcome
from .protocol import StateStore

__version__ = "0.1.0"

__all__ = [
    "ArtifactFallbackConfig",
    "BatchConfig",
    "BreakerConfig",
    "BreakerState",
    "BulkheadConfig",
    "DeadLetterConfig",
    "GuardClosedError",
    "GuardConfig",
    "GuardController",
    "GuardedError",
    "GuardedStore",
    "InvalidPayloadError",
    "LoggingConfig",
    "MethodConfig",
    "Outcome",
    "RetryConfig",
    "StaleConfig",
    "StateStore",
    "TimeoutConfig",
    "WriteNotKeptError",
    "controller",
    "guard",
]

_MOVED: dict[str, str] = {
    **dict.fromkeys(
        (
            "Call",
            "CircuitBreaker",
            "Fallback",
            "Kind",
            "Layer",
            "MethodPolicy",
            "MethodSetup",
            "PolicyTable",
            "Service",
        ),
        "guarded.extension",
    ),
    **dict.fromkeys(
        (
            "FanOutTaskTelemetrySink",
            "GuardedTaskTelemetrySink",
            "LoggingTaskTelemetrySink",
            "NoOpTaskTelemetrySink",
            "OTelTaskTelemetrySink",
            "PrometheusTaskTelemetrySink",
            "guard_sink",
        ),
        "guarded.telemetry",
    ),
    **dict.fromkeys(
        ("OtlpConfigError", "OtlpExporterMissingError", "OtlpSetup", "configure_otlp_from_env"),
        "guarded.otlp",
    ),
    **dict.fromkeys(("capabilities", "missing_capabilities", "require_capabilities"), "guarded.protocol"),
    **dict.fromkeys(("CapabilityError", "SteeringValidationError"), "guarded.errors"),
}
"""Names this package exported before it kept to the application's API, and their module now."""


if not TYPE_CHECKING:  # a module ``__getattr__`` would make the type checker accept any name

    def __getattr__(name: str) -> object:
        home = _MOVED.get(name)
        if home is None:
            raise AttributeError(f"module 'guarded' has no attribute {name!r}")
        # An ImportError, not an AttributeError: ``from guarded import X`` replaces an
        # AttributeError with a bare "cannot import name", and the new home would be lost.
        raise ImportError(f"guarded.{name} has moved: from {home} import {name}", name=name)
