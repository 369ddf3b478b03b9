"""``guarded snapshot capture|list|show|diff|restore|tag|gc``: snapshots from the command line.

Stores are given as ``module:callable`` factories (sync or async, as ``guarded check`` takes
them): ``--snapshots`` names the snapshot store's (or ``GUARDED_SNAPSHOT_STORE``; ``--dir PATH``
is short for a file store in ``PATH``), ``capture --from`` and ``restore --into`` the StateStore's.
``guarded.backends.postgres.factory:create_snapshot_store`` builds a PostgreSQL one from the
``GUARDED_PG_*`` variables. The plain stores are used (no guard): an operator sees every failure.

Exit codes as every command's (docs/cli.md): 0 done; 1 a problem (a corrupt snapshot, a conflict,
a format this code cannot load); 2 a user error (a bad option, a factory that does not import, an
unknown snapshot id); 3 a store that cannot be reached; 4 a PostgreSQL schema not migrated; 130
Ctrl-C, saying what was done. ``--json`` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ..durations import parse_duration
from ..errors import CapabilityError
from ..snapshots import (
    SECTIONS,
    DirectoryContent,
    FileSnapshotStore,
    FormatVersionError,
    InvalidCursorError,
    RetentionPolicy,
    Snapshot,
    SnapshotConflictError,
    SnapshotContent,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    SnapshotStore,
    SnapshotStoreUnavailableError,
    capture,
    restore,
)
from .check import build_store, close_store, load_factory
from .support import (
    EXIT_OK,
    Column,
    CommandError,
    NotMigratedError,
    ProblemError,
    Progress,
    UnreachableError,
    UsageError,
    duration,
    format_bytes,
    interrupted,
    note,
    print_table,
    whole_number,
    with_hint,
)

STORE_VARIABLE = "GUARDED_SNAPSHOT_STORE"
"""The snapshot store's factory when ``--snapshots`` is not given."""
LIST_HINT = "'guarded snapshot list' lists the snapshots"


