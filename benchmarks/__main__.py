"""``python -m benchmarks [--dsn DSN] [--section NAME] [--repeats N]``: run the benchmark sections.

Sections run in order: ``guard`` (the guard's per-call cost against a bare store and a naive
composition of tenacity + purgatory + OpenTelemetry + prometheus-client, on the in-memory
store) and ``postgres`` (the Postgres backend against raw asyncpg). Without ``--dsn`` an
embedded PostgreSQL server (``guarded.testing.postgres``) is started for the PostgreSQL
sections and removed afterwards. Exit status 1 when a target is missed (only with ``--strict``).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from . import guard_bench, postgres_bench
from .guard_report import format_section
from .side_by_side import Row, format_table

GUARD_SECTION = "guard"


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    run: Callable[..., Awaitable[list[Row]]]
    needs_postgres: bool = True


SECTIONS: list[Section] = [
    Section(postgres_bench.SECTION, postgres_bench.run),
]
"""Every benchmark section, in the order they run."""


async def run_sections(sections: Sequence[Section], dsn: str, repeats: int) -> list[Row]:
    rows: list[Row] = []
    for section in sections:
        print(f"running {section.name} ...", file=sys.stderr, flush=True)
        rows += await section.run(dsn, repeats=repeats)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL to use (default: start an embedded server)")
    parser.add_argument(
        "--section",
        action="append",
        choices=[GUARD_SECTION, *(section.name for section in SECTIONS)],
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
    if not sections:
        return 1 if args.strict and missed_guard else 0

    if args.dsn:
        rows = asyncio.run(run_sections(sections, args.dsn, args.repeats))
        where = "given server"
    else:
        from guarded.testing.postgres import embedded_postgres

        with embedded_postgres(durable=args.durable) as server:
            rows = asyncio.run(run_sections(sections, server.dsn, args.repeats))
        where = "embedded server, " + ("durable" if args.durable else "fsync=off synchronous_commit=off")
    print(f"guarded benchmarks: median of {args.repeats} runs; {where}; Python {platform.python_version()}")
    print(format_table(rows))
    missed = [row for row in rows if row.met is False]
    return 1 if args.strict and (missed or missed_guard) else 0


if __name__ == "__main__":
    sys.exit(main())
