"""``guarded dlq list|stats|replay|purge``: inspect and operate a dead-letter spill file.

``list`` and ``stats`` open the file read-only and work beside the live process that owns it.
``replay`` and ``purge`` need the file's lock: they refuse (exit 1) while a live process holds
it. Payload contents are never printed unless ``list --show-payload`` asks for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from .cli_check import UsageError, build_store, close_store, load_factory
from .config import DeadLetterConfig
from .deadletter import (
    DeadLetter,
    DeadLetterBuffer,
    ParkedWrite,
    ReplaySummary,
    SpillFile,
    SpillFileError,
    SpillFileLockedError,
    store_sender,
)
from .deadletter.spill import SpillTotals

if TYPE_CHECKING:
    from .cli import Subparsers

PROG = "guarded dlq"


def register(subparsers: Subparsers) -> None:
    """Add the ``dlq`` subcommand and its own subcommands."""
    parser = subparsers.add_parser(
        "dlq",
        help="inspect, replay or purge a dead-letter spill file",
        description=(
            "Inspect and operate the dead-letter spill file of a guarded store. list and stats read the "
            "file while its process runs; replay and purge need the process stopped."
        ),
    )
    commands = parser.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--path", required=True, metavar="FILE", help="the SQLite spill file")
        sub.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        return sub

    listing = add("list", "list waiting (or parked) writes, oldest first, without payloads")
    listing.add_argument("--parked", action="store_true", help="list parked writes instead")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most N rows (default 50)")
    listing.add_argument(
        "--show-payload", action="store_true", help="include each write's encoded call (payload contents)"
    )
    listing.set_defaults(handler=run_list)

    add("stats", "counts, sizes and the age of the oldest waiting write").set_defaults(handler=run_stats)

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
        "--app-dir",
        default=".",
        metavar="DIR",
        help="directory put first on sys.path before importing the factory (default: the current one)",
    )
    replay.set_defaults(handler=run_replay)

    purge = add("purge", "delete waiting and/or parked writes (data loss: needs --yes)")
    purge.add_argument("--pending", action="store_true", help="delete the waiting writes")
    purge.add_argument("--parked", action="store_true", help="delete the parked writes")
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


def _open_read_only(path: str) -> SpillFile:
    try:
        return SpillFile.open_read_only(path)
    except SpillFileError as exc:
        raise UsageError(str(exc)) from exc


def _pending_dict(entry: DeadLetter, now: float, show_payload: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
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


def _parked_dict(write: ParkedWrite, now: float, show_payload: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
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


def _list(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise UsageError("--limit must not be negative")
    spill = _open_read_only(args.path)
    try:
        now = time.time()
        totals = spill.totals()
        if args.parked:
            parked = spill.parked(args.limit)
            rows = [_parked_dict(write, now, args.show_payload) for write in parked]
            total = totals.parked
        else:
            pending = spill.page(0, args.limit)
            rows = [_pending_dict(entry, now, args.show_payload) for entry in pending]
            total = totals.pending
    finally:
        spill.close()
    kind = "parked" if args.parked else "pending"
    if args.json:
        print(
            json.dumps({"path": args.path, "kind": kind, "total": total, "entries": rows}, ensure_ascii=False)
        )
        return 0
    if not rows:
        print(f"no {kind} writes in {args.path}")
        return 0
    if args.parked:
        table = _table(
            ("SEQ", "METHOD", "AGE", "SIZE", "CALL", "REASON"),
            [
                (
                    row["seq"],
                    row["method"],
                    _age(row["age_seconds"]),
                    row["size"],
                    "kept" if row["call_kept"] else "lost",
                    row["reason"],
                )
                for row in rows
            ],
            (8, 22, 8, 8, 5, 70),
        )
    else:
        table = _table(
            ("SEQ", "METHOD", "KEY", "SCOPE", "AGE", "SIZE", "ERROR"),
            [
                (
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
            (8, 22, 30, 24, 8, 8, 40),
        )
    print(table)
    if args.show_payload:
        print()
        for row in rows:
            print(f"{row['seq']}: {json.dumps(row['call'], ensure_ascii=False)}")
    shown = len(rows)
    print(f"\n{shown} of {total} {kind} write(s)" + (" (use --limit to see more)" if shown < total else ""))
    return 0


def _stats_dict(path: str, totals: SpillTotals, now: float) -> dict[str, Any]:
    return {
        "path": path,
        "pending": totals.pending,
        "pending_bytes": totals.pending_bytes,
        "parked": totals.parked,
        "parked_bytes": totals.parked_bytes,
        "oldest_age_seconds": 0.0 if totals.oldest is None else round(max(0.0, now - totals.oldest[1]), 3),
        "file_bytes": sum(os.path.getsize(name) for name in (path, path + "-wal") if os.path.exists(name)),
    }


def _stats(args: argparse.Namespace) -> int:
    spill = _open_read_only(args.path)
    try:
        totals = spill.totals()
        methods = spill.by_method()
    finally:
        spill.close()
    document = _stats_dict(args.path, totals, time.time())
    document["by_method"] = {method: {"pending": count, "bytes": size} for method, count, size in methods}
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
        return 0
    print(f"dead-letter spill file {args.path}")
    print(f"  pending:     {document['pending']} ({_size(document['pending_bytes'])})")
    print(f"  parked:      {document['parked']} ({_size(document['parked_bytes'])})")
    print(f"  oldest:      {_age(document['oldest_age_seconds']) if document['pending'] else '-'}")
    print(f"  file size:   {_size(document['file_bytes'])}")
    if methods:
        print()
        print(
            _table(
                ("METHOD", "PENDING", "BYTES"),
                [(method, count, size) for method, count, size in methods],
                (24, 8, 12),
            )
        )
    return 0


async def _replay(args: argparse.Namespace) -> tuple[ReplaySummary, int, int]:
    factory = load_factory(args.store)
    buffer = DeadLetterBuffer(
        DeadLetterConfig(path=args.path), store_name="cli", registry=CollectorRegistry(auto_describe=True)
    )
    try:
        waiting = await buffer.open()
        unparked = await buffer.unpark() if args.include_parked else 0
        store = await build_store(factory, args.store)
        try:
            send, send_bulk = store_sender(store)
            summary = await buffer.replay(send, send_bulk=send_bulk, rate=args.rate)
        finally:
            await close_store(store)
        return summary, waiting, unparked
    finally:
        await buffer.aclose()


def _replay_command(args: argparse.Namespace) -> int:
    if args.rate is not None and args.rate <= 0:
        raise UsageError("--rate must be positive")
    if not os.path.isfile(args.path):
        raise UsageError(f"no dead-letter spill file at {args.path!r}")
    _open_read_only(args.path).close()
    sys.path.insert(0, os.path.abspath(args.app_dir))
    summary, waiting, unparked = asyncio.run(_replay(args))
    document = {"path": args.path, "waiting": waiting, "unparked": unparked, **summary.to_dict()}
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
    else:
        print(f"replayed {summary.replayed} of {waiting + unparked} write(s) from {args.path}")
        if unparked:
            print(f"  {unparked} parked write(s) were moved back for this replay")
        print(f"  parked now:  {summary.parked}")
        print(f"  remaining:   {summary.remaining}")
        if summary.stopped_early:
            print("  stopped early: the store still fails; run replay again later")
        if summary.last_error:
            print(f"  last error:  {summary.last_error}")
    return 1 if summary.remaining or summary.parked else 0


async def _purge(path: str, *, pending: bool, parked: bool) -> int:
    buffer = DeadLetterBuffer(
        DeadLetterConfig(path=path), store_name="cli", registry=CollectorRegistry(auto_describe=True)
    )
    try:
        await buffer.open()
        return await buffer.purge(pending=pending, parked=parked)
    finally:
        await buffer.aclose()


def _purge_command(args: argparse.Namespace) -> int:
    if not (args.pending or args.parked):
        raise UsageError("choose what to delete: --pending and/or --parked")
    if not args.yes:
        raise UsageError("purging deletes writes for good; add --yes to confirm")
    if not os.path.isfile(args.path):
        raise UsageError(f"no dead-letter spill file at {args.path!r}")
    _open_read_only(args.path).close()
    removed = asyncio.run(_purge(args.path, pending=args.pending, parked=args.parked))
    if args.json:
        print(
            json.dumps({"path": args.path, "purged": removed, "pending": args.pending, "parked": args.parked})
        )
    else:
        what = " and ".join(
            name for name, chosen in (("pending", args.pending), ("parked", args.parked)) if chosen
        )
        print(f"purged {removed} {what} write(s) from {args.path}")
    return 0


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