def register(subparsers: Any) -> None:
    """Add the ``snapshot`` subcommand and its actions."""
    parser = subparsers.add_parser(
        "snapshot",
        help="capture, list, compare, restore, tag and collect snapshots of a session's state",
        description=(
            "Snapshots of what a StateStore holds for one session or trace (docs/snapshots.md). The "
            f"snapshot store is a module:callable factory (--snapshots, or {STORE_VARIABLE}), or a file "
            "store directory (--dir); capture --from and restore --into name StateStore factories."
        ),
        epilog="See docs/cli.md for the exit codes every guarded command shares.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(
        name: str, help_text: str, handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
    ) -> Any:
        sub = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        sub.add_argument(
            "--snapshots",
            metavar="MODULE:CALLABLE",
            help=f"factory of the snapshot store (default: ${STORE_VARIABLE})",
        )
        sub.add_argument(
            "--dir", metavar="PATH", help="a file snapshot store in PATH (instead of --snapshots)"
        )
        sub.add_argument(
            "--app-dir",
            default=".",
            metavar="DIR",
            help="directory put first on sys.path before importing factories (default: the current one)",
        )
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        sub.set_defaults(handler=lambda args: _run(args, handler))
        return sub

    sub = action(
        "capture", "capture a session's or a trace's state from a StateStore into a snapshot", _capture
    )
    sub.add_argument(
        "--from", dest="source", required=True, metavar="MODULE:CALLABLE", help="StateStore factory"
    )
    subject = sub.add_mutually_exclusive_group(required=True)
    subject.add_argument("--session", metavar="ID", help="capture everything of this session")
    subject.add_argument("--trace", metavar="ID", help="capture everything of this trace")
    sub.add_argument("--trace-session", metavar="ID", help="with --trace: the session of its trajectory")
    sub.add_argument(
        "--tag", action="append", default=[], metavar="TAG", help="tag the snapshot (repeatable)"
    )
    sub.add_argument("--description", default="", help="a description kept with the snapshot")
    sub.add_argument("--parent", metavar="ID", help="the snapshot this one follows (lineage)")
    sub.add_argument("--id", dest="snapshot_id", metavar="ID", help="the snapshot's id (default: a new UUID)")
    sub.add_argument(
        "--memory-key", action="append", default=[], metavar="KEY", help="a memory key (repeatable)"
    )
    sub.add_argument("--trace-id", action="append", default=[], metavar="ID", help="a trace of the session")
    sub.add_argument(
        "--pause-token", action="append", default=[], metavar="TOKEN", help="a pause to copy (repeatable)"
    )

    sub = action("list", "list snapshots, oldest first", _list)
    sub.add_argument("--subject", metavar="ID", help="only snapshots of this session or trace")
    sub.add_argument("--kind", choices=("session", "trace"), help="only snapshots of sessions, or of traces")
    sub.add_argument("--tag", metavar="TAG", help="only snapshots with this tag")
    sub.add_argument(
        "--since", type=_when, metavar="WHEN", help="created at or after: ISO time, or an age (2h)"
    )
    sub.add_argument("--until", type=_when, metavar="WHEN", help="created before: ISO time, or an age (30m)")
    sub.add_argument("--limit", type=whole_number(1), default=50, metavar="N", help="snapshots per page (50)")
    sub.add_argument("--cursor", metavar="CURSOR", help="the page after this cursor (printed by a listing)")
    sub.add_argument("--all", action="store_true", help="every page")

    sub = action("show", "show a snapshot's record and lineage", _show)
    sub.add_argument("snapshot_id", metavar="ID")

    sub = action("diff", "what changed from snapshot A to snapshot B", _diff)
    sub.add_argument("a", metavar="A")
    sub.add_argument("b", metavar="B")

    sub = action(
        "restore", "write a snapshot into a StateStore (idempotent: again is the same as once)", _restore
    )
    sub.add_argument("snapshot_id", metavar="ID")
    sub.add_argument("--into", required=True, metavar="MODULE:CALLABLE", help="StateStore factory")
    sub.add_argument("--include-pauses", action="store_true", help="restore pause tokens too")
    sub.add_argument(
        "--skip-unsupported", action="store_true", help="leave out sections the store cannot take"
    )

    sub = action("tag", "add tags to a snapshot (or remove them with --remove)", _tag)
    sub.add_argument("snapshot_id", metavar="ID")
    sub.add_argument("tags", nargs="+", metavar="TAG")
    sub.add_argument("--remove", action="store_true", help="remove the tags instead")

    sub = action("gc", "delete what the retention policy no longer keeps, then unreferenced blobs", _gc)
    sub.add_argument("--keep-last", type=whole_number(1), metavar="N", help="per subject, keep the newest N")
    sub.add_argument(
        "--max-age", type=duration(), metavar="DURATION", help="delete snapshots older than this"
    )
    sub.add_argument("--include-tagged", action="store_true", help="apply the policy to tagged snapshots too")
    sub.add_argument(
        "--grace", type=duration(allow_zero=True), default=0.0, metavar="DURATION", help="keep younger blobs"
    )


# --- values --------------------------------------------------------------------------------------


def _when(text: str) -> datetime:
    """An ISO-8601 time (UTC when it names no zone) or an age: ``2h`` is two hours ago."""
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        try:
            return datetime.now(UTC) - timedelta(seconds=parse_duration(text))
        except ValueError:
            raise argparse.ArgumentTypeError(
                with_hint(f"{text!r} is neither a time nor an age", "write 2026-01-31T12:00:00Z or 2h, 30d")
            ) from None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


# --- running an action ---------------------------------------------------------------------------


class _State:
    """What an action has done so far (for Ctrl-C)."""

    def __init__(self) -> None:
        self.done = "nothing was changed"


