"""``guarded pg migrate|status|cleanup|partition|maintain``: operate the PostgreSQL backend's schema.

* ``migrate``: apply pending migrations (safe to run from several hosts at once: advisory lock),
  with progress; ``--sql`` prints the SQL instead of running it.
* ``status``: the schema's migration version, pending migrations, checksum mismatches, and the
  row estimates and sizes of its tables.
* ``cleanup``: delete expired pauses and artifacts and enforce the retention given by
  ``--max-age-*`` durations (or the ``GUARDED_PG_RETENTION_*`` variables), with progress; on a
  partitioned schema by dropping whole partitions.
* ``partition``: convert the history tables to time-partitioned ones, step by step, resumable
  (:mod:`.partition_conversion`).
* ``maintain``: create the partitions ahead on a partitioned schema (:mod:`.partitioning`).

The connection comes from ``--dsn`` (else ``GUARDED_PG_DSN`` / ``DATABASE_URL`` / asyncpg's
``PG*`` variables and defaults) and the schema from ``--schema`` (else ``GUARDED_PG_SCHEMA``, else
``public``). Exit codes follow :mod:`guarded.cli.plugin`: 0 success, 1 a problem (a checksum
mismatch, a schema newer than this code, a failed migration), 2 user error, 3 database
unreachable (the error names the target tried), 4 migrations pending, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from guarded.cli.plugin import (
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    EXIT_PROBLEM,
    Column,
    CommandError,
    NotMigratedError,
    ProblemError,
    Progress,
    UsageError,
    duration,
    format_bytes,
    format_duration,
    interrupted,
    print_table,
    report,
    whole_number,
)

from .cli_sql import migration_script, migrations_after
from .cli_target import Target, connect_failure, is_unreachable, resolve_target
from .connection import Database
from .factory import ConfigurationError, FactoryConfig, config_from_env
from .options import RetentionPolicy
from .partition_conversion import STEPS, StepResult, convert_schema
from .partitioning import PERIODS, PartitioningError, ensure_partitions, schema_layout
from .retention import CleanupReport, cleanup
from .schema_migrations import (
    MigrationError,
    MigrationStatus,
    SchemaTooNewError,
    latest_version,
    migrate,
    status,
)
from .schema_names import validate_schema_name

if TYPE_CHECKING:
    from guarded.cli.plugin import Subparsers

EXIT_CODES_EPILOG = (
    "exit codes: 0 success; 1 a problem was found or the operation failed; 2 user error; "
    "3 the database is unreachable (the error names the target tried); 4 migrations are pending; "
    "130 interrupted. See docs/cli.md."
)
CONNECTION_HELP = (
    "The connection comes from --dsn, else GUARDED_PG_DSN, else DATABASE_URL, else asyncpg's PG* "
    "variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) and defaults; the schema from --schema, "
    "else GUARDED_PG_SCHEMA, else public."
)


def register(subparsers: Subparsers) -> None:
    """Add the ``pg`` command and its ``migrate``, ``status`` and ``cleanup`` subcommands."""
    parser = subparsers.add_parser(
        "pg",
        help="operate the PostgreSQL backend (migrations, status, cleanup)",
        description=(
            "Operate the PostgreSQL backend's schema: apply or print its migrations, show where it stands, "
            "delete expired and over-age rows. " + CONNECTION_HELP
        ),
        epilog=EXIT_CODES_EPILOG,
    )
    commands = parser.add_subparsers(dest="pg_command", metavar="PG_COMMAND", required=True)

    def add(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=description + " " + CONNECTION_HELP, epilog=EXIT_CODES_EPILOG
        )
        sub.add_argument(
            "--dsn", help="connection string (default: GUARDED_PG_DSN, DATABASE_URL or PG* variables)"
        )
        sub.add_argument(
            "--schema", help="schema of the store's tables (default: GUARDED_PG_SCHEMA or 'public')"
        )
        sub.add_argument("--json", action="store_true", help="print a JSON object instead of text")
        return sub

    migrate_parser = add(
        "migrate",
        "apply pending migrations (or print their SQL with --sql)",
        "Apply the migrations the schema lacks, in order, each in its own transaction, under an advisory "
        "lock (safe to run from several hosts at once); creates the schema when it does not exist. Shows "
        "progress; Ctrl-C rolls back the migration in progress and says which were applied. With --sql, "
        "print the SQL script instead and change nothing: the migrations the database lacks, or with "
        "--from every migration after that version, without connecting (like alembic's offline --sql).",
    )
    migrate_parser.add_argument(
        "--sql", action="store_true", help="print the SQL that would be run instead of running it"
    )
    migrate_parser.add_argument(
        "--from",
        dest="from_version",
        type=whole_number(0),
        metavar="VERSION",
        help="with --sql: the schema's current version (0 for a new schema); the database is not contacted",
    )
    migrate_parser.set_defaults(handler=_run(_migrate))

    status_parser = add(
        "status",
        "show the migration version and table sizes",
        "Show the schema's migration version and the version this code needs, each applied and pending "
        "migration, checksum differences, and the estimated rows and size of each table. Exit 0 when up "
        "to date, 4 when migrations are pending, 1 for a checksum mismatch or a schema newer than this "
        "code, 3 when the database cannot be reached.",
    )
    status_parser.set_defaults(handler=_run(_status))

    cleanup_parser = add(
        "cleanup",
        "delete expired and over-age rows",
        "Delete expired pauses and artifacts, and the rows of the append-only tables stored longer ago "
        "than their --max-age-* (default: the GUARDED_PG_RETENTION_* variables; unset keeps them). "
        "Deletes in small batches, each its own transaction, with progress; Ctrl-C stops after the "
        "batch in flight and says what was deleted (what was deleted stays deleted). Durations take "
        "units: 30s, 15m, 12h, 30d (a plain number is seconds).",
    )
    for table in ("events", "updates", "steering", "planner-events"):
        cleanup_parser.add_argument(
            f"--max-age-{table}",
            type=duration(),
            metavar="DURATION",
            help=f"delete {table.replace('-', ' ')} stored longer ago than this, e.g. 30d",
        )
    cleanup_parser.add_argument(
        "--grace",
        type=duration(allow_zero=True),
        metavar="DURATION",
        help="how long a consumed pause is kept for a repeated consume "
        "(default: GUARDED_PG_CONSUME_GRACE, else 60s)",
    )
    cleanup_parser.set_defaults(handler=_run(_cleanup))

    partition_parser = add(
        "partition",
        "convert the history tables to time-partitioned tables (resumable)",
        "Convert flow_events, state_updates, steering_events and planner_events to tables range-partitioned "
        "by time, copying no row: each table's heap becomes its '_legacy' partition. Steps per table: "
        "prepare (the new partitioned table), index (CREATE UNIQUE INDEX CONCURRENTLY), constrain (a CHECK "
        "... NOT VALID), validate (scans under a lock that lets writes go on), swap (one short "
        "transaction under ACCESS EXCLUSIVE, waiting at most 5 s for it). Each step checks first and "
        "skips what is done: run it again after an interruption and it resumes. See docs/postgres.md, "
        "'Partitioned history'.",
    )
    partition_parser.add_argument(
        "--period",
        choices=PERIODS,
        help="partition period (default: GUARDED_PG_PARTITIONING, else daily)",
    )
    partition_parser.add_argument(
        "--until",
        choices=STEPS,
        metavar="STEP",
        help=f"stop after this step ({', '.join(STEPS)}), e.g. prepare everything by day and swap later",
    )
    partition_parser.set_defaults(handler=_run(_partition))

    maintain_parser = add(
        "maintain",
        "create the partitions ahead on a partitioned schema",
        "Create the partitions a partitioned schema lacks up to a week ahead (moving any rows of their "
        "range out of the default partition) and show where each table's newest partition ends. A store "
        "opened with partitioning does this on open and hourly; run it from cron otherwise.",
    )
    maintain_parser.add_argument(
        "--period",
        choices=PERIODS,
        help="partition period (default: GUARDED_PG_PARTITIONING, else each table's newest partition's)",
    )
    maintain_parser.set_defaults(handler=_run(_maintain))


Command = Callable[[argparse.Namespace, Target, FactoryConfig], Coroutine[Any, Any, int]]


def _run(command: Command) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            config = config_from_env()
        except ConfigurationError as exc:
            return report(UsageError(str(exc), "fix or unset that variable"))
        try:
            schema = validate_schema_name(args.schema or config.schema)
        except ValueError as exc:
            source = "--schema" if args.schema else "GUARDED_PG_SCHEMA"
            return report(UsageError(f"{source}: {exc}", "e.g. --schema app_tenant_1"))
        target = resolve_target(args.dsn, schema, config.dsn)
        try:
            return asyncio.run(command(args, target, config))
        except CommandError as exc:
            return report(exc)
        except SchemaTooNewError as exc:
            return report(ProblemError(str(exc), "upgrade guarded on this host"))
        except MigrationError as exc:
            return report(ProblemError(str(exc), "fix the cause and run 'guarded pg migrate' again"))
        except PartitioningError as exc:
            return report(ProblemError(str(exc), "see docs/postgres.md, 'Partitioned history'"))
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            if is_unreachable(exc):
                return report(connect_failure(exc, target, doing="keep a connection to"))
            why = f"{type(exc).__name__}: {exc}"
            return report(ProblemError(f"{args.pg_command} failed on schema {schema!r}: {why}", None))

    return handler


async def _connect(target: Target, config: FactoryConfig) -> asyncpg.Connection:
    try:
        conn: asyncpg.Connection = await asyncpg.connect(
            target.dsn,
            timeout=config.pool.connect_timeout,
            server_settings={"application_name": config.pool.application_name},
            **_statement_cache(config),
        )
    except Exception as exc:
        raise connect_failure(exc, target) from exc
    return conn


def _statement_cache(config: FactoryConfig) -> dict[str, Any]:
    """No named prepared statements behind a pooler in transaction mode (``GUARDED_PG_POOLER``)."""
    return {"statement_cache_size": 0} if config.pool.transaction_pooled else {}


async def _pool(target: Target, config: FactoryConfig) -> asyncpg.Pool:
    try:
        pool: asyncpg.Pool = await asyncpg.create_pool(
            target.dsn,
            min_size=1,
            max_size=1,
            timeout=config.pool.connect_timeout,
            server_settings={"application_name": config.pool.application_name},
            **_statement_cache(config),
        )
    except Exception as exc:
        raise connect_failure(exc, target) from exc
    return pool


def _require_migrated(state: MigrationStatus, exists: bool) -> None:
    """Raise when ``state``'s schema is not at this code's version (for commands that need its tables)."""
    schema = state.schema
    if state.too_new:
        raise ProblemError(
            f"schema {schema!r} is at version {state.current}, newer than this code ({state.latest})",
            "upgrade guarded on this host",
        )
    if state.up_to_date:
        return
    if not exists:
        raise NotMigratedError(
            f"schema {schema!r} does not exist, so it is not migrated",
            f"check --schema (or GUARDED_PG_SCHEMA); 'guarded pg migrate --schema {schema}' creates it",
        )
    raise NotMigratedError(
        f"schema {schema!r} is not migrated: it is at version {state.current}, "
        f"this code needs {state.latest}",
        f"run 'guarded pg migrate --schema {schema}'",
    )


async def _schema_exists(conn: Any, schema: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", schema
        )
    )


# --- migrate ------------------------------------------------------------------------------------


class _AppliedLog(logging.Handler):
    """Collects the ``guarded_migration_applied`` records :func:`.migrations.migrate` logs, one per
    migration, and advances the progress with each."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.INFO)
        self.applied: list[int] = []
        self._progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) != "guarded_migration_applied":
            return
        version = int(getattr(record, "version", 0))
        self.applied.append(version)
        names = {item.version: item.name for item in migrations_after(0)}
        self._progress.advance(1, detail=f"applied {version:04d}_{names.get(version, '?')}")


