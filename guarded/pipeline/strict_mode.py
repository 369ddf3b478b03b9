"""Strict mode: the caller's bugs raise instead of degrading (for tests and development).

In production a guarded call never throws: a call that does not bind, passes the wrong type, or
that the backend refuses as bad data ends ``rejected`` and is logged. In strict mode such calls
raise to the caller, so a test fails where the bug is. Store failures (timeouts, connection loss,
an open breaker) still degrade exactly as in production: strict mode never changes what an outage
looks like.

Strict mode is on for a guard built with ``GuardConfig(strict=True)`` (or ``GUARDED_STRICT=1`` in
the environment when it is built), and for every guard, whenever built, inside
:func:`guarded.testing.strict` — the switch stamina calls testing mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0


def forced() -> bool:
    """Whether :func:`forcing` is in effect: every guard of the process is strict."""
    return _depth > 0


@contextmanager
def forcing() -> Iterator[None]:
    """Make every guard of the process strict until the block ends (blocks nest)."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
