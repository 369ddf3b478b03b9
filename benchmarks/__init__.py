"""Benchmarks: ``python -m benchmarks`` (``make bench``) runs every section against an embedded server."""
