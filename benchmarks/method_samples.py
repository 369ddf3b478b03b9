"""The timings of one method's series in a per-call comparison, read against a reference series."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class MethodSamples:
    """Seconds per call of each series measured for ``method`` (by series name); a subclass names
    its :attr:`reference` series, the one every ratio divides by."""

    reference: ClassVar[str]

    method: str
    samples: dict[str, list[float]] = field(default_factory=dict)

    def median_us(self, series: str) -> float | None:
        found = self.samples.get(series)
        return statistics.median(found) * 1e6 if found else None

    def ratio(self, series: str) -> float | None:
        value, reference = self.median_us(series), self.median_us(self.reference)
        return None if value is None or not reference else value / reference


__all__ = ["MethodSamples"]