async def _migrate(args: argparse.Namespace, target: Target, config: FactoryConfig) -> int:
    if args.from_version is not None and not args.sql:
        raise UsageError("--from goes with --sql", "add --sql to print the SQL from that version on")
    if args.sql:
        return await _print_sql(args, target, config)
    conn = await _connect(target, config)
    try:
        before = await status(conn, target.schema)
        if before.too_new:
            raise SchemaTooNewError(
                f"schema {target.schema!r} is at migration version {before.current}, newer than this code "
                f"({before.latest}); migrations are forward-only"
            )
        applied = await _migrate_with_progress(
            conn, target.schema, len(before.pending), transaction_scoped=config.pool.transaction_pooled
        )
        after = await status(conn, target.schema)
    finally:
        await conn.close()
    if args.json:
        print(json.dumps({"schema": target.schema, "applied": applied, "version": after.current}))
    elif applied:
        versions = ", ".join(f"{version:04d}" for version in applied)
        print(f"schema {target.schema}: applied {versions}; now at version {after.current}")
    else:
        print(f"schema {target.schema}: up to date at version {after.current}")
    return EXIT_OK


async def _migrate_with_progress(
    conn: asyncpg.Connection, schema: str, pending: int, *, transaction_scoped: bool
) -> list[int]:
    if not pending:
        return await migrate(conn, schema, transaction_scoped=transaction_scoped)
    progress = Progress(f"migrate {schema}", total=pending, unit="migrations")
    collector = _AppliedLog(progress)
    logger = logging.getLogger("guarded.backends.postgres")
    level = logger.level
    logger.addHandler(collector)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    progress.start()
    try:
        return await migrate(conn, schema, transaction_scoped=transaction_scoped)
    except (KeyboardInterrupt, asyncio.CancelledError):
        done = ", ".join(f"{version:04d}" for version in collector.applied) or "none"
        progress.close()
        raise interrupted(
            f"applied {done} before Ctrl-C ({len(collector.applied)} of {pending}); "
            "the migration in progress was rolled back; run 'guarded pg migrate' again to finish"
        ) from None
    finally:
        progress.close()
        logger.removeHandler(collector)
        logger.setLevel(level)


