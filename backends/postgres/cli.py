"""``guarded pg migrate|status|cleanup``: operate the PostgreSQL backend's schema.

* ``migrate``: apply pending migrations (safe to run from several hosts at once: advisory lock).
* ``status``: the schema's migration version, pending migrations, checksum mismatches, and the
  row estimates and sizes of its tables. Exit 1 when migrations are pending or the database is
  newer than this code.
* ``cleanup``: delete expired pauses and artifacts and enforce the retention given by
  ``--max-age-*`` options (or the ``GUARDED_PG_RETENTION_*`` variables).

The connection comes from ``--dsn`` (else ``GUARDED_PG_DSN`` / ``DATABASE_URL`` / asyncpg's
``PG*`` variables) and the schema from ``--schema`` (else ``GUARDED_PG_SCHEMA``, else ``public``).
Exit codes: 0 success, 1 a problem was found or the operation failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import asyncpg

from .factory import ConfigurationError, config_from_env
from .migrations import MigrationError, migrate, status
from .options import RetentionPolicy
from .retention import cleanup
from .schema_names import validate_schema_name

if TYPE_CHECKING:
    from guarded.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    """Add the ``pg`` command and its ``migrate``, ``status`` and ``cleanup`` subcommands."""
    parser = subparsers.add_parser(
        "pg",
        help="operate the PostgreSQL backend (migrations, status, cleanup)",
        description="Operate the PostgreSQL backend's schema: migrations, status and retention cleanup.",
    )
    commands = parser.add_subparsers(dest="pg_command", metavar="PG_COMMAND", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--dsn", help="connection string (default: GUARDED_PG_DSN, DATABASE_URL or PG* variables)"
        )
        sub.add_argument(
            "--schema", help="schema of the store's tables (default: GUARDED_PG_SCHEMA or 'public')"
        )
        sub.add_argument("--json", action="store_true", help="print a JSON object instead of text")

    migrate_parser = commands.add_parser("migrate", help="apply pending migrations")
    common(migrate_parser)
    migrate_parser.set_defaults(handler=_run(_migrate))

    status_parser = commands.add_parser("status", help="show the migration version and table sizes")
    common(status_parser)
    status_parser.set_defaults(handler=_run(_status))

    cleanup_parser = commands.add_parser("cleanup", help="delete expired and over-age rows")
    common(cleanup_parser)
    for table in ("events", "updates", "steering", "planner-events"):
        cleanup_parser.add_argument(
            f"--max-age-{table}",
            type=float,
            metavar="SECONDS",
            help=f"delete {table.replace('-', ' ')} stored longer ago than this",
        )
    cleanup_parser.add_argument("--grace", type=float, metavar="SECONDS", help="consumed-pause grace period")
    cleanup_parser.set_defaults(handler=_run(_cleanup))


def _run(command: Any) -> Any:
    def handler(args: argparse.Namespace) -> int:
        try:
            config = config_from_env()
            dsn = args.dsn or config.dsn
            schema = validate_schema_name(args.schema or config.schema)
        except (ConfigurationError, ValueError) as exc:
            print(f"guarded pg: {exc}", file=sys.stderr)
            return 2
        try:
            result: int = asyncio.run(command(args, dsn, schema, config))
            return result
        except (MigrationError, asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
            print(f"guarded pg {args.pg_command}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1

    return handler


async def _connect(dsn: str | None, config: Any) -> asyncpg.Connection:
    timeout = config.pool.connect_timeout
    conn: asyncpg.Connection = await asyncpg.connect(dsn, timeout=timeout)
    return conn


async def _migrate(args: argparse.Namespace, dsn: str | None, schema: str, config: Any) -> int:
    conn = await _connect(dsn, config)
    try:
        applied = await migrate(conn, schema)
        state = await status(conn, schema)
    finally:
        await conn.close()
    if args.json:
        print(json.dumps({"schema": schema, "applied": applied, "version": state.current}))
    elif applied:
        versions = ", ".join(f"{version:04d}" for version in applied)
        print(f"schema {schema}: applied {versions}; now at version {state.current}")
    else:
        print(f"schema {schema}: up to date at version {state.current}")
    return 0


async def _status(args: argparse.Namespace, dsn: str | None, schema: str, config: Any) -> int:
    from .connection import Database
    from .table_stats import table_stats

    conn = await _connect(dsn, config)
    try:
        state = await status(conn, schema)
    finally:
        await conn.close()
    stats: dict[str, tuple[int, int]] = {}
    if state.current:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        try:
            stats = await table_stats(Database(pool), schema)
        finally:
            await pool.close()
    if args.json:
        print(
            json.dumps(
                {
                    "schema": schema,
                    "version": state.current,
                    "latest": state.latest,
                    "pending": [item.version for item in state.pending],
                    "checksum_mismatches": list(state.checksum_mismatches),
                    "tables": {name: {"rows": rows, "bytes": size} for name, (rows, size) in stats.items()},
                }
            )
        )
    else:
        print(state)
        for name, (rows, size) in sorted(stats.items()):
            print(f"  {name:<16} ~{rows} rows  {size} bytes")
    return 0 if state.up_to_date and not state.checksum_mismatches else 1


async def _cleanup(args: argparse.Namespace, dsn: str | None, schema: str, config: Any) -> int:
    from .connection import Database

    env_policy: RetentionPolicy = config.options["retention"]
    policy = RetentionPolicy(
        events_max_age=args.max_age_events or env_policy.events_max_age,
        updates_max_age=args.max_age_updates or env_policy.updates_max_age,
        steering_max_age=args.max_age_steering or env_policy.steering_max_age,
        planner_events_max_age=args.max_age_planner_events or env_policy.planner_events_max_age,
    )
    grace = args.grace if args.grace is not None else float(config.options.get("consume_grace", 60.0))
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        report = await cleanup(Database(pool), schema, grace=grace, policy=policy)
    finally:
        await pool.close()
    if args.json:
        print(json.dumps({"schema": schema, "deleted": report.deleted}))
    else:
        print(f"schema {schema}: {report}")
    return 0


__all__ = ["register"]
