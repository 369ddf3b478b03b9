"""The call pipeline: how one store method call runs (entry, compiled layers, classification of
failures, watchdog, circuit breaker, bulkhead, idempotency, strict mode)."""
