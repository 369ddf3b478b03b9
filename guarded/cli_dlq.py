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

``replay`` shows progress (counts and rate) on stderr while it sends, and Ctrl-C says how many
writes were replayed and how many still wait. Exit codes follow :mod:`guarded.cli_support`: 0
success, 1 writes left behind (parked, remaining, or files held by live processes), 2 user error
or an unreadable file, 3 the store's backend is unreachable, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import glob
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry

from .bulk_forms import bulk_methods_of
from .cli_check import build_store, close_store, load_factory
from .cli_support import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    Column,
    CommandError,
    Progress,
    UnreachableError,
    UsageError,
    console,
    error_line,
    format_age,
    format_bytes,
    interrupted,
    note,
    positive_number,
    render_table,
    report,
    whole_number,
)
from .config import DeadLetterConfig
from .deadletter import (
    DeadLetter,
    DeadLetterBuffer,
    ParkedWrite,
    QuarantinedRow,
    ReplayResult,
    ReplaySummary,
    SpillFile,
    SpillFileError,
    SpillFileLockedError,
    store_sender,
)
from .deadletter.replay import Send, SendBulk
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

    def add(name: str, help_text: str, description: str | None = None) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=description or help_text[0].upper() + help_text[1:] + ".",
            epilog="See docs/cli.md for the exit codes every guarded command shares.",
        )
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
    listing.add_argument(
        "--limit", type=whole_number(0), default=50, metavar="N", help="at most N rows (default 50)"
    )
    listing.add_argument(
        "--show-payload", action="store_true", help="include each write's encoded call (payload contents)"
    )
    listing.set_defaults(handler=run_list)

    add("stats", "counts, sizes and the age of the oldest waiting write, per file").set_defaults(
        handler=run_stats
    )

    replay = add(
        "replay",
        "replay waiting writes into the store a factory builds",
        "Replay the waiting writes of the spill files into the store a factory builds, in order per key "
        "and stream, paced to --rate. Shows progress (writes replayed of those waiting, and the rate) on "
        "stderr; Ctrl-C stops and says how many were replayed and how many still wait (nothing is lost). "
        "Exit 0 when every write was replayed, 1 when some are left (parked, failing, or in files held "
        "by live processes), 3 when the store's backend cannot be reached.",
    )
    replay.add_argument(
        "--store",
        required=True,
        metavar="MODULE:CALLABLE",
        help="factory returning the store (sync or async), e.g. myapp.stores:create_store",
    )
    replay.add_argument(
        "--rate",
        type=positive_number,
        default=None,
        metavar="R",
        help="writes per second at most (default: the dead-letter replay_rate, 500)",
    )
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

    purge = add(
        "purge",
        "delete waiting and/or parked writes (data loss: needs --yes)",
        "Delete the waiting, parked and/or quarantined writes of the spill files for good. Needs --yes; "
        "skips files held by live processes (exit 1).",
    )
    purge.add_argument("--pending", action="store_true", help="delete the waiting writes")
    purge.add_argument("--parked", action="store_true", help="delete the parked writes")
    purge.add_argument(
        "--quarantined", action="store_true", help="delete the rows moved to the quarantine tables"
    )
    purge.add_argument("--yes", action="store_true", help="confirm the deletion")
    purge.set_defaults(handler=run_purge)


def _error(message: str, hint: str | None = None) -> None:
    print(error_line(message, hint), file=sys.stderr, flush=True)


_age = format_age
_size = format_bytes

UNRECORDED_ERROR = "backend error (type not recorded)"
"""What ``list`` shows for a write held with the error ``fallback``: the guard recorded the
outcome a read would have had, not the error. A write held that way failed with an error that
was neither a timeout, an open circuit nor bad data, and its type was not kept."""