def _run(args: argparse.Namespace, handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> int:
    sys.path.insert(0, os.path.abspath(args.app_dir))
    args.state = _State()
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        raise interrupted(args.state.done) from None
    except CommandError:
        raise
    except SnapshotNotFoundError as exc:
        raise UsageError(str(exc), LIST_HINT) from exc
    except InvalidCursorError as exc:
        raise UsageError(str(exc), "pass the cursor a listing printed, or leave --cursor out") from exc
    except FormatVersionError as exc:
        raise ProblemError(
            str(exc), "load it with the guarded release (or migrations) that knows it"
        ) from exc
    except (SnapshotCorruptError, SnapshotConflictError) as exc:
        raise ProblemError(str(exc), "nothing was changed; capture again under a new id") from exc
    except CapabilityError as exc:
        raise UsageError(str(exc), "pass --skip-unsupported to leave those sections out") from exc
    except SnapshotStoreUnavailableError as exc:
        raise UnreachableError(str(exc), "check that the store's backend is up") from exc
    except Exception as exc:
        raise _backend_failure(exc) from exc


def _backend_failure(exc: BaseException) -> CommandError:
    from ..backends.postgres.cli_target import is_unreachable
    from ..backends.postgres.migrations import SchemaNotMigratedError, SchemaTooNewError

    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, SchemaNotMigratedError):
        return NotMigratedError(str(exc), "run 'guarded pg migrate' for the store's schema")
    if isinstance(exc, SchemaTooNewError):
        return ProblemError(str(exc), "upgrade guarded")
    if is_unreachable(exc):
        return UnreachableError(
            f"a store stopped answering: {why}", "check that its backend is up, then run the command again"
        )
    if isinstance(exc, ValueError):
        return UsageError(why, "check the values given")
    raise exc


async def _snapshot_store(args: argparse.Namespace) -> Any:
    if args.dir is not None:
        if args.snapshots is not None:
            raise UsageError("--dir and --snapshots both name the snapshot store", "pass one of them")
        return FileSnapshotStore(Path(args.dir))
    spec = args.snapshots or os.environ.get(STORE_VARIABLE) or None
    if spec is None:
        raise UsageError(
            "no snapshot store given",
            f"pass --dir PATH (a file store) or --snapshots MODULE:CALLABLE (or set {STORE_VARIABLE})",
        )
    store = await _build(spec)
    if not isinstance(store, SnapshotStore):
        await close_store(store)
        raise UsageError(
            f"{spec!r} returned a {type(store).__qualname__}, not a SnapshotStore",
            "name a factory returning a snapshot store, e.g. "
            "guarded.backends.postgres.factory:create_snapshot_store",
        )
    return store


async def _state_store(spec: str) -> Any:
    return await _build(spec)


async def _build(spec: str) -> Any:
    """The store a factory returns; a PostgreSQL schema that is not migrated exits 4, as
    ``guarded pg`` commands do, not as a failing factory."""
    from ..backends.postgres.migrations import SchemaNotMigratedError

    factory = load_factory(spec)
    try:
        return await build_store(factory, spec)
    except CommandError as exc:
        cause = exc.__cause__
        if isinstance(cause, SchemaNotMigratedError):
            raise NotMigratedError(str(cause), "run 'guarded pg migrate' for the store's schema") from cause
        raise


def _emit(args: argparse.Namespace, data: Any, text: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, ensure_ascii=False, default=_json_default))
    else:
        text()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Snapshot):
        return value.manifest()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _total(snapshot: Snapshot) -> int:
    return sum(snapshot.counts.get(name, 0) for name in SECTIONS)


def _counted(content: SnapshotContent, progress: Progress) -> SnapshotContent:
    """``content`` whose lines advance ``progress`` as they are read."""
    if isinstance(content, DirectoryContent):
        return _CountedDirectory(content, progress)
    return _CountedContent(content, progress)


class _CountedDirectory(DirectoryContent):
    def __init__(self, content: DirectoryContent, progress: Progress) -> None:
        super().__init__(content.snapshot, content.sections_dir, content.blob_path)
        self._progress = progress

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        async for batch in super().lines(section):
            self._progress.advance(len(batch), detail=section)
            yield batch


class _CountedContent:
    def __init__(self, content: SnapshotContent, progress: Progress) -> None:
        self._content = content
        self._progress = progress

    @property
    def snapshot(self) -> Snapshot:
        return self._content.snapshot

    async def lines(self, section: str) -> AsyncIterator[list[bytes]]:
        async for batch in self._content.lines(section):
            self._progress.advance(len(batch), detail=section)
            yield batch

    async def read_blob(self, digest: str) -> bytes:
        return await self._content.read_blob(digest)

    async def aclose(self) -> None:
        await self._content.aclose()


def _counts_line(snapshot: Snapshot) -> str:
    parts = [f"{snapshot.counts[name]:,} {name}" for name in SECTIONS if snapshot.counts.get(name)]
    return ", ".join(parts) or "empty"


# --- the actions ---------------------------------------------------------------------------------


