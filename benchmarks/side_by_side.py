"""Side-by-side comparisons (ours against a raw baseline) for the benchmark sections that measure one."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Row:
    """One comparison: our median time against a raw baseline's, and the target for the ratio.

    ``ratio`` is ``raw / ours`` for throughput targets (``higher_is_better``: 0.8 means we reach
    80% of the baseline's speed) and ``ours / raw`` for latency targets (1.5 means we take at
    most 1.5 times as long).
    """

    section: str
    name: str
    ours: float
    raw: float
    baseline: str
    target: float | None = None
    higher_is_better: bool = False

    @property
    def ratio(self) -> float:
        return self.raw / self.ours if self.higher_is_better else self.ours / self.raw

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target


async def medians(
    operations: dict[str, Callable[[], Awaitable[object]]],
    *,
    repeats: int,
    setup: Callable[[], Awaitable[object]] | None = None,
    warmup: int = 1,
) -> dict[str, float]:
    """Median wall time of each operation over ``repeats`` rounds (``setup`` runs untimed before each run).

    The operations alternate within every round, so a slower or busier stretch of the machine
    affects all of them alike instead of skewing one side of a comparison. Garbage is collected
    (untimed) before each run, so no operation pays for the collection of another's garbage.
    """
    samples: dict[str, list[float]] = {name: [] for name in operations}
    for round_number in range(warmup + repeats):
        for name, operation in operations.items():
            if setup is not None:
                await setup()
            gc.collect()  # the previous operation's garbage is not this one's cost
            started = time.perf_counter()
            await operation()
            if round_number >= warmup:
                samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in samples.items()}


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def format_table(rows: list[Row]) -> str:
    """A plain-text table: benchmark, ours, raw baseline, ratio and target."""
    header = ("section", "benchmark", "ours", "raw", "baseline", "ratio", "target")
    lines = []
    for row in rows:
        if row.target is None:
            target = ""
        else:
            sign = ">=" if row.higher_is_better else "<="
            target = f"{sign} {row.target:g}x {'ok' if row.met else 'MISSED'}"
        kind = "speed" if row.higher_is_better else "time"
        lines.append(
            (
                row.section,
                row.name,
                _duration(row.ours),
                _duration(row.raw),
                row.baseline,
                f"{row.ratio:.2f}x {kind}",
                target,
            )
        )
    widths = [max(len(str(line[index])) for line in [header, *lines]) for index in range(len(header))]
    rendered = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    ]
    rendered.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(rendered)


__all__ = ["Row", "format_table", "medians"]