def error_text(stored: str | None) -> str | None:
    """The error of a held write as ``list`` shows it (see :data:`UNRECORDED_ERROR`)."""
    if stored == "fallback":
        return UNRECORDED_ERROR
    return stored


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int]) -> str:
    """The rows under their headers; long cells are cut to ``widths`` (and, on a terminal, every
    column shrinks so the table fits its width)."""
    width = console().width if sys.stdout.isatty() else None
    columns = [Column(header, size) for header, size in zip(headers, widths, strict=True)]
    return render_table(columns, rows, width=width)


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
    waiting: int = 0
    """Writes waiting in the file when the command looked (for progress)."""


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
            raise UsageError(
                f"{base!r} is a directory",
                "give the configured spill path (a file name), e.g. DIR/NAME.sqlite",
            )
        raise UsageError(
            f"no dead-letter spill file at {base!r}",
            "give the path the guard was configured with ({name} replaced); 'guarded dlq stats' works too",
        )
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
        "error": error_text(entry.error),
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
    for file, bad in unreadable:
        note(f"{bad} row(s) of {file.path!r} could not be read and are not listed; see 'list --quarantined'")
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
        for method, pending, size in methods:
            counts = by_method.setdefault(method, {"pending": 0, "bytes": 0})
            counts["pending"] += pending
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
    ``check_targets``) and how many are held by live processes (one error line each). Each
    file's ``waiting`` is its count of pending writes (plus parked ones with ``--include-parked``)."""
    free: list[_File] = []
    busy = 0
    include_parked = bool(getattr(args, "include_parked", False))

    def waiting(spill: SpillFile) -> int:
        totals = spill.totals()
        return totals.pending + (totals.parked if include_parked else 0)

    for file in _slot_files(args.path):
        found = _read(file, failures, waiting)
        if found is None:
            continue
        file.waiting = found
        if file.in_use:
            busy += 1
            who = f" (pid {file.pid})" if file.pid else ""
            _error(
                f"dead-letter spill file {file.path!r} is in use by another process{who}",
                "stop that process first (list and stats work while it runs)",
            )
            continue
        free.append(file)
    if check_targets:
        recorded = sorted({file.target for file in free if file.target is not None})
        if target is not None:
            free = [file for file in free if file.target in (None, target)]
        elif len(recorded) > 1:
            raise UsageError(
                "the files record more than one backend target: " + ", ".join(recorded),
                "choose one with --target",
            )
    return free, busy