async def _print_sql(args: argparse.Namespace, target: Target, config: FactoryConfig) -> int:
    if args.from_version is not None:
        if args.from_version > latest_version():
            raise UsageError(
                f"--from {args.from_version}: this code knows versions up to {latest_version()}",
                "a schema newer than this code needs a newer guarded",
            )
        current = args.from_version
    else:
        conn = await _connect(target, config)
        try:
            state = await status(conn, target.schema)
        finally:
            await conn.close()
        if state.too_new:
            raise SchemaTooNewError(
                f"schema {target.schema!r} is at migration version {state.current}, newer than this code "
                f"({state.latest})"
            )
        current = state.current
        if state.pending and [item.version for item in state.pending] != [
            item.version for item in migrations_after(current)
        ]:
            raise ProblemError(
                f"schema {target.schema!r} has gaps in its applied migrations",
                "run 'guarded pg status' and apply them with 'guarded pg migrate'",
            )
    pending = migrations_after(current)
    script = migration_script(
        target.schema, pending, from_version=current, transaction_scoped=config.pool.transaction_pooled
    )
    if args.json:
        print(
            json.dumps(
                {
                    "schema": target.schema,
                    "from_version": current,
                    "to_version": latest_version(),
                    "pending": [item.version for item in pending],
                    "sql": script,
                }
            )
        )
    else:
        sys.stdout.write(script)
    return EXIT_OK


