"""Rows, verdicts and the printed table of the guard-overhead section."""

from __future__ import annotations

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


def format_section(result: SectionResult) -> str:
    """The section as a fixed-width table followed by its verdicts and notes."""
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
        for row in result.rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    left = {0, 1}

    def render(line: tuple[str, ...]) -> str:
        cells = [
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    lines = [f"== {result.title} ==", "", render(header), "  ".join("-" * w for w in widths)]
    lines += [render(line) for line in body]
    for verdict in result.verdicts:
        lines += ["", f"{'PASS' if verdict.passed else 'FAIL'}  {verdict.target}"]
        lines += [f"      {detail}" for detail in verdict.details]
    if result.notes:
        lines += ["", *result.notes]
    return "\n".join(lines)
