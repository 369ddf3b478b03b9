"""The guard's layers, outermost first: tracing, metrics, fallback, circuit breaker, retry,
bulkhead, timeout.

Each has the same shape (:class:`guarded.pipeline.call.Layer`): ``wrap(inner, method) -> service``.
"""

from ..pipeline.call import Call, Layer, MethodSetup, Service
from .breaker import CircuitBreakerLayer
from .bulkhead import BulkheadLayer
from .fallback import FallbackLayer
from .metrics import MetricsLayer
from .retry import RetryLayer
from .timeout import TimeoutLayer
from .tracing import TracingLayer

__all__ = [
    "BulkheadLayer",
    "Call",
    "CircuitBreakerLayer",
    "FallbackLayer",
    "Layer",
    "MethodSetup",
    "MetricsLayer",
    "RetryLayer",
    "Service",
    "TimeoutLayer",
    "TracingLayer",
]
