"""The call pipeline: how one store method call runs (entry, the steps of the layers, classification of
failures, watchdog, idempotency, strict mode)."""
