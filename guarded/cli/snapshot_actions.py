"""The ``guarded snapshot`` actions: ``capture``, ``list``, ``show``, ``diff``, ``restore``, ``tag``
and ``gc``, each run on the stores :mod:`.snapshot_run` opens, printing through
:mod:`.snapshot_output`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from datetime import timedelta

from ..snapshots import SECTIONS, RetentionPolicy, Snapshot, capture, restore
from ..snapshots.record import DIFF_FIELDS
from .check import close_store
from .formatting import Column, format_bytes, print_table
from .progress import Progress
from .snapshot_output import counted, counts_line, emit, total_records
from .snapshot_run import snapshot_store, state_store
from .support import EXIT_OK, note


async def capture_command(args: argparse.Namespace) -> int:
    """``capture``: a session's or a trace's state from a StateStore into a new snapshot."""
    snapshots = await snapshot_store(args, access="create")
    try:
        source = await state_store(args.source)
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
            with Progress("save", total=total_records(captured.snapshot), unit="records") as progress:
                saved: Snapshot = await snapshots.save(counted(captured, progress))
        seconds = time.perf_counter() - started
    finally:
        await close_store(snapshots)

    not_enumerated = captured.not_enumerated

    def text() -> None:
        print(
            f"captured snapshot {saved.id} of {saved.subject_kind} {saved.subject_id}: "
            f"{counts_line(saved)}; {format_bytes(saved.total_bytes)} in {seconds:.1f}s"
        )
        if not_enumerated:
            note(
                "read only for the keys named or derived (the store cannot list them): "
                + ", ".join(not_enumerated)
            )

    emit(
        args,
        {"snapshot": saved.manifest(), "not_enumerated": not_enumerated, "seconds": round(seconds, 3)},
        text,
    )
    return EXIT_OK


async def list_command(args: argparse.Namespace) -> int:
    """``list``: snapshots, oldest first, a page of them (or every page with ``--all``)."""
    snapshots = await snapshot_store(args, access="read")
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
                f"{total_records(s):,}",
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

    emit(args, {"items": [s.manifest() for s in items], "next_cursor": cursor}, text)
    return EXIT_OK


async def show_command(args: argparse.Namespace) -> int:
    """``show``: a snapshot's record and lineage."""
    snapshots = await snapshot_store(args, access="read")
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

    emit(args, {"snapshot": snapshot.manifest(), "lineage": [s.id for s in chain]}, text)
    return EXIT_OK


def _lost_parent(chain: list[Snapshot]) -> str:
    parent = chain[-1].parent_id
    return f" <- {parent} (deleted)" if parent is not None else ""


async def diff_command(args: argparse.Namespace) -> int:
    """``diff``: what changed from snapshot A to snapshot B."""
    snapshots = await snapshot_store(args, access="read")
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
    emit(args, {"a": args.a, "b": args.b, "empty": found.empty, **data, "removed": found.removed}, text)
    return EXIT_OK


async def restore_command(args: argparse.Namespace) -> int:
    """``restore``: a snapshot written into a StateStore (idempotent; the store's newer data wins
    unless ``--rollback``)."""
    snapshots = await snapshot_store(args, access="read")
    try:
        target = await state_store(args.into)
        try:
            started = time.perf_counter()
            async with await snapshots.load(args.snapshot_id) as content:
                snapshot = content.snapshot
                progress = Progress("restore", total=total_records(snapshot), unit="records")
                args.state.done = "nothing was restored yet"
                with progress:
                    try:
                        report = await restore(
                            counted(content, progress),
                            target,
                            include_pauses=args.include_pauses,
                            skip_unsupported=args.skip_unsupported,
                            rollback=args.rollback,
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
        if args.include_pauses and not args.rollback and report.skipped["pauses"]:
            note(
                f"{report.skipped['pauses']:,} pause(s) not restored: only a roll-back re-creates "
                "a pause (the store may have consumed it); pass --rollback"
            )
        for section, keys in report.overwritten.items():
            shown = ", ".join(keys[:5]) + (f", ... ({len(keys):,} in all)" if len(keys) > 5 else "")
            print(f"  overwrote {section}: {shown}")

    emit(
        args,
        {
            "snapshot": snapshot.id,
            "rollback": report.rollback,
            "written": report.written,
            "skipped": report.skipped,
            "overwritten": report.overwritten,
            "unsupported": report.unsupported,
            "seconds": round(seconds, 3),
        },
        text,
    )
    return EXIT_OK


async def tag_command(args: argparse.Namespace) -> int:
    """``tag``: tags added to a snapshot (or removed with ``--remove``)."""
    snapshots = await snapshot_store(args, access="write")
    try:
        change = snapshots.untag if args.remove else snapshots.tag
        updated: Snapshot = await change(args.snapshot_id, args.tags)
    finally:
        await close_store(snapshots)
    emit(
        args,
        {"snapshot": updated.manifest()},
        lambda: print(f"{updated.id}: {', '.join(updated.tags) or '-'}"),
    )
    return EXIT_OK


async def gc_command(args: argparse.Namespace) -> int:
    """``gc``: what the retention policy no longer keeps deleted, then unreferenced blobs."""
    policy = RetentionPolicy(
        max_age=None if args.max_age is None else timedelta(seconds=args.max_age),
        keep_last=args.keep_last,
        keep_tagged=not args.include_tagged,
        grace=timedelta(seconds=args.grace),
    )
    snapshots = await snapshot_store(args, access="write")
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

    emit(args, dataclasses.asdict(report), text)
    return EXIT_OK


__all__ = [
    "DIFF_FIELDS",
    "capture_command",
    "diff_command",
    "gc_command",
    "list_command",
    "restore_command",
    "show_command",
    "tag_command",
]