async def _capture(args: argparse.Namespace) -> int:
    snapshots = await _snapshot_store(args)
    try:
        source = await _state_store(args.source)
        try:
            started = time.perf_counter()
            with Progress("capture", total=None, unit="records") as reading:
                captured = await capture(
                    source,
                    session_id=args.session if args.trace is None else args.trace_session,
                    trace_id=args.trace,
                    parent=args.parent,
                    tags=args.tag,
                    description=args.description,
                    memory_keys=args.memory_key,
                    trace_ids=args.trace_id,
                    pause_tokens=args.pause_token,
                    snapshot_id=args.snapshot_id,
                    progress=lambda section, count: reading.advance(count, detail=section),
                )
        finally:
            await close_store(source)
        args.state.done = "nothing was saved (a snapshot is published whole or not at all)"
        async with captured:
            with Progress("save", total=_total(captured.snapshot), unit="records") as progress:
                saved: Snapshot = await snapshots.save(_counted(captured, progress))
        seconds = time.perf_counter() - started
    finally:
        await close_store(snapshots)

    def text() -> None:
        print(
            f"captured snapshot {saved.id} of {saved.subject_kind} {saved.subject_id}: "
            f"{_counts_line(saved)}; {format_bytes(saved.total_bytes)} in {seconds:.1f}s"
        )

    _emit(args, {"snapshot": saved.manifest(), "seconds": round(seconds, 3)}, text)
    return EXIT_OK


async def _list(args: argparse.Namespace) -> int:
    snapshots = await _snapshot_store(args)
    items: list[Snapshot] = []
    cursor = args.cursor
    try:
        while True:
            page = await snapshots.list(
                subject_kind=args.kind,
                subject_id=args.subject,
                tag=args.tag,
                since=args.since,
                until=args.until,
                limit=args.limit,
                cursor=cursor,
            )
            items.extend(page.items)
            cursor = page.next_cursor
            if cursor is None or not args.all:
                break
    finally:
        await close_store(snapshots)

    def text() -> None:
        columns = [
            Column("ID", 36),
            Column("SUBJECT", 40),
            Column("CREATED"),
            Column("TAGS", 30),
            Column("RECORDS", justify="right"),
            Column("SIZE", justify="right"),
            Column("PARENT", 36),
        ]
        rows = [
            (
                s.id,
                f"{s.subject_kind}:{s.subject_id}",
                s.created_at.isoformat(timespec="seconds"),
                ",".join(s.tags) or None,
                f"{_total(s):,}",
                format_bytes(s.total_bytes),
                s.parent_id,
            )
            for s in items
        ]
        if rows:
            print_table(columns, rows)
        else:
            print("no snapshots")
        if cursor is not None:
            note(f"more snapshots: pass --cursor {cursor} (or --all)")

    _emit(args, {"items": [s.manifest() for s in items], "next_cursor": cursor}, text)
    return EXIT_OK


async def _show(args: argparse.Namespace) -> int:
    snapshots = await _snapshot_store(args)
    try:
        chain = await snapshots.lineage(args.snapshot_id)
    finally:
        await close_store(snapshots)
    snapshot = chain[0]

    def text() -> None:
        lines = [
            ("id", snapshot.id),
            ("subject", f"{snapshot.subject_kind} {snapshot.subject_id}"),
            ("created", snapshot.created_at.isoformat()),
            ("format version", str(snapshot.format_version)),
            ("tags", ", ".join(snapshot.tags) or "-"),
            ("description", snapshot.description or "-"),
            ("content hash", snapshot.content_hash),
            ("size", format_bytes(snapshot.total_bytes)),
            ("lineage", " <- ".join(s.id for s in chain) + _lost_parent(chain)),
        ]
        for key, value in lines:
            print(f"{key + ':':<16}{value}")
        for name in SECTIONS:
            print(
                f"  {name + ':':<16}{snapshot.counts.get(name, 0):>10,}  "
                f"{format_bytes(snapshot.sizes.get(name, 0))}"
            )

    _emit(args, {"snapshot": snapshot.manifest(), "lineage": [s.id for s in chain]}, text)
    return EXIT_OK


def _lost_parent(chain: list[Snapshot]) -> str:
    parent = chain[-1].parent_id
    return f" <- {parent} (deleted)" if parent is not None else ""


DIFF_FIELDS = (
    "events_added",
    "events_removed",
    "planner_events_added",
    "updates_added",
    "steering_added",
    "memory_changed",
    "tasks_changed",
    "trajectories_changed",
    "bindings_changed",
    "pauses_changed",
    "artifacts_added",
    "artifacts_removed",
)


