"""Durations as people write them: ``30s``, ``15m``, ``12h``, ``30d``, ``1h30m``, ``500ms``, or a
plain number of seconds. The command line and the ``GUARDED_PG_*`` variables read them alike."""

from __future__ import annotations

import math
import re

DURATION_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
"""Units a duration may carry: ``500ms``, ``30s``, ``15m``, ``12h``, ``30d``, ``2w``."""
DURATION_EXAMPLES = "30s, 15m, 12h or 30d"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d|w)", re.IGNORECASE)
_DURATION = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d|w))+", re.IGNORECASE)
_PLAIN = re.compile(_NUMBER)


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds in ``text``: a plain number of seconds (``90``, ``1.5``) or numbers with units
    (``30s``, ``15m``, ``12h``, ``30d``, ``1h30m``, ``500ms``). Raises ``ValueError`` with a
    message that says what is accepted."""
    given = text.strip()
    compact = given.replace(" ", "")
    if _PLAIN.fullmatch(compact):
        seconds = float(compact)
    elif _DURATION.fullmatch(compact):
        seconds = sum(float(number) * DURATION_UNITS[unit.lower()] for number, unit in _PART.findall(compact))
    elif compact.startswith("-"):
        raise ValueError(f"must not be negative, got {given!r}")
    else:
        raise ValueError(f"{given!r} is not a duration")
    if not math.isfinite(seconds):
        raise ValueError(f"{given!r} is not a finite duration")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"must be longer than zero, got {given!r}")
    return seconds


__all__ = ["DURATION_EXAMPLES", "DURATION_UNITS", "parse_duration"]
