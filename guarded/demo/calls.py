"""One helper every part of the workload uses to call the guarded store.

A guarded store never raises; if it ever did, the demo counts the exception (by type) in the
ledger instead of crashing, and the verdict fails.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from guarded.codec import to_json_value
from guarded.errors import InvalidPayloadError

from .ledger import Ledger


class _Escaped:
    """Marker returned by :func:`attempt` when the call raised."""


ESCAPED: Any = _Escaped()
"""What :func:`attempt` returns when the guarded store raised (never, by contract)."""


async def attempt(ledger: Ledger, call: Awaitable[Any]) -> Any:
    """Await ``call``; its result, or :data:`ESCAPED` after counting the exception in ``ledger``."""
    try:
        return await call
    except Exception as exc:
        ledger.escaped[type(exc).__name__] += 1
        return ESCAPED


def json_form(value: Any) -> Any:
    """``value`` as it reads back from a JSON column (tuples become lists), or ``None`` when it
    has no JSON form (such a write is refused, so there is nothing to compare)."""
    try:
        return to_json_value(value)
    except InvalidPayloadError:
        return None


__all__ = ["ESCAPED", "attempt", "json_form"]
