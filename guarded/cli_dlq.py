"""``guarded dlq list|stats|replay|purge``: inspect and operate the dead-letter spill files of a path.

``--path`` is the configured spill path (``{name}`` replaced): the commands work on every slot
file of it (the path itself, and ``<path>.<k>`` of the other processes configured with it; see
:mod:`guarded.deadletter.slots`) and say which file each write is in. ``list`` and ``stats``
open the files read-only and work beside the live processes that own them. ``replay`` and
``purge`` need a file's lock: a file held by a live process is skipped (exit 1). A file that
cannot be read (damaged, foreign, of a newer layout) gets one error line, the others are still
served, and the exit status is 2. Rows of a file that cannot be read (a column of the wrong type,
text that is not UTF-8, a call that is not JSON) never stop a command: they are left out, counted,
and listed by ``list --quarantined`` (a guard or ``replay`` moves them to the file's quarantine
table). Payload contents are never printed unless ``list --show-payload`` asks for them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import glob
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry

from .batching import bulk_methods_of
from .cli_check import UsageError, build_store, close_store, load_factory
from .config import DeadLetterConfig
from .deadletter import (
    DeadLetter,
    DeadLetterBuffer,
    ParkedWrite,
    QuarantinedRow,
    ReplaySummary,
    SpillFile,
    SpillFileError,
    SpillFileLockedError,
    store_sender,
)
from .deadletter.slots import slot_files
from .deadletter.spill import SpillTotals, holder_pid, is_locked

if TYPE_CHECKING:
    from .cli import Subparsers

PROG = "guarded dlq"

T = TypeVar("T")


def register(subparsers: Subparsers) -> None:
    """Add the ``dlq`` subcommand and its own subcommands."""
    parser = subparsers.add_parser(
        "dlq",
        help="inspect, replay or purge the dead-letter spill files of a path",
        description=(
            "Inspect and operate the dead-letter spill files of a guarded store: the configured path "
            "and the slot files of the other processes configured with it (PATH.1, PATH.2, ...). list "
            "and stats read the files while their processes run; replay and purge skip files held by "
            "a live process."
        ),
    )
    commands = parser.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--path", required=True, metavar="PATH", help="the configured spill path (its slot files too)"
        )
        sub.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        return sub

    listing = add("list", "list waiting (or parked) writes, oldest first per file, without payloads")
    which = listing.add_mutually_exclusive_group()
    which.add_argument("--parked", action="store_true", help="list parked writes instead")
    which.add_argument(
        "--quarantined",
        action="store_true",
        help="list the rows that could not be read instead (with --show-payload: their raw bytes)",
    )
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most N rows (default 50)")
    listing.add_argument(
        "--show-payload", action="store_true", help="include each write's encoded call (payload contents)"
    )
    listing.set_defaults(handler=run_list)

    add("stats", "counts, sizes and the age of the oldest waiting write, per file").set_defaults(
        handler=run_stats
    )

    replay = add("replay", "replay waiting writes into the store a factory builds")
    replay.add_argument(
        "--store",
        required=True,
        metavar="MODULE:CALLABLE",
        help="factory returning the store (sync or async), e.g. myapp.stores:create_store",
    )
    replay.add_argument("--rate", type=float, default=None, metavar="R", help="writes per second at most")
    replay.add_argument(
        "--include-parked", action="store_true", help="first move parked writes back to the waiting ones"
    )
    replay.add_argument(
        "--target",
        default=None,
        metavar="TARGET",
        help="only files recorded for this backend target (and files with none); needed when the "
        "files record more than one",
    )
    replay.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="directory put first on sys.path before importing the factory (default: the current one)",
    )
    replay.set_defaults(handler=run_replay)

    purge = add("purge", "delete waiting and/or parked writes (data loss: needs --yes)")
    purge.add_argument("--pending", action="store_true", help="delete the waiting writes")
    purge.add_argument("--parked", action="store_true", help="delete the parked writes")
    purge.add_argument(
        "--quarantined", action="store_true", help="delete the rows moved to the quarantine tables"
    )
    purge.add_argument("--yes", action="store_true", help="confirm the deletion")
    purge.set_defaults(handler=run_purge)


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def _cell(value: object, width: int) -> str:
    text = "-" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int]) -> str:
    lines = ["  ".join(f"{header:<{width}}" for header, width in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [_cell(value, width) for value, width in zip(row, widths, strict=True)]
        lines.append(
            "  ".join(f"{cell:<{width}}" for cell, width in zip(cells, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


# --- the files of a path ---------------------------------------------------------------------------


@dataclass
class _File:
    """One slot file of the path, as a command sees it."""

    slot: int
    path: str
    error: str | None = None
    target: str | None = None
    in_use: bool = False
    pid: int | None = None


class _Failures:
    """Files a command could not serve: one error line each, exit status 2 at the end."""

    def __init__(self) -> None:
        self.count = 0

    def report(self, file: _File, message: str) -> None:
        self.count += 1
        file.error = message
        _error(message)


def _slot_files(base: str) -> list[_File]:
    found = [_File(slot, path) for slot, path in slot_files(base)]
    if not found:
        if os.path.isdir(base):
            raise UsageError(f"{base!r} is a directory; give the spill path (a file name)")
        raise UsageError(f"no dead-letter spill file at {base!r}")
    for file in found:
        file.in_use = is_locked(file.path)
        file.pid = holder_pid(file.path) if file.in_use else None
    return found


def _read(file: _File, failures: _Failures, read: Callable[[SpillFile], T]) -> T | None:
    """``read`` of ``file`` opened read-only; ``None`` (and one error line) when it cannot be."""
    try:
        spill = SpillFile.open_read_only(file.path)
    except SpillFileError as exc:
        failures.report(file, str(exc))
        return None
    try:
        file.target = spill.target
        return read(spill)
    except Exception as exc:  # a damaged page shows only when it is read
        failures.report(file, f"cannot read dead-letter spill file {file.path!r}: {exc}")
        return None
    finally:
        spill.close()


def _file_dict(file: _File) -> dict[str, Any]:
    return {
        "slot": file.slot,
        "path": file.path,
        "target": file.target,
        "in_use": file.in_use,
        "pid": file.pid,
        "error": file.error,
    }


def _set_aside(base: str) -> list[str]:
    """Damaged files of ``base``'s slots that were renamed aside for inspection."""
    names = glob.glob(glob.escape(base) + "*.corrupt-*")
    return sorted(name for name in names if not name.endswith(("-wal", "-shm")))


