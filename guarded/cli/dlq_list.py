"""``guarded dlq list`` and ``guarded dlq stats``: what waits, is parked or was quarantined in the
spill files of a path, read-only beside the live processes that own them."""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from ..deadletter import (
    DeadLetter,
    ParkedWrite,
    QuarantinedRow,
    SpillFile,
)
from ..deadletter.spill import SpillTotals
from .dlq_files import (
    Failures,
    SlotFile,
    as_table,
    error_text,
    file_dict,
    files_of,
    in_use_text,
    read_file,
    set_aside_files,
)
from .formatting import format_age, format_bytes
from .support import note

# --- list -----------------------------------------------------------------------------------------


def _pending_dict(entry: DeadLetter, file: SlotFile, now: float, show_payload: bool) -> dict[str, Any]:
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


def _parked_dict(write: ParkedWrite, file: SlotFile, now: float, show_payload: bool) -> dict[str, Any]:
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


def _quarantined_dict(row: QuarantinedRow, file: SlotFile, now: float, show_payload: bool) -> dict[str, Any]:
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


def list_command(args: argparse.Namespace) -> int:
    files = files_of(args.path)
    failures = Failures()
    now = time.time()
    rows: list[dict[str, Any]] = []
    total = 0
    unreadable: list[tuple[SlotFile, int]] = []
    for file in files:
        left = max(0, args.limit - len(rows))

        def read(spill: SpillFile, left: int = left) -> tuple[int, _Listed, int]:
            totals = spill.totals()
            if args.quarantined:
                return totals.quarantined, spill.quarantined(left, with_raw=args.show_payload), 0
            if args.parked:
                return totals.parked, spill.parked(left), totals.quarantined
            return totals.pending, spill.page(0, left), totals.quarantined

        found = read_file(file, failures, read)
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
            "total": None if failures.count else total,
            "unreadable": sum(count for _, count in unreadable),
            "files": [file_dict(file) for file in files],
            "entries": rows,
        }
        print(json.dumps(document, ensure_ascii=False))
        return status
    where = f"{args.path}" + (f" ({len(files)} files)" if len(files) > 1 else "")
    for file, bad in unreadable:
        note(f"{bad} row(s) of {file.path!r} could not be read and are not listed; see 'list --quarantined'")
    if not rows:
        if not failures.count:
            print(f"no {kind} {'rows' if args.quarantined else 'writes'} in {where}")
        return status
    if args.quarantined:
        table = as_table(
            ("SLOT", "ID", "FROM", "SEQ", "METHOD", "AGE", "REASON"),
            [
                (
                    row["slot"],
                    row["id"] if row["moved"] else "in place",
                    row["source"],
                    row["seq"],
                    row["method"],
                    "-" if row["age_seconds"] is None else format_age(row["age_seconds"]),
                    row["reason"],
                )
                for row in rows
            ],
            (4, 8, 7, 8, 22, 8, 70),
        )
    elif args.parked:
        table = as_table(
            ("SLOT", "SEQ", "METHOD", "AGE", "SIZE", "CALL", "REASON"),
            [
                (
                    row["slot"],
                    row["seq"],
                    row["method"],
                    format_age(row["age_seconds"]),
                    row["size"],
                    "kept" if row["call_kept"] else "lost",
                    row["reason"],
                )
                for row in rows
            ],
            (4, 8, 22, 8, 8, 5, 70),
        )
    else:
        table = as_table(
            ("SLOT", "SEQ", "METHOD", "KEY", "SCOPE", "AGE", "SIZE", "ERROR"),
            [
                (
                    row["slot"],
                    row["seq"],
                    row["method"],
                    row["key"],
                    row["scope"],
                    format_age(row["age_seconds"]),
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
    if failures.count:
        return status
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


def stats_command(args: argparse.Namespace) -> int:
    files = files_of(args.path)
    failures = Failures()
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
        found = read_file(file, failures, lambda spill: (spill.totals(), spill.by_method()))
        if found is None:
            per_file.append(file_dict(file))
            continue
        file_totals, methods = found
        document = {**file_dict(file), **_stats_dict(file.path, file_totals, now)}
        per_file.append(document)
        for name in totals:
            totals[name] += document[name]
        if file_totals.pending:
            oldest = max(oldest, document["oldest_age_seconds"])
        for method, pending, size in methods:
            counts = by_method.setdefault(method, {"pending": 0, "bytes": 0})
            counts["pending"] += pending
            counts["bytes"] += size
    aside = set_aside_files(args.path)
    known = not failures.count
    summary: dict[str, Any] = {
        "path": args.path,
        **{name: value if known else None for name, value in totals.items()},
        "oldest_age_seconds": oldest if known else None,
        "by_method": dict(sorted(by_method.items())) if known else None,
        "files": per_file,
        "set_aside": aside,
    }
    status = 2 if failures.count else 0
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
        return status
    if not known:
        _print_unknown_totals(args.path, per_file, aside)
        return status
    print(f"dead-letter spill files of {args.path} (in {os.path.dirname(os.path.abspath(args.path))})")
    print(f"  pending:     {summary['pending']} ({format_bytes(summary['pending_bytes'])})")
    print(f"  parked:      {summary['parked']} ({format_bytes(summary['parked_bytes'])})")
    if summary["quarantined"]:
        print(f"  quarantined: {summary['quarantined']} unreadable row(s), not replayed (list --quarantined)")
    print(f"  oldest:      {format_age(oldest) if summary['pending'] else '-'}")
    print(f"  file size:   {format_bytes(summary['file_bytes'])}")
    print()
    print(_files_table(per_file))
    if by_method:
        print()
        print(
            as_table(
                ("METHOD", "PENDING", "BYTES"),
                [
                    (method, counts["pending"], counts["bytes"])
                    for method, counts in summary["by_method"].items()
                ],
                (24, 8, 12),
            )
        )
    _print_set_aside(aside)
    return status


def _files_table(per_file: list[dict[str, Any]]) -> str:
    return as_table(
        ("SLOT", "FILE", "IN USE", "PENDING", "PARKED", "TARGET"),
        [
            (
                row["slot"],
                os.path.basename(row["path"]),
                in_use_text(row),
                "unreadable" if row["error"] else row["pending"],
                "-" if row["error"] else row["parked"],
                "-" if row["error"] else row["target"] or "(not recorded)",
            )
            for row in per_file
        ],
        (4, 32, 10, 10, 8, 40),
    )


def _print_set_aside(aside: list[str]) -> None:
    if aside:
        print()
        print(f"damaged files set aside for inspection: {', '.join(aside)}")


def _print_unknown_totals(path: str, per_file: list[dict[str, Any]], aside: list[str]) -> None:
    """``stats`` when a file could not be read: no total (it would leave that file out), only the
    files that were read, beside the unreadable ones."""
    if any(not row["error"] for row in per_file):
        print(f"dead-letter spill files of {path}: totals unknown, a file could not be read")
        print(_files_table(per_file))
    _print_set_aside(aside)
