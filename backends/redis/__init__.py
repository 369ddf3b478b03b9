"""The Redis backend (``guarded.backends.redis``)."""
