"""guarded: make any PenguiFlow StateStore production-safe and observable.

``guard(store)`` wraps a backend in composable layers (tracing, metrics, fallback, circuit
breaker, retry, timeout) so every method is must-not-throw and observable, while the proxy keeps
exactly the store's capabilities. See the README and docs/architecture.md.
"""

from .config import (
    BreakerConfig,
    BulkheadConfig,
    GuardConfig,
    LoggingConfig,
    MethodConfig,
    RetryConfig,
    TimeoutConfig,
)
from .errors import CapabilityError, GuardedError, InvalidPayloadError, SteeringValidationError
from .guard import GuardController, GuardedStore, controller, guard
from .layers.breaker import BreakerState, CircuitBreaker
from .otlp import OtlpConfigError, OtlpExporterMissingError, OtlpSetup, configure_otlp_from_env
from .outcome import Outcome
from .pipeline.call import Call, Layer, MethodSetup, Service
from .policy import Fallback, Kind, MethodPolicy
from .policy_table import PolicyTable
from .protocol import StateStore, capabilities, missing_capabilities, require_capabilities
from .telemetry import (
    FanOutTaskTelemetrySink,
    GuardedTaskTelemetrySink,
    LoggingTaskTelemetrySink,
    NoOpTaskTelemetrySink,
    OTelTaskTelemetrySink,
    PrometheusTaskTelemetrySink,
    guard_sink,
)

__version__ = "0.1.0"

__all__ = [
    "BreakerConfig",
    "BreakerState",
    "BulkheadConfig",
    "Call",
    "CapabilityError",
    "CircuitBreaker",
    "Fallback",
    "FanOutTaskTelemetrySink",
    "GuardConfig",
    "GuardController",
    "GuardedError",
    "GuardedStore",
    "GuardedTaskTelemetrySink",
    "InvalidPayloadError",
    "Kind",
    "Layer",
    "LoggingConfig",
    "LoggingTaskTelemetrySink",
    "MethodConfig",
    "MethodPolicy",
    "MethodSetup",
    "NoOpTaskTelemetrySink",
    "OTelTaskTelemetrySink",
    "OtlpConfigError",
    "OtlpExporterMissingError",
    "OtlpSetup",
    "Outcome",
    "PolicyTable",
    "PrometheusTaskTelemetrySink",
    "RetryConfig",
    "Service",
    "StateStore",
    "SteeringValidationError",
    "TimeoutConfig",
    "capabilities",
    "configure_otlp_from_env",
    "controller",
    "guard",
    "guard_sink",
    "missing_capabilities",
    "require_capabilities",
    "__version__",
]
