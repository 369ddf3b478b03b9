"""``python -m benchmarks [--dsn DSN] [--section NAME] [--repeats N]``: run the benchmark sections.

Sections run in order: ``guard`` (the guard's per-call cost against a bare store and a naive
composition of tenacity + purgatory + OpenTelemetry + prometheus-client, on the in-memory
store), ``postgres`` (the Postgres backend against raw asyncpg) and ``durability`` (group commit
at 1 to 1,000 writers against unbatched writes and ``COPY``, caller latency from call to commit,
the dead-letter spill rate of held upserts, and the drain of held upserts and events after an
outage). Without ``--dsn`` an embedded PostgreSQL server (``guarded.testing.postgres``) is
started for the PostgreSQL sections and removed afterwards; the durability section stops and
restarts it (with ``--dsn`` it starts one of its own for that). Exit status 1 when a target is
missed (only with ``--strict``).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import durability_bench, guard_bench, postgres_bench
from .guard_report import format_section
from .side_by_side import Row, format_table

if TYPE_CHECKING:
    from guarded.testing.postgres import EmbeddedPostgres

GUARD_SECTION = "guard"
DURABILITY_SECTION = durability_bench.SECTION


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    run: Callable[..., Awaitable[list[Row]]]
    needs_postgres: bool = True


SECTIONS: list[Section] = [
    Section(postgres_bench.SECTION, postgres_bench.run),
]
"""Every benchmark section, in the order they run."""


async def run_sections(
    sections: Sequence[Section],
    dsn: str,
    repeats: int,
    *,
    durability: bool = False,
    server: EmbeddedPostgres | None = None,
) -> tuple[list[Row], durability_bench.Report | None]:
    rows: list[Row] = []
    for section in sections:
        print(f"running {section.name} ...", file=sys.stderr, flush=True)
        rows += await section.run(dsn, repeats=repeats)
    report = None
    if durability:
        print(f"running {DURABILITY_SECTION} ...", file=sys.stderr, flush=True)
        report = await durability_bench.run(dsn, repeats=repeats, server=server)
    return rows, report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL to use (default: start an embedded server)")
    parser.add_argument(
        "--section",
        action="append",
        choices=[GUARD_SECTION, *(section.name for section in SECTIONS), DURABILITY_SECTION],
        help="run only these",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per benchmark (median reported)")
    parser.add_argument(
        "--durable", action="store_true", help="embedded server with fsync/synchronous_commit on"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a row misses its target")
    args = parser.parse_args(argv)
    sections = [section for section in SECTIONS if not args.section or section.name in args.section]
    missed_guard = False
    if not args.section or GUARD_SECTION in args.section:
        print(f"running {GUARD_SECTION} ...", file=sys.stderr, flush=True)
        guard_result = asyncio.run(guard_bench.run())
        print(format_section(guard_result), end="\n\n", flush=True)
        missed_guard = not all(verdict.passed for verdict in guard_result.verdicts)
    durability = not args.section or DURABILITY_SECTION in args.section
    if not sections and not durability:
        return 1 if args.strict and missed_guard else 0

    if args.dsn:
        rows, report = asyncio.run(run_sections(sections, args.dsn, args.repeats, durability=durability))
        where = "given server"
    else:
        from guarded.testing.postgres import embedded_postgres

        with embedded_postgres(durable=args.durable) as server:
            rows, report = asyncio.run(
                run_sections(sections, server.dsn, args.repeats, durability=durability, server=server)
            )
        where = "embedded server, " + ("durable" if args.durable else "fsync=off synchronous_commit=off")
    print(f"guarded benchmarks: median of {args.repeats} runs; {where}; Python {platform.python_version()}")
    if rows:
        print(format_table(rows))
    missed = [row for row in rows if row.met is False]
    missed_durability = False
    if report is not None:
        print(("\n" if rows else "") + durability_bench.format_report(report))
        missed_durability = not all(verdict.passed for verdict in report.verdicts)
    return 1 if args.strict and (missed or missed_guard or missed_durability) else 0


if __name__ == "__main__":
    sys.exit(main())
