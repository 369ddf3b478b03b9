"""The spill files of a path as ``guarded dlq`` sees them: finding the slot files, reading one
read-only, reporting the ones that cannot be served, and taking the ones a writer may use."""

from __future__ import annotations

import argparse
import contextlib
import glob
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from ..config import DeadLetterConfig
from ..deadletter import (
    DeadLetterBuffer,
    SpillFile,
    SpillFileError,
)
from ..deadletter.slots import slot_files
from ..deadletter.spill import holder_pid, is_locked
from .formatting import Column, render_table, terminal_width
from .support import UsageError, error_line

T = TypeVar("T")


def error(message: str, hint: str | None = None) -> None:
    print(error_line(message, hint), file=sys.stderr, flush=True)


UNRECORDED_ERROR = "backend error (type not recorded)"
"""What ``list`` shows for a write held with the error ``fallback``: the guard recorded the
outcome a read would have had, not the error. A write held that way failed with an error that
was neither a timeout, an open circuit nor bad data, and its type was not kept."""


def error_text(stored: str | None) -> str | None:
    """The error of a held write as ``list`` shows it (see :data:`UNRECORDED_ERROR`)."""
    if stored == "fallback":
        return UNRECORDED_ERROR
    return stored


def as_table(headers: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int]) -> str:
    """The rows under their headers; on a terminal long cells are cut to ``widths`` and every
    column shrinks so the table fits its width, elsewhere every value is printed whole."""
    columns = [Column(header, size) for header, size in zip(headers, widths, strict=True)]
    return render_table(columns, rows, width=terminal_width())


# --- the files of a path ---------------------------------------------------------------------------


@dataclass
class SlotFile:
    """One slot file of the path, as a command sees it."""

    slot: int
    path: str
    error: str | None = None
    target: str | None = None
    in_use: bool = False
    pid: int | None = None
    waiting: int = 0
    """Writes waiting in the file when the command looked (for progress)."""


class Failures:
    """Files a command could not serve: one error line each, exit status 2 at the end."""

    def __init__(self) -> None:
        self.files: list[SlotFile] = []

    @property
    def count(self) -> int:
        return len(self.files)

    def report(self, file: SlotFile, message: str) -> None:
        self.files.append(file)
        file.error = message
        error(message)


def files_of(base: str) -> list[SlotFile]:
    """The slot files of ``base``, a name in a slot file's place that is not a file included (it
    is reported as unreadable, never passed over)."""
    if os.path.isdir(base):
        raise UsageError(
            f"{base!r} is a directory",
            "give the configured spill path (a file name), e.g. DIR/NAME.sqlite",
        )
    found = [SlotFile(slot, path) for slot, path in slot_files(base, files_only=False)]
    if not found:
        raise UsageError(
            f"no dead-letter spill file at {base!r}",
            "give the path the guard was configured with ({name} replaced); 'guarded dlq stats' works too",
        )
    for file in found:
        file.in_use = is_locked(file.path)
        file.pid = holder_pid(file.path) if file.in_use else None
    return found


def read_file(file: SlotFile, failures: Failures, read: Callable[[SpillFile], T]) -> T | None:
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


def file_dict(file: SlotFile) -> dict[str, Any]:
    return {
        "slot": file.slot,
        "path": file.path,
        "target": file.target,
        "in_use": file.in_use,
        "pid": file.pid,
        "error": file.error,
    }


def unknown_totals(failures: Failures) -> str:
    """What ``replay`` and ``purge`` print in place of their totals when files could not be read."""
    return f"totals unknown, {failures.count} file(s) could not be read"


def set_aside_files(base: str) -> list[str]:
    """Damaged files of ``base``'s slots that were renamed aside for inspection."""
    names = glob.glob(glob.escape(base) + "*.corrupt-*")
    return sorted(name for name in names if not name.endswith(("-wal", "-shm")))


def in_use_text(row: dict[str, Any]) -> str:
    if not row["in_use"]:
        return "no"
    return f"pid {row['pid']}" if row["pid"] else "yes"


def writable_files(
    args: argparse.Namespace, failures: Failures, *, target: str | None, check_targets: bool
) -> tuple[list[SlotFile], int]:
    """The files a writer may take (readable, not held by a live process, of ``target`` when
    ``check_targets``) and how many are held by live processes (one error line each). Each
    file's ``waiting`` is its count of pending writes (plus parked ones with ``--include-parked``)."""
    free: list[SlotFile] = []
    busy = 0
    include_parked = bool(getattr(args, "include_parked", False))

    def waiting(spill: SpillFile) -> int:
        totals = spill.totals()
        return totals.pending + (totals.parked if include_parked else 0)

    for file in files_of(args.path):
        found = read_file(file, failures, waiting)
        if found is None:
            continue
        file.waiting = found
        if file.in_use:
            busy += 1
            who = f" (pid {file.pid})" if file.pid else ""
            error(
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


class _NotRecovered(logging.Filter):
    """Drops the buffer's "holds N waiting write(s) from an earlier run" warning: the command
    opens the file because it holds writes, and reports them itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "event", None) != "deadletter_recovered"


@contextlib.contextmanager
def quiet_recovery() -> Iterator[None]:
    logger = logging.getLogger("guarded.deadletter")
    quiet = _NotRecovered()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def pinned_buffer(path: str) -> DeadLetterBuffer:
    return DeadLetterBuffer(
        DeadLetterConfig(path=path),
        store_name="cli",
        registry=CollectorRegistry(auto_describe=True),
        slots=False,
    )
