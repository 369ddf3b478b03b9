"""The call pipeline: how one store method call runs (entry, compiled layers, classification of
failures, watchdog, idempotency, strict mode)."""