# --- list -----------------------------------------------------------------------------------------


def _pending_dict(entry: DeadLetter, file: _File, now: float, show_payload: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
        "slot": file.slot,
        "file": file.path,
        "seq": entry.seq,
        "method": entry.method,
        "key": entry.key,
        "scope": entry.scope,
        "enqueued_at": entry.enqueued_at,
        "age_seconds": round(max(0.0, now - entry.enqueued_at), 3),
        "size": entry.size,
        "error": entry.error,
    }
    if show_payload:
        found["call"] = entry.call
    return found


def _parked_dict(write: ParkedWrite, file: _File, now: float, show_payload: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
        "slot": file.slot,
        "file": file.path,
        "seq": write.seq,
        "method": write.method,
        "parked_at": write.parked_at,
        "age_seconds": round(max(0.0, now - write.parked_at), 3),
        "size": write.size,
        "reason": write.reason,
        "call_kept": write.call is not None,
    }
    if show_payload:
        found["call"] = write.call
    return found


def _raw_dict(raw: Sequence[tuple[str, str, object]]) -> dict[str, Any]:
    """A quarantined row's columns as stored: text and blobs as base64 of their bytes, plus the text
    they read as (bytes that are not UTF-8 escaped)."""
    found: dict[str, Any] = {}
    for name, kind, value in raw:
        if isinstance(value, bytes):
            found[name] = {
                "type": kind,
                "base64": base64.b64encode(value).decode("ascii"),
                "text": value.decode("utf-8", "backslashreplace"),
            }
        else:
            found[name] = {"type": kind, "value": value}
    return found


