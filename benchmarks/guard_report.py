"""Rows, verdicts and the printed tables of the guard-overhead section."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One measured series: a method under one stack and tracing mode."""

    section: str
    method: str
    variant: str
    median_us: float
    added_us: float | None
    ratio: float
    low_us: float
    high_us: float
    calls: int


@dataclass(frozen=True, slots=True)
class MethodRow:
    """One protocol method in one quiet tracing mode: the guard's added cost beside the lean and
    tenacity stacks' (all medians of the same interleaved run, minus the bare store's median)."""

    method: str
    tracing: str
    bare_us: float
    guard_added_us: float
    lean_added_us: float
    naive_added_us: float
    added_target_us: float
    lean_share_target: float

    @property
    def lean_share(self) -> float:
        """The guard's added cost as a share of the lean stack's (target: at most a third)."""
        return self.guard_added_us / self.lean_added_us if self.lean_added_us > 0 else float("inf")

    @property
    def added_met(self) -> bool:
        return self.guard_added_us <= self.added_target_us

    @property
    def share_met(self) -> bool:
        return self.lean_share <= self.lean_share_target


@dataclass(frozen=True, slots=True)
class Verdict:
    """One target of the issue, PASS or FAIL, with the numbers behind it."""

    target: str
    passed: bool
    details: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SectionResult:
    title: str
    rows: list[BenchRow]
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    methods: list[MethodRow] = field(default_factory=list)
    """The per-method summary (empty for the layer breakdown)."""
    highlights: list[BenchRow] = field(default_factory=list)
    """Series printed below the summary (recording spans, breaker open)."""


def _ok(met: bool) -> str:
    return "ok" if met else "MISSED"


def render_table(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 2) -> list[str]:
    """Fixed-width lines: the first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [render(header), "  ".join("-" * w for w in widths), *(render(line) for line in body)]


def format_methods(rows: Sequence[MethodRow]) -> list[str]:
    """The per-method table: each figure with its target beside it."""
    if not rows:
        return []
    added_target = rows[0].added_target_us
    share_target = rows[0].lean_share_target
    header = (
        "method",
        "spans",
        "bare µs",
        f"guard added µs (target <= {added_target:g})",
        "lean added µs",
        f"guard/lean added (target <= {share_target:.2f})",
        "tenacity added µs",
    )
    body = [
        (
            row.method,
            row.tracing,
            f"{row.bare_us:.2f}",
            f"{row.guard_added_us:+.2f} {_ok(row.added_met)}",
            f"{row.lean_added_us:+.2f}",
            f"{row.lean_share:.2f} {_ok(row.share_met)}",
            f"{row.naive_added_us:+.2f}",
        )
        for row in rows
    ]
    return render_table(header, body)


def format_rows(rows: Sequence[BenchRow]) -> list[str]:
    """Every series: median, spread, added cost and ratio to the bare store."""
    header = ("method", "variant", "median µs/call", "min..max µs", "added µs", "x bare", "calls")
    body = [
        (
            row.method,
            row.variant,
            f"{row.median_us:.2f}",
            f"{row.low_us:.2f}..{row.high_us:.2f}",
            "-" if row.added_us is None else f"{row.added_us:+.2f}",
            f"{row.ratio:.2f}",
            str(row.calls),
        )
        for row in rows
    ]
    return render_table(header, body)


def format_section(result: SectionResult, *, detail: bool = False) -> str:
    """The section's tables (the per-method summary, else every series) with verdicts and notes.

    ``detail``: every series as well (always, for a section without a per-method summary).
    """
    lines = [f"== {result.title} ==", ""]
    if result.methods:
        lines += format_methods(result.methods)
    if result.highlights:
        lines += ["", *format_rows(result.highlights)]
    if detail or not result.methods:
        lines += ["", *format_rows(result.rows)] if result.methods else format_rows(result.rows)
    for verdict in result.verdicts:
        lines += ["", f"{'PASS' if verdict.passed else 'FAIL'}  {verdict.target}"]
        lines += [f"      {detail_line}" for detail_line in verdict.details]
    if result.notes:
        lines += ["", *result.notes]
    return "\n".join(lines)
