"""Durability bench: verdicts against the targets and the printed report."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Sequence

from . import durability_workload as sizes
from .durability_outage import UPSERTS_MIXED
from .durability_workload import (
    COPY,
    DRAIN_TIMEOUT,
    GROUP_COMMIT,
    HAND,
    HEADLINE_WRITERS,
    P99_TARGET_S,
    PIPELINED,
    SPILL_TARGET,
    TITLE,
    UNBATCHED,
    UPSERT_DRAIN_TARGET,
    VS_COPY_FROM_WRITERS,
    VS_COPY_TARGET,
    VS_UNBATCHED_TARGET,
    WRITE_BEHIND,
    Drain,
    Level,
    Report,
    Spill,
    percentile,
)
from .guard_report import Verdict

# --- verdicts and report --------------------------------------------------------------------------


def _encode_cost(levels: Sequence[Level]) -> float:
    """Seconds per event of ``encode_events`` in the COPY series (median of the largest level)."""
    level = max(levels, key=lambda level: level.writes)
    return statistics.median(level.series[COPY].encode_seconds) / level.writes


def _met(passed: bool) -> str:
    return "met" if passed else "not met"


def verdicts(levels: Sequence[Level], spills: Sequence[Spill], drains: Sequence[Drain]) -> list[Verdict]:
    found: list[Verdict] = []
    for name, how in (
        (GROUP_COMMIT, "each awaiting its write"),
        (PIPELINED, "pipelined"),
        (WRITE_BEHIND, "write-behind (opt-in ack='enqueue')"),
    ):
        for level in levels:
            if level.writers < VS_COPY_FROM_WRITERS or name not in level.series:
                continue
            batched, copy = level.series[name], level.series[COPY]
            share = batched.rate / copy.rate
            details = [f"{share:.2f}x ({batched.rate:,.0f} vs {copy.rate:,.0f} events/s)"]
            hand = level.series.get(HAND)
            if hand is not None and name == GROUP_COMMIT:
                details.append(
                    "a hand-written group commit (no guard, same callers) reaches "
                    f"{hand.rate / copy.rate:.2f}x; the guard {batched.rate / hand.rate:.2f}x of it"
                )
            found.append(
                Verdict(
                    target=f"batched save_event >= {VS_COPY_TARGET:g}x COPY (store encoding) "
                    f"at {level.writers:,} writers, {how}",
                    passed=share >= VS_COPY_TARGET,
                    details=details,
                )
            )
    headline = next((level for level in levels if level.writers == HEADLINE_WRITERS), None)
    if headline is not None:
        batched, unbatched = headline.series[GROUP_COMMIT], headline.series[UNBATCHED]
        ratio = batched.rate / unbatched.rate
        found.append(
            Verdict(
                target=f"group commit >= {VS_UNBATCHED_TARGET:g}x unbatched at {HEADLINE_WRITERS} writers",
                passed=ratio >= VS_UNBATCHED_TARGET,
                details=[
                    f"{ratio:.1f}x ({batched.rate:,.0f} vs {unbatched.rate:,.0f} events/s)",
                    *_hand_vs_unbatched(headline),
                ],
            )
        )
        p99 = percentile(batched.latencies, 0.99)
        found.append(
            Verdict(
                target=f"caller p99 (call to commit) <= {P99_TARGET_S * 1e3:g} ms "
                f"at {HEADLINE_WRITERS} writers",
                passed=p99 <= P99_TARGET_S,
                details=[f"p99 {p99 * 1e3:.2f} ms over {len(batched.latencies):,} calls"],
            )
        )
    for spill in spills:
        found.append(
            Verdict(
                target=f"held-upsert spill rate >= {SPILL_TARGET:,.0f}/s at {spill.callers:,} callers",
                passed=spill.rate >= SPILL_TARGET,
                details=[f"{spill.rate:,.0f} upserts/s"],
            )
        )
    for drain in drains:
        if drain.name == UPSERTS_MIXED:
            found.append(
                Verdict(
                    target=f"drain of {drain.held:,} held upserts >= {UPSERT_DRAIN_TARGET:,.0f}/s",
                    passed=drain.rate >= UPSERT_DRAIN_TARGET,
                    details=[f"{drain.rate:,.0f} upserts/s"],
                )
            )
    return found


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    widths = [max(len(line[i]) for line in (header, *lines)) for i in range(len(header))]

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [render(header), "  ".join("-" * width for width in widths), *(render(line) for line in lines)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _against_copy(report: Report, name: str, heading: str, *, latencies: bool) -> list[str]:
    """The table of series ``name`` against ``COPY`` at every number of writers (throughput, ratio
    and its target, batches; with ``latencies``, call p50 / p99)."""
    rows = []
    for level in report.levels:
        series, copy = level.series[name], level.series[COPY]
        low, high = series.rates
        batches = series.batches()
        share = series.rate / copy.rate
        row = [
            f"{level.writers:,}",
            f"{level.writes:,}",
            f"{series.rate:,.0f} ({low:,.0f}..{high:,.0f})",
            f"{copy.rate:,.0f}",
            f"{share:.2f}x",
            f">= {VS_COPY_TARGET:g}x: {_met(share >= VS_COPY_TARGET)}"
            if level.writers >= VS_COPY_FROM_WRITERS
            else "",
            "-" if batches is None else f"{batches[0]:.1f}",
            "-" if batches is None else _ms(batches[1]),
        ]
        if latencies:
            row += [_ms(percentile(series.latencies, 0.5)), _ms(percentile(series.latencies, 0.99))]
        rows.append(row)
    header = ["writers", "writes/rep", heading, "COPY", "x COPY", "target", "avg batch", "avg flush ms"]
    if latencies:
        header += ["call p50 ms", "call p99 ms"]
    return _table(header, rows)


def _hand_vs_unbatched(level: Level) -> list[str]:
    """The hand-written group commit (no guard) against unbatched writes, when it ran."""
    hand = level.series.get(HAND)
    if hand is None:
        return []
    ratio = hand.rate / level.series[UNBATCHED].rate
    return [f"a hand-written group commit (no guard, same callers) reaches {ratio:.1f}x"]


def format_report(report: Report) -> str:
    """The tables, each figure with its target, and the notes."""
    lines = [f"== {TITLE} ==", ""]
    lines += [
        "1. save_event through guard(PostgresStateStore), N concurrent writers (one trace each); "
        "events/s, median (min..max)",
        "",
    ]
    throughput = []
    for level in report.levels:
        batched, unbatched, copy, hand = (
            level.series[name] for name in (GROUP_COMMIT, UNBATCHED, COPY, HAND)
        )
        low, high = batched.rates
        batches = batched.batches()
        ratio = batched.rate / unbatched.rate
        target = ""
        if level.writers == HEADLINE_WRITERS:
            target = f">= {VS_UNBATCHED_TARGET:g}x: {_met(ratio >= VS_UNBATCHED_TARGET)}"
        throughput.append(
            (
                f"{level.writers:,}",
                f"{level.writes:,}",
                f"{batched.rate:,.0f} ({low:,.0f}..{high:,.0f})",
                f"{unbatched.rate:,.0f}",
                f"{hand.rate:,.0f}",
                f"{copy.rate:,.0f}",
                f"{ratio:.1f}x",
                target,
                f"{hand.rate / unbatched.rate:.1f}x",
                f"{batched.rate / hand.rate:.2f}x",
                f"{hand.rate / copy.rate:.2f}x",
                f"{batched.rate / copy.rate:.2f}x",
                f">= {VS_COPY_TARGET:g}x: {_met(batched.rate / copy.rate >= VS_COPY_TARGET)}"
                if level.writers >= VS_COPY_FROM_WRITERS
                else "",
                "-" if batches is None else f"{batches[0]:.1f}",
                "-" if batches is None else _ms(batches[1]),
            )
        )
    lines += _table(
        (
            "writers",
            "writes/rep",
            "group commit",
            "unbatched",
            "hand-written",
            "COPY",
            "x unbatched",
            "target",
            "hand x unbatched",
            "x hand",
            "hand x COPY",
            "x COPY",
            "target",
            "avg batch",
            "avg flush ms",
        ),
        throughput,
    )
    lines += [
        "",
        "1b. the same writes, pipelined: each writer sends all its save_event calls at once and awaits "
        "them together (every call still returns at commit)",
        "",
    ]
    lines += _against_copy(report, PIPELINED, "pipelined", latencies=True)
    lines += [
        "",
        "1c. the same writes acknowledged when queued (opt-in BatchConfig(ack='enqueue'), write-behind), "
        "timed until every write is flushed",
        "",
    ]
    lines += _against_copy(report, WRITE_BEHIND, "write-behind", latencies=False)
    lines += ["", "caller latency, call to commit (each awaited save_event), ms over every timed call", ""]
    latency = []
    for level in report.levels:
        batched, unbatched = level.series[GROUP_COMMIT], level.series[UNBATCHED]
        p99 = percentile(batched.latencies, 0.99)
        target = ""
        if level.writers == HEADLINE_WRITERS:
            target = f"p99 <= {P99_TARGET_S * 1e3:g} ms: {_met(p99 <= P99_TARGET_S)}"
        latency.append(
            (
                f"{level.writers:,}",
                f"{len(batched.latencies):,}",
                _ms(percentile(batched.latencies, 0.5)),
                _ms(p99),
                _ms(max(batched.latencies)),
                target,
                _ms(level.writers / batched.rate),
                _ms(percentile(unbatched.latencies, 0.5)),
                _ms(percentile(unbatched.latencies, 0.99)),
            )
        )
    lines += _table(
        (
            "writers",
            "calls",
            "group p50",
            "group p99",
            "group max",
            "target",
            "writers/rate",
            "unbatched p50",
            "unbatched p99",
        ),
        latency,
    )
    lines += ["", "2. held-upsert spill rate: breaker forced open, save_memory_state with distinct keys", ""]
    lines += _table(
        ("callers", "upserts/rep", "upserts/s (min..max)", "caller p50 ms", "caller p99 ms", "target"),
        [
            (
                f"{spill.callers:,}",
                f"{spill.writes:,}",
                f"{spill.rate:,.0f} ({spill.writes / max(spill.seconds):,.0f}.."
                f"{spill.writes / min(spill.seconds):,.0f})",
                _ms(percentile(spill.latencies, 0.5)),
                _ms(percentile(spill.latencies, 0.99)),
                f">= {SPILL_TARGET:,.0f}/s: {_met(spill.rate >= SPILL_TARGET)}",
            )
            for spill in report.spills
        ],
    )
    lines += [
        "",
        f"3./4. controller(store).drain(timeout={DRAIN_TIMEOUT:g}) after recovery, "
        f"median of {sizes.DRAIN_REPEATS}",
        "",
    ]
    lines += _table(
        ("held writes", "count", "fill writes/s", "drain s", "drain writes/s (min..max)", "target"),
        [
            (
                drain.name,
                f"{drain.held:,}",
                f"{drain.fill_rate:,.0f}",
                f"{statistics.median(drain.drain_seconds):.2f}",
                f"{drain.rate:,.0f} ({drain.held / max(drain.drain_seconds):,.0f}.."
                f"{drain.held / min(drain.drain_seconds):,.0f})",
                f">= {UPSERT_DRAIN_TARGET:,.0f}/s: {_met(drain.rate >= UPSERT_DRAIN_TARGET)}"
                if drain.name == UPSERTS_MIXED
                else "",
            )
            for drain in report.drains
        ],
    )
    lines += [""]
    for verdict in report.verdicts:
        lines.append(f"{_met(verdict.passed):>7}  {verdict.target}: {'; '.join(verdict.details)}")
    if report.notes:
        lines.append("")
        lines += [textwrap.fill(note, width=110, subsequent_indent="  ") for note in report.notes]
    return "\n".join(lines)
