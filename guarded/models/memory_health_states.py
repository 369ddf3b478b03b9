"""Short-term memory health (spec 000 "Memory Health States", spec 003)."""

from enum import Enum


class MemoryHealth(str, Enum):
    """Health of the planner's summarisation subsystem, persisted in the memory state's ``health``."""

    HEALTHY = "healthy"
    RETRY = "retry"
    DEGRADED = "degraded"
    RECOVERING = "recovering"