def _quarantined_dict(row: QuarantinedRow, file: _File, now: float, show_payload: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
        "slot": file.slot,
        "file": file.path,
        "id": row.id,
        "source": row.source,
        "moved": row.id is not None,
        "seq": row.seq,
        "method": row.method,
        "quarantined_at": row.quarantined_at,
        "age_seconds": None if row.quarantined_at is None else round(max(0.0, now - row.quarantined_at), 3),
        "reason": row.reason,
    }
    if show_payload:
        found["raw"] = _raw_dict(row.raw)
    return found


_Listed = list[DeadLetter] | list[ParkedWrite] | list[QuarantinedRow]


def _list(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise UsageError("--limit must not be negative")
    files = _slot_files(args.path)
    failures = _Failures()
    now = time.time()
    rows: list[dict[str, Any]] = []
    total = 0
    unreadable: list[tuple[_File, int]] = []
    for file in files:
        left = max(0, args.limit - len(rows))

        def read(spill: SpillFile, left: int = left) -> tuple[int, _Listed, int]:
            totals = spill.totals()
            if args.quarantined:
                return totals.quarantined, spill.quarantined(left, with_raw=args.show_payload), 0
            if args.parked:
                return totals.parked, spill.parked(left), totals.quarantined
            return totals.pending, spill.page(0, left), totals.quarantined

        found = _read(file, failures, read)
        if found is None:
            continue
        count, items, bad = found
        total += count
        if bad:
            unreadable.append((file, bad))
        for item in items:
            if isinstance(item, QuarantinedRow):
                rows.append(_quarantined_dict(item, file, now, args.show_payload))
            elif isinstance(item, ParkedWrite):
                rows.append(_parked_dict(item, file, now, args.show_payload))
            else:
                rows.append(_pending_dict(item, file, now, args.show_payload))
    kind = "quarantined" if args.quarantined else "parked" if args.parked else "pending"
    status = 2 if failures.count else 0
    if args.json:
        document = {
            "path": args.path,
            "kind": kind,
            "total": total,
            "unreadable": sum(count for _, count in unreadable),
            "files": [_file_dict(file) for file in files],
            "entries": rows,
        }
        print(json.dumps(document, ensure_ascii=False))
        return status
    where = f"{args.path}" + (f" ({len(files)} files)" if len(files) > 1 else "")
    for file, count in unreadable:
        print(
            f"{PROG}: note: {count} row(s) of {file.path!r} could not be read and are not listed; "
            "see 'list --quarantined'",
            file=sys.stderr,
        )
    if not rows:
        print(f"no {kind} {'rows' if args.quarantined else 'writes'} in {where}")
        return status
    if args.quarantined:
        table = _table(
            ("SLOT", "ID", "FROM", "SEQ", "METHOD", "AGE", "REASON"),
            [
                (
                    row["slot"],
                    row["id"] if row["moved"] else "in place",
                    row["source"],
                    row["seq"],
                    row["method"],
                    "-" if row["age_seconds"] is None else _age(row["age_seconds"]),
                    row["reason"],
                )
                for row in rows
            ],
            (4, 8, 7, 8, 22, 8, 70),
        )
    elif args.parked:
        table = _table(
            ("SLOT", "SEQ", "METHOD", "AGE", "SIZE", "CALL", "REASON"),
            [
                (
                    row["slot"],
                    row["seq"],
                    row["method"],
                    _age(row["age_seconds"]),
                    row["size"],
                    "kept" if row["call_kept"] else "lost",
                    row["reason"],
                )
                for row in rows
            ],
            (4, 8, 22, 8, 8, 5, 70),
        )
    else:
        table = _table(
            ("SLOT", "SEQ", "METHOD", "KEY", "SCOPE", "AGE", "SIZE", "ERROR"),
            [
                (
                    row["slot"],
                    row["seq"],
                    row["method"],
                    row["key"],
                    row["scope"],
                    _age(row["age_seconds"]),
                    row["size"],
                    row["error"],
                )
                for row in rows
            ],
            (4, 8, 22, 30, 24, 8, 8, 40),
        )
    print(table)
    if args.show_payload:
        print()
        for row in rows:
            if args.quarantined:
                name = f"{row['slot']}/{row['id'] if row['moved'] else 'seq ' + str(row['seq'])}"
                print(f"{name}: {json.dumps(row['raw'], ensure_ascii=False)}")
            else:
                print(f"{row['slot']}/{row['seq']}: {json.dumps(row['call'], ensure_ascii=False)}")
    shown = len(rows)
    print(
        f"\n{shown} of {total} {kind} {'row' if args.quarantined else 'write'}(s) in {where}"
        + (" (use --limit to see more)" if shown < total else "")
    )
    if len(files) > 1:
        print("slots: " + ", ".join(f"{file.slot} = {file.path}" for file in files))
    return status


# --- stats ----------------------------------------------------------------------------------------


def _stats_dict(path: str, totals: SpillTotals, now: float) -> dict[str, Any]:
    return {
        "path": path,
        "pending": totals.pending,
        "pending_bytes": totals.pending_bytes,
        "parked": totals.parked,
        "parked_bytes": totals.parked_bytes,
        "quarantined": totals.quarantined,
        "oldest_age_seconds": 0.0 if totals.oldest is None else round(max(0.0, now - totals.oldest[1]), 3),
        "file_bytes": sum(os.path.getsize(name) for name in (path, path + "-wal") if os.path.exists(name)),
    }


def _stats(args: argparse.Namespace) -> int:
    files = _slot_files(args.path)
    failures = _Failures()
    now = time.time()
    per_file: list[dict[str, Any]] = []
    by_method: dict[str, dict[str, int]] = {}
    totals = {
        "pending": 0,
        "pending_bytes": 0,
        "parked": 0,
        "parked_bytes": 0,
        "quarantined": 0,
        "file_bytes": 0,
    }
    oldest = 0.0
    for file in files:
        found = _read(file, failures, lambda spill: (spill.totals(), spill.by_method()))
        if found is None:
            per_file.append(_file_dict(file))
            continue
        file_totals, methods = found
        document = {**_file_dict(file), **_stats_dict(file.path, file_totals, now)}
        per_file.append(document)
        for name in totals:
            totals[name] += document[name]
        if file_totals.pending:
            oldest = max(oldest, document["oldest_age_seconds"])
        for method, count, size in methods:
            counts = by_method.setdefault(method, {"pending": 0, "bytes": 0})
            counts["pending"] += count
            counts["bytes"] += size
    aside = _set_aside(args.path)
    summary: dict[str, Any] = {
        "path": args.path,
        **totals,
        "oldest_age_seconds": oldest,
        "by_method": dict(sorted(by_method.items())),
        "files": per_file,
        "set_aside": aside,
    }
    status = 2 if failures.count else 0
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
        return status
    print(f"dead-letter spill files of {args.path} (in {os.path.dirname(os.path.abspath(args.path))})")
    print(f"  pending:     {summary['pending']} ({_size(summary['pending_bytes'])})")
    print(f"  parked:      {summary['parked']} ({_size(summary['parked_bytes'])})")
    if summary["quarantined"]:
        print(f"  quarantined: {summary['quarantined']} unreadable row(s), not replayed (list --quarantined)")
    print(f"  oldest:      {_age(oldest) if summary['pending'] else '-'}")
    print(f"  file size:   {_size(summary['file_bytes'])}")
    print()
    print(
        _table(
            ("SLOT", "FILE", "IN USE", "PENDING", "PARKED", "TARGET"),
            [
                (
                    row["slot"],
                    os.path.basename(row["path"]),
                    _in_use(row),
                    "error" if row["error"] else row["pending"],
                    "-" if row["error"] else row["parked"],
                    row["target"] or "(not recorded)",
                )
                for row in per_file
            ],
            (4, 32, 10, 8, 8, 40),
        )
    )
    if by_method:
        print()
        print(
            _table(
                ("METHOD", "PENDING", "BYTES"),
                [
                    (method, counts["pending"], counts["bytes"])
                    for method, counts in summary["by_method"].items()
                ],
                (24, 8, 12),
            )
        )
    if aside:
        print()
        print(f"damaged files set aside for inspection: {', '.join(aside)}")
    return status


# --- replay and purge ----------------------------------------------------------------------------


def _in_use(row: dict[str, Any]) -> str:
    if not row["in_use"]:
        return "no"
    return f"pid {row['pid']}" if row["pid"] else "yes"


def _writable(
    args: argparse.Namespace, failures: _Failures, *, target: str | None, check_targets: bool
) -> tuple[list[_File], int]:
    """The files a writer may take (readable, not held by a live process, of ``target`` when
    ``check_targets``) and how many are held by live processes (one error line each)."""
    free: list[_File] = []
    busy = 0
    for file in _slot_files(args.path):
        if _read(file, failures, lambda spill: True) is None:
            continue
        if file.in_use:
            busy += 1
            who = f" (pid {file.pid})" if file.pid else ""
            _error(
                f"dead-letter spill file {file.path!r} is in use by another process{who}; "
                "stop that process first (list and stats work while it runs)"
            )
            continue
        free.append(file)
    if check_targets:
        recorded = sorted({file.target for file in free if file.target is not None})
        if target is not None:
            free = [file for file in free if file.target in (None, target)]
        elif len(recorded) > 1:
            raise UsageError(
                "the files record more than one backend target ("
                + ", ".join(recorded)
                + "); choose one with --target"
            )
    return free, busy


async def _replay_file(
    file: _File, args: argparse.Namespace, store: Any, quarantined: list[int]
) -> tuple[ReplaySummary | None, int, int, str | None]:
    buffer = _pinned(file.path)
    try:
        waiting = await buffer.open()
        if buffer.spill_path is None:
            return None, 0, 0, buffer.spill_error or f"cannot open {file.path!r}"
        unparked = await buffer.unpark() if args.include_parked else 0
        send, send_bulk = store_sender(store)
        summary = await buffer.replay(
            send, send_bulk=send_bulk, bulk_methods=bulk_methods_of(store), rate=args.rate, target=store
        )
        quarantined.append((await buffer.stats()).quarantined_total)
        return summary, waiting, unparked, None
    finally:
        await buffer.aclose()


def _pinned(path: str) -> DeadLetterBuffer:
    return DeadLetterBuffer(
        DeadLetterConfig(path=path),
        store_name="cli",
        registry=CollectorRegistry(auto_describe=True),
        slots=False,
    )


async def _replay(
    args: argparse.Namespace, files: Sequence[_File], failures: _Failures, quarantined: list[int]
) -> list[tuple[_File, ReplaySummary, int, int]]:
    factory = load_factory(args.store)
    store = await build_store(factory, args.store)
    done: list[tuple[_File, ReplaySummary, int, int]] = []
    try:
        for file in files:
            summary, waiting, unparked, error = await _replay_file(file, args, store, quarantined)
            if summary is None:
                failures.report(file, error or f"cannot open {file.path!r}")
                continue
            done.append((file, summary, waiting, unparked))
    finally:
        await close_store(store)
    return done


def _replay_command(args: argparse.Namespace) -> int:
    if args.rate is not None and args.rate <= 0:
        raise UsageError("--rate must be positive")
    failures = _Failures()
    files, busy = _writable(args, failures, target=args.target, check_targets=True)
    sys.path.insert(0, os.path.abspath(args.app_dir))
    quarantined: list[int] = []
    done = asyncio.run(_replay(args, files, failures, quarantined)) if files else []
    replayed = sum(summary.replayed for _, summary, _, _ in done)
    parked = sum(summary.parked for _, summary, _, _ in done)
    remaining = sum(summary.remaining for _, summary, _, _ in done)
    waiting = sum(count for _, _, count, _ in done)
    unparked = sum(count for _, _, _, count in done)
    stopped = any(summary.stopped_early for _, summary, _, _ in done)
    errors = [summary.last_error for _, summary, _, _ in done if summary.last_error]
    document = {
        "path": args.path,
        "waiting": waiting,
        "unparked": unparked,
        "replayed": replayed,
        "parked": parked,
        "remaining": remaining,
        "stopped_early": stopped,
        "last_error": errors[-1] if errors else None,
        "quarantined": sum(quarantined),
        "skipped_in_use": busy,
        "files": [
            {
                "slot": file.slot,
                "path": file.path,
                "target": file.target,
                "waiting": count,
                **summary.to_dict(),
            }
            for file, summary, count, _ in done
        ],
    }
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
    else:
        print(f"replayed {replayed} of {waiting + unparked} write(s) from {len(done)} file(s) of {args.path}")
        for file, summary, count, _ in done:
            print(f"  slot {file.slot} ({file.path}): {summary.replayed} of {count} replayed")
        if unparked:
            print(f"  {unparked} parked write(s) were moved back for this replay")
        print(f"  parked now:  {parked}")
        print(f"  remaining:   {remaining}")
        if quarantined and sum(quarantined):
            print(f"  quarantined: {sum(quarantined)} unreadable row(s) set aside (list --quarantined)")
        if busy:
            print(f"  skipped:     {busy} file(s) in use by live processes")
        if stopped:
            print("  stopped early: the store still fails; run replay again later")
        if errors:
            print(f"  last error:  {errors[-1]}")
    if failures.count:
        return 2
    return 1 if remaining or parked or busy else 0


async def _purge(
    files: Sequence[_File], failures: _Failures, *, pending: bool, parked: bool, quarantined: bool
) -> int:
    removed = 0
    for file in files:
        buffer = _pinned(file.path)
        try:
            await buffer.open()
            if buffer.spill_path is None:
                failures.report(file, buffer.spill_error or f"cannot open {file.path!r}")
                continue
            removed += await buffer.purge(pending=pending, parked=parked, quarantined=quarantined)
        finally:
            await buffer.aclose()
    return removed


def _purge_command(args: argparse.Namespace) -> int:
    if not (args.pending or args.parked or args.quarantined):
        raise UsageError("choose what to delete: --pending, --parked and/or --quarantined")
    if not args.yes:
        raise UsageError("purging deletes writes for good; add --yes to confirm")
    failures = _Failures()
    files, busy = _writable(args, failures, target=None, check_targets=False)
    removed = (
        asyncio.run(
            _purge(files, failures, pending=args.pending, parked=args.parked, quarantined=args.quarantined)
        )
        if files
        else 0
    )
    if args.json:
        print(
            json.dumps(
                {
                    "path": args.path,
                    "purged": removed,
                    "pending": args.pending,
                    "parked": args.parked,
                    "quarantined": args.quarantined,
                    "skipped_in_use": busy,
                }
            )
        )
    else:
        what = " and ".join(
            name
            for name, chosen in (
                ("pending", args.pending),
                ("parked", args.parked),
                ("quarantined", args.quarantined),
            )
            if chosen
        )
        print(f"purged {removed} {what} write(s) from {len(files)} file(s) of {args.path}")
    if failures.count:
        return 2
    return 1 if busy else 0


def _handle(command: Any, args: argparse.Namespace) -> int:
    try:
        return int(command(args))
    except UsageError as exc:
        _error(str(exc))
        return 2
    except SpillFileLockedError as exc:
        _error(f"{exc}; stop that process first (list and stats work while it runs)")
        return 1
    except SpillFileError as exc:
        _error(str(exc))
        return 2


def run_list(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq list``."""
    return _handle(_list, args)


def run_stats(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq stats``."""
    return _handle(_stats, args)


def run_replay(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq replay``."""
    return _handle(_replay_command, args)


def run_purge(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq purge``."""
    return _handle(_purge_command, args)


__all__ = ["register", "run_list", "run_purge", "run_replay", "run_stats"]
