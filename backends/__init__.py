"""Storage backends, importable as ``guarded.backends.*``."""
