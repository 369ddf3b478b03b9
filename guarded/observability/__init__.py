"""The guard's own metrics and logging plumbing (call and batch statistics, metric names, rate
limited logs); PenguiFlow task-telemetry sinks live in :mod:`guarded.telemetry`."""