async def _diff(args: argparse.Namespace) -> int:
    snapshots = await _snapshot_store(args)
    try:
        found = await snapshots.diff(args.a, args.b)
    finally:
        await close_store(snapshots)

    def text() -> None:
        if found.empty:
            print(f"{args.a} and {args.b} hold the same state")
            return
        print(f"from {args.a} to {args.b}:")
        for name in DIFF_FIELDS:
            count = len(getattr(found, name))
            if count:
                print(f"  {name.replace('_', ' ')}: {count:,}")
                for change in getattr(found, name)[:5]:
                    key = getattr(change, "key", None)
                    if key is not None:
                        print(f"    {key}")
        for section, count in sorted(found.removed.items()):
            print(f"  {section} removed: {count:,}")

    data = {name: getattr(found, name) for name in DIFF_FIELDS}
    _emit(args, {"a": args.a, "b": args.b, "empty": found.empty, **data, "removed": found.removed}, text)
    return EXIT_OK


async def _restore(args: argparse.Namespace) -> int:
    snapshots = await _snapshot_store(args)
    try:
        target = await _state_store(args.into)
        try:
            started = time.perf_counter()
            async with await snapshots.load(args.snapshot_id) as content:
                snapshot = content.snapshot
                progress = Progress("restore", total=_total(snapshot), unit="records")
                args.state.done = "nothing was restored yet"
                with progress:
                    try:
                        report = await restore(
                            _counted(content, progress),
                            target,
                            include_pauses=args.include_pauses,
                            skip_unsupported=args.skip_unsupported,
                        )
                    except (KeyboardInterrupt, asyncio.CancelledError):
                        args.state.done = (
                            f"read {progress.done:,} of {progress.total:,} records of snapshot "
                            f"{snapshot.id}; what was written stays; restore is idempotent: run it "
                            "again to finish"
                        )
                        raise
            seconds = time.perf_counter() - started
        finally:
            await close_store(target)
    finally:
        await close_store(snapshots)
    written, skipped = sum(report.written.values()), sum(report.skipped.values())

    def text() -> None:
        print(
            f"restored snapshot {snapshot.id} ({snapshot.subject_kind} {snapshot.subject_id}): "
            f"{written:,} record(s) written, {skipped:,} already there or newer, in {seconds:.1f}s"
        )
        if report.unsupported:
            note(f"left out (the store cannot take them): {', '.join(report.unsupported)}")

    _emit(
        args,
        {
            "snapshot": snapshot.id,
            "written": report.written,
            "skipped": report.skipped,
            "unsupported": report.unsupported,
            "seconds": round(seconds, 3),
        },
        text,
    )
    return EXIT_OK


async def _tag(args: argparse.Namespace) -> int:
    snapshots = await _snapshot_store(args)
    try:
        change = snapshots.untag if args.remove else snapshots.tag
        updated: Snapshot = await change(args.snapshot_id, args.tags)
    finally:
        await close_store(snapshots)
    _emit(
        args,
        {"snapshot": updated.manifest()},
        lambda: print(f"{updated.id}: {', '.join(updated.tags) or '-'}"),
    )
    return EXIT_OK


async def _gc(args: argparse.Namespace) -> int:
    policy = RetentionPolicy(
        max_age=None if args.max_age is None else timedelta(seconds=args.max_age),
        keep_last=args.keep_last,
        keep_tagged=not args.include_tagged,
        grace=timedelta(seconds=args.grace),
    )
    snapshots = await _snapshot_store(args)
    try:
        args.state.done = "what gc deleted before Ctrl-C stays deleted; run it again to finish"
        report = await snapshots.gc(policy)
    finally:
        await close_store(snapshots)

    def text() -> None:
        print(
            f"gc: {len(report.snapshots_deleted):,} snapshot(s) deleted, {report.blobs_deleted:,} blob(s) "
            f"deleted ({format_bytes(report.bytes_freed)} freed), {report.blobs_kept:,} kept"
        )
        for snapshot_id in report.snapshots_deleted:
            print(f"  deleted {snapshot_id}")

    _emit(args, dataclasses.asdict(report), text)
    return EXIT_OK


__all__ = ["STORE_VARIABLE", "register"]