# --- status -------------------------------------------------------------------------------------


async def _status(args: argparse.Namespace, target: Target, config: FactoryConfig) -> int:
    from .table_stats import table_stats

    conn = await _connect(target, config)
    try:
        state = await status(conn, target.schema)
    finally:
        await conn.close()
    stats: dict[str, tuple[int, int]] = {}
    if state.current:
        pool = await _pool(target, config)
        try:
            stats = await table_stats(Database(pool), target.schema)
        finally:
            await pool.close()
    if state.too_new or state.checksum_mismatches:
        code = EXIT_PROBLEM
    elif not state.up_to_date:
        code = EXIT_NOT_MIGRATED
    else:
        code = EXIT_OK
    if args.json:
        print(
            json.dumps(
                {
                    "schema": target.schema,
                    "target": target.identity,
                    "version": state.current,
                    "latest": state.latest,
                    "up_to_date": state.up_to_date,
                    "pending": [item.version for item in state.pending],
                    "checksum_mismatches": list(state.checksum_mismatches),
                    "tables": {name: {"rows": rows, "bytes": size} for name, (rows, size) in stats.items()},
                }
            )
        )
        return code
    print(state)
    if code == EXIT_NOT_MIGRATED:
        print(f"  run 'guarded pg migrate --schema {target.schema}' to apply the pending migrations")
    if stats:
        print()
        print_table(
            _TABLE_COLUMNS,
            [(name, f"~{rows:,}", format_bytes(size)) for name, (rows, size) in sorted(stats.items())],
        )
    return code


