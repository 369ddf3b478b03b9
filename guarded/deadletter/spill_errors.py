"""What a dead-letter spill file raises, and how its failures are told apart (damaged, full)."""

from __future__ import annotations

import errno
import sqlite3

from ..errors import GuardedError

_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_FULL_CODES = frozenset({sqlite3.SQLITE_FULL})
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class SpillFileError(GuardedError):
    """The spill file cannot be used: not a dead-letter file, a newer layout, unreadable."""


class SpillFileLockedError(SpillFileError):
    """Another live process has the spill file open for writing."""


class SpillFileCorruptError(SpillFileError):
    """The file is not an SQLite database, or its database is damaged (malformed)."""


class SpillFileVersionError(SpillFileError):
    """The file was written by a newer guarded (a newer layout); it is left untouched."""


class SpillFileForeignError(SpillFileError):
    """The file is an SQLite database of something else, not a dead-letter spill file."""


class SpillFileTargetError(SpillFileError):
    """The file holds writes for another backend target; it is never claimed nor replayed here."""


def _sqlite_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_corruption(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says the database file is damaged or not a database."""
    for found in (exc, exc.__cause__):
        if found is None:
            continue
        if isinstance(found, SpillFileCorruptError) or _sqlite_code(found) in _CORRUPT_CODES:
            return True
    return False


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is ``SQLITE_FULL`` or an ``ENOSPC``/``EDQUOT`` OS error."""
    for found in (exc, exc.__cause__):
        if found is None:
            continue
        if _sqlite_code(found) in _FULL_CODES:
            return True
        if isinstance(found, OSError) and found.errno in _FULL_ERRNOS:
            return True
    return False


class SpillCapError(SpillFileError):
    """A write transaction would take the file past its byte cap (``max_disk_bytes``): it is rolled
    back, nothing in the file is dropped to make room. The file itself is fine."""


class SourceReadError(SpillFileError):
    """Reading the other file of :meth:`SpillFile.take_over` failed (that file's fault, not ours)."""


def wrap_error(exc: sqlite3.Error, path: str, doing: str) -> SpillFileError:
    """``exc`` of opening ``path`` as the matching :class:`SpillFileError` (chained by the caller)."""
    if _sqlite_code(exc) in _CORRUPT_CODES:
        return SpillFileCorruptError(f"dead-letter spill file {path!r} is damaged ({doing}): {exc}")
    return SpillFileError(f"cannot open dead-letter spill file {path!r} ({doing}): {exc}")


__all__ = [
    "SourceReadError",
    "SpillCapError",
    "SpillFileCorruptError",
    "SpillFileError",
    "SpillFileForeignError",
    "SpillFileLockedError",
    "SpillFileTargetError",
    "SpillFileVersionError",
    "is_corruption",
    "is_disk_full",
    "wrap_error",
]
