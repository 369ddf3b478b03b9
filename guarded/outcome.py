"""The outcome of a guarded call: one per logical call, a metric label and a span attribute."""

from enum import Enum


class Outcome(str, Enum):
    """How a call ended."""

    OK = "ok"
    """First attempt succeeded."""
    RETRIED = "retried"
    """Succeeded after one or more retries."""
    NOT_FOUND = "not_found"
    """A single-item read succeeded and found nothing (``None``): not a failure."""
    TIMEOUT = "timeout"
    """Failed by timeout; the fallback was returned."""
    CIRCUIT_OPEN = "circuit_open"
    """Refused by the open breaker without contacting the backend; the fallback was returned."""
    FALLBACK = "fallback"
    """Failed with another error; the fallback was returned."""
    STALE = "stale"
    """Failed; a stale value was served instead of the fallback."""
    DEAD_LETTERED = "dead_lettered"
    """A write failed and was parked in the dead-letter buffer for replay."""
    REJECTED = "rejected"
    """Refused as bad data; never retried."""
    REFUSED = "refused"
    """A write that could not be kept: the backend did not take it and the spill file could not
    commit it (at its byte cap, a full disk, an unusable file), or the backend refused it as older
    than what it holds. Never acknowledged as kept: counted, logged at ERROR, raised in strict
    mode."""
    CANCELLED = "cancelled"
    """The caller cancelled the call; the cancellation propagated."""