_TABLE_COLUMNS = (Column("TABLE"), Column("ROWS", justify="right"), Column("SIZE", justify="right"))


# --- cleanup ------------------------------------------------------------------------------------

_DELETE = re.compile(r'DELETE FROM "[^"]+"\."(?P<table>[a-z_]+)"')


class _CountingDatabase(Database):
    """A :class:`~.connection.Database` that counts the rows each batched ``DELETE`` removes, so the
    command can show progress while :func:`.retention.cleanup` works through the tables."""

    def __init__(self, pool: asyncpg.Pool, progress: Progress) -> None:
        super().__init__(pool)
        self.progress = progress
        self.deleted: dict[str, int] = {}

    async def execute(self, sql: str, *args: Any, repeat_safe: bool = True) -> str:
        result = await super().execute(sql, *args, repeat_safe=repeat_safe)
        found = _DELETE.match(sql)
        if found is not None and result.startswith("DELETE"):
            table = found.group("table")
            rows = int(result.rsplit(" ", 1)[-1])
            self.deleted[table] = self.deleted.get(table, 0) + rows
            self.progress.advance(rows, detail=table)
        return result


@dataclass(frozen=True, slots=True)
class _Retention:
    policy: RetentionPolicy
    grace: float


def _retention(args: argparse.Namespace, config: FactoryConfig) -> _Retention:
    env_policy = config.options.get("retention") or RetentionPolicy()

    def pick(given: float | None, default: float | None) -> float | None:
        return given if given is not None else default

    policy = RetentionPolicy(
        events_max_age=pick(args.max_age_events, env_policy.events_max_age),
        updates_max_age=pick(args.max_age_updates, env_policy.updates_max_age),
        steering_max_age=pick(args.max_age_steering, env_policy.steering_max_age),
        planner_events_max_age=pick(args.max_age_planner_events, env_policy.planner_events_max_age),
    )
    grace = args.grace if args.grace is not None else float(config.options.get("consume_grace", 60.0))
    return _Retention(policy, grace)