def _counted(store: Any, state: _Replay) -> tuple[Send, SendBulk | None]:
    """The store's senders, advancing the progress by each write the store took and keeping the
    last failure not followed by a success (to tell a backend that is down)."""
    send, send_bulk = store_sender(store)
    progress = state.progress

    async def counted(method: str, call_args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        try:
            result = await send(method, call_args, kwargs)
        except Exception as exc:
            state.failure = exc
            raise
        if result is ReplayResult.OK:
            state.failure = None
            progress.advance(1, detail=method)
        return result

    if send_bulk is None:
        return counted, None
    bulk = send_bulk

    async def counted_bulk(method: str, calls: list[Any]) -> ReplayResult:
        try:
            result = await bulk(method, calls)
        except Exception as exc:
            state.failure = exc
            raise
        if result is ReplayResult.OK:
            state.failure = None
            progress.advance(len(calls), detail=method)
        return result

    return counted, counted_bulk


async def _replay_file(
    file: _File, args: argparse.Namespace, store: Any, state: _Replay
) -> tuple[ReplaySummary | None, int, int, str | None]:
    buffer = _pinned(file.path)
    try:
        waiting = await buffer.open()
        if buffer.spill_path is None:
            return None, 0, 0, buffer.spill_error or f"cannot open {file.path!r}"
        unparked = await buffer.unpark() if args.include_parked else 0
        send, send_bulk = _counted(store, state)
        summary = await buffer.replay(
            send, send_bulk=send_bulk, bulk_methods=bulk_methods_of(store), rate=args.rate, target=store
        )
        state.quarantined.append((await buffer.stats()).quarantined_total)
        return summary, waiting, unparked, None
    finally:
        await buffer.aclose()


class _NotRecovered(logging.Filter):
    """Drops the buffer's "holds N waiting write(s) from an earlier run" warning: the command
    opens the file because it holds writes, and reports them itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "event", None) != "deadletter_recovered"


@contextlib.contextmanager
def _quiet_recovery() -> Iterator[None]:
    logger = logging.getLogger("guarded.deadletter")
    quiet = _NotRecovered()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _pinned(path: str) -> DeadLetterBuffer:
    return DeadLetterBuffer(
        DeadLetterConfig(path=path),
        store_name="cli",
        registry=CollectorRegistry(auto_describe=True),
        slots=False,
    )


@dataclass
class _Replay:
    """What a replay has done so far (read after Ctrl-C too)."""

    progress: Progress
    target: str | None = None
    done: list[tuple[_File, ReplaySummary, int, int]] = field(default_factory=list)
    quarantined: list[int] = field(default_factory=list)
    failure: BaseException | None = None
    """The last send that failed, unless a send succeeded since."""

    @property
    def backend_down(self) -> bool:
        """The pass said so, or the last sends failed to reach the backend."""
        from guarded.backends.postgres.cli_target import is_unreachable

        if any(summary.backend_down for _, summary, _, _ in self.done):
            return True
        return self.failure is not None and is_unreachable(self.failure)


async def _replay(
    args: argparse.Namespace, files: Sequence[_File], failures: _Failures, state: _Replay
) -> None:
    factory = load_factory(args.store)
    store = await build_store(factory, args.store)
    target = getattr(store, "target_identity", None)
    state.target = target if isinstance(target, str) else None
    state.progress.start()
    try:
        for file in files:
            summary, waiting, unparked, error = await _replay_file(file, args, store, state)
            if summary is None:
                failures.report(file, error or f"cannot open {file.path!r}")
                continue
            state.done.append((file, summary, waiting, unparked))
            if state.backend_down:
                break  # the other files wait for the backend too
    finally:
        state.progress.close()
        await close_store(store)


def _still_waiting(files: Sequence[_File]) -> int:
    """Writes waiting in ``files`` now (read-only; unreadable files count as none)."""
    left = 0
    for file in files:
        with contextlib.suppress(Exception):
            reader = SpillFile.open_read_only(file.path)
            try:
                left += reader.totals().pending
            finally:
                reader.close()
    return left


def _replay_command(args: argparse.Namespace) -> int:
    failures = _Failures()
    files, busy = _writable(args, failures, target=args.target, check_targets=True)
    sys.path.insert(0, os.path.abspath(args.app_dir))
    total = sum(file.waiting for file in files)
    state = _Replay(Progress("replay", total=total, unit="writes"))
    if files:
        try:
            with _quiet_recovery():
                asyncio.run(_replay(args, files, failures, state))
        except KeyboardInterrupt:
            left = _still_waiting(files)
            raise interrupted(
                f"replayed {state.progress.summary()} before Ctrl-C; {left:,} write(s) still wait in "
                f"{args.path} (nothing was lost); run 'guarded dlq replay' again to continue"
            ) from None
    done = state.done
    quarantined = state.quarantined
    visited = {file.path for file, _, _, _ in done}
    unvisited = sum(file.waiting for file in files if file.path not in visited)
    replayed = sum(summary.replayed for _, summary, _, _ in done)
    parked = sum(summary.parked for _, summary, _, _ in done)
    remaining = sum(summary.remaining for _, summary, _, _ in done) + unvisited
    down = state.backend_down
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
        "backend_down": down,
        "target": state.target,
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
    if down:
        where = f" ({state.target})" if state.target else ""
        why = f": {errors[-1]}" if errors else ""
        return report(
            UnreachableError(
                f"the store's backend{where} is not answering; the replay stopped{why}; {remaining:,} "
                f"write(s) still wait in {args.path} (nothing was lost)",
                "bring the backend back, then run 'guarded dlq replay' again",
                target=state.target,
            )
        )
    if failures.count:
        return EXIT_USAGE
    return EXIT_PROBLEM if remaining or parked or busy else EXIT_OK


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
        raise UsageError("nothing to purge was chosen", "add --pending, --parked and/or --quarantined")
    if not args.yes:
        raise UsageError("purging deletes writes for good", "add --yes to confirm")
    failures = _Failures()
    files, busy = _writable(args, failures, target=None, check_targets=False)
    with _quiet_recovery():
        removed = (
            asyncio.run(
                _purge(
                    files, failures, pending=args.pending, parked=args.parked, quarantined=args.quarantined
                )
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
        return EXIT_USAGE
    return EXIT_PROBLEM if busy else EXIT_OK


def _handle(command: Any, args: argparse.Namespace) -> int:
    try:
        return int(command(args))
    except CommandError as exc:
        return report(exc)
    except SpillFileLockedError as exc:
        _error(str(exc), "stop that process first (list and stats work while it runs)")
        return EXIT_PROBLEM
    except SpillFileError as exc:
        _error(str(exc), "check --path: it must be a guarded dead-letter spill file")
        return EXIT_USAGE


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