async def _cleanup(args: argparse.Namespace, target: Target, config: FactoryConfig) -> int:
    retention = _retention(args, config)
    schema = target.schema
    pool = await _pool(target, config)
    progress = Progress(f"cleanup {schema}", total=None, unit="rows deleted")
    db = _CountingDatabase(pool, progress)
    try:
        async with pool.acquire() as conn:
            state = await status(conn, schema)
            exists = await _schema_exists(conn, schema)
        _require_migrated(state, exists)
        progress.start()
        try:
            found = await cleanup(db, schema, grace=retention.grace, policy=retention.policy)
        except (KeyboardInterrupt, asyncio.CancelledError):
            progress.close()
            done = CleanupReport(dict(db.deleted))
            raise interrupted(
                f"deleted {done.total:,} row(s) before Ctrl-C ({done}); each batch commits on its own, "
                "so what was deleted stays deleted; run 'guarded pg cleanup' again to finish"
            ) from None
        finally:
            progress.close()
    finally:
        await pool.close()
    ages = {
        "flow_events": retention.policy.events_max_age,
        "state_updates": retention.policy.updates_max_age,
        "steering_events": retention.policy.steering_max_age,
        "planner_events": retention.policy.planner_events_max_age,
    }
    if args.json:
        print(
            json.dumps(
                {
                    "schema": schema,
                    "deleted": found.deleted,
                    "dropped_partitions": found.dropped,
                    "dropped_bytes": found.dropped_bytes,
                    "max_age_seconds": ages,
                    "grace_seconds": retention.grace,
                }
            )
        )
    else:
        kept = [table for table, age in ages.items() if age is None]
        print(f"schema {schema}: {found}")
        for table, age in ages.items():
            if age is not None:
                what = "partitions" if table in found.dropped else "rows"
                print(f"  {table}: {what} older than {format_duration(age)} deleted")
        if kept:
            print(f"  kept (no max age): {', '.join(kept)}")
    return EXIT_OK


# --- partition, maintain --------------------------------------------------------------------------


async def _partition(args: argparse.Namespace, target: Target, config: FactoryConfig) -> int:
    period = args.period or config.options.get("partitioning") or "daily"
    schema = target.schema
    conn = await _connect(target, config)
    results: list[StepResult] = []

    def show(result: StepResult) -> None:
        results.append(result)
        if not args.json:
            print(f"  {result.table}: {result.step} {'done' if result.ran else 'already done'}", flush=True)

    try:
        _require_migrated(await status(conn, schema), await _schema_exists(conn, schema))
        await conn.execute("SET statement_timeout = 0")  # index builds and validation scan whole tables
        if not args.json:
            print(f"schema {schema}: partitioning by {period}")
        try:
            await convert_schema(conn, schema, period, now=time.time(), until=args.until, on_step=show)
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise interrupted(
                f"stopped after {sum(item.ran for item in results)} step(s); every step is resumable: run "
                "'guarded pg partition' again to go on"
            ) from None
        layouts = await schema_layout(conn, schema)
    finally:
        await conn.close()
    partitioned = {layout.table.name: layout.partitioned for layout in layouts}
    if args.json:
        steps = [{"table": item.table, "step": item.step, "ran": item.ran} for item in results]
        print(json.dumps({"schema": schema, "period": period, "steps": steps, "partitioned": partitioned}))
    elif all(partitioned.values()):
        print(f"schema {schema}: every history table is partitioned")
    else:
        print(f"schema {schema}: stopped after step {args.until}; run the command again to go on")
    return EXIT_OK


async def _maintain(args: argparse.Namespace, target: Target, config: FactoryConfig) -> int:
    schema = target.schema
    conn = await _connect(target, config)
    try:
        _require_migrated(await status(conn, schema), await _schema_exists(conn, schema))
        if not any(layout.partitioned for layout in await schema_layout(conn, schema)):
            raise ProblemError(
                f"schema {schema!r} is not partitioned", f"run 'guarded pg partition --schema {schema}' first"
            )
        period = args.period or config.options.get("partitioning")
        created = await ensure_partitions(conn, schema, period, now=time.time())
        horizons = {layout.table.name: layout.horizon for layout in await schema_layout(conn, schema)}
    finally:
        await conn.close()
    if args.json:
        print(json.dumps({"schema": schema, "created": created, "horizon": horizons}))
        return EXIT_OK
    for table, horizon in horizons.items():
        ends = "not partitioned" if horizon is None else f"partitions up to {_utc(horizon)}"
        made = len(created.get(table, []))
        print(f"  {table}: {made} partition{'s' if made != 1 else ''} created, {ends}")
    return EXIT_OK


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")


__all__ = ["register"]
