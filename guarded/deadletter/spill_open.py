"""Opening a dead-letter spill file: creating its schema, migrating an older layout forward,
checking it is ours (and of our target), and counting its generation (see :mod:`.spill`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import quote

from .spill_errors import (
    SpillFileCorruptError,
    SpillFileError,
    SpillFileForeignError,
    SpillFileTargetError,
    SpillFileVersionError,
    wrap_error,
)
from .spill_format import APPLICATION_ID, QUARANTINE_TABLE, SCHEMA, SCHEMA_VERSION
from .spill_lock import acquire_lock, is_locked, remove_files

if TYPE_CHECKING:
    from .spill import SpillFile


def prepare(
    cls: type[SpillFile],
    db: sqlite3.Connection,
    path: str,
    lock_fd: int,
    *,
    synchronous: str,
    target: str | None,
    check_target: bool,
    min_generation: int,
) -> SpillFile:
    db.execute("PRAGMA busy_timeout = 5000")
    created = not is_ours(db, path)
    recorded = None if created else meta(db, "target")
    retarget = legacy = False
    if check_target and not created and recorded != target:
        held = _count(db)
        if recorded is not None and held:
            raise SpillFileTargetError(
                f"dead-letter spill file {path!r} holds {held} write(s) for another target "
                f"({recorded}); it is never replayed into {target or 'an unknown target'}"
            )
        retarget = target is not None
        legacy = recorded is None and held > 0
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {synchronous}")
    db.execute("BEGIN IMMEDIATE")
    try:
        if created:
            for statement in (*SCHEMA, QUARANTINE_TABLE):
                db.execute(statement)
            db.execute(
                "INSERT INTO meta (name, value) VALUES ('schema_version', ?), ('generation', '0')",
                (str(SCHEMA_VERSION),),
            )
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            retarget = target is not None
        else:
            _migrate(db)
        if retarget:
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('target', ?)", (target,))
            recorded = target
        generation = max(meta_int(db, "generation") + 1, min_generation)
        db.execute("UPDATE meta SET value = ? WHERE name = 'generation'", (str(generation),))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    spill = cls(db, path, lock_fd=lock_fd, generation=generation, target=recorded)
    if legacy:
        spill.legacy_entries = spill.counts.pending + spill.counts.parked
    spill.check_parked()
    return spill


def _count(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT (SELECT count(*) FROM pending) + (SELECT count(*) FROM parked)").fetchone()
    return int(row[0])


def _migrate(db: sqlite3.Connection) -> None:
    """Bring an older layout forward (in the caller's transaction)."""
    version = meta_int(db, "schema_version")
    # 1 -> 2: a file may record its target in meta; none recorded means unknown.
    if version < 3:
        # 2 -> 3: unreadable rows are moved to a quarantine table.
        db.execute(QUARANTINE_TABLE)
    if version < SCHEMA_VERSION:
        db.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),))


@contextlib.contextmanager
def _closed_on_failure(db: sqlite3.Connection, path: str, doing: str) -> Iterator[None]:
    """Close ``db`` when the block fails; a SQLite error becomes the matching :class:`SpillFileError`."""
    try:
        yield
    except sqlite3.Error as exc:
        db.close()
        raise wrap_error(exc, path, doing) from exc
    except BaseException:
        db.close()
        raise


def open_writable(
    cls: type[SpillFile],
    path: str,
    *,
    synchronous: str,
    lock_fd: int | None,
    target: str | None,
    check_target: bool,
    min_generation: int,
) -> SpillFile:
    """:meth:`SpillFile.open <.spill.SpillFile.open>`: the lock taken here is released when this
    raises, a ``lock_fd`` given stays the caller's."""
    own_lock = lock_fd is None
    if lock_fd is None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        lock_fd = acquire_lock(path)
    try:
        if not os.path.exists(path):
            remove_files(path)  # a WAL without its database must never meet a new one
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        with _closed_on_failure(db, path, "opening"):
            return prepare(
                cls,
                db,
                path,
                lock_fd,
                synchronous=synchronous,
                target=target,
                check_target=check_target,
                min_generation=min_generation,
            )
    except BaseException:
        if own_lock:
            os.close(lock_fd)
        raise


def open_read_only(cls: type[SpillFile], path: str) -> SpillFile:
    """Open an existing file for reading only, without the lock (works beside a live writer).

    Reading creates and changes nothing beside the file: a file no live process holds is read as
    immutable (SQLite creates no ``-wal`` or ``-shm``), and one a crashed writer left with its WAL
    is read from a private copy of both (the WAL's writes counted, the originals untouched). Only
    beside a live writer does it read through that writer's WAL and shared memory."""
    if not os.path.isfile(path):
        if os.path.exists(path):
            raise SpillFileError(f"cannot read dead-letter spill file {path!r}: it is not a regular file")
        raise SpillFileError(f"no dead-letter spill file at {path!r}")
    try:
        db = _connect_read_only(path)
    except sqlite3.Error as exc:
        raise wrap_error(exc, path, "reading") from exc
    except OSError as exc:  # copying a file a crashed writer left
        raise SpillFileError(f"cannot read dead-letter spill file {path!r}: {exc}") from exc
    with _closed_on_failure(db, path, "reading"):
        db.execute("PRAGMA busy_timeout = 5000")
        if not is_ours(db, path):
            raise SpillFileForeignError(f"{path!r} is an empty database, not a dead-letter spill file")
        generation = meta_int(db, "generation")
        target = meta(db, "target")
        spill = cls(db, path, lock_fd=None, generation=generation, target=target)
        spill.check_parked()
        return spill


class _CopyConnection(sqlite3.Connection):
    """A connection to a private copy of a spill file that deletes the copy when it is closed."""

    copy_dir: str | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.copy_dir is not None:
                shutil.rmtree(self.copy_dir, ignore_errors=True)
                self.copy_dir = None


def _uri(path: str, options: str) -> str:
    return f"file:{quote(os.path.abspath(path))}?{options}"


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to ``path`` that leaves every file beside it as it was (see
    :func:`open_read_only`)."""
    if is_locked(path):
        return sqlite3.connect(_uri(path, "mode=ro"), uri=True, isolation_level=None, check_same_thread=False)
    if not os.path.exists(path + "-wal"):
        return sqlite3.connect(
            _uri(path, "mode=ro&immutable=1"), uri=True, isolation_level=None, check_same_thread=False
        )
    copy_dir = tempfile.mkdtemp(prefix="guarded-dlq-read-")
    try:
        copy = os.path.join(copy_dir, os.path.basename(path))
        shutil.copyfile(path, copy)
        shutil.copyfile(path + "-wal", copy + "-wal")
        db = sqlite3.connect(copy, isolation_level=None, check_same_thread=False, factory=_CopyConnection)
    except BaseException:
        shutil.rmtree(copy_dir, ignore_errors=True)
        raise
    db.copy_dir = copy_dir
    return db


def meta(db: sqlite3.Connection, name: str) -> str | None:
    row = db.execute("SELECT CAST(value AS BLOB) FROM meta WHERE name = ?", (name,)).fetchone()
    if row is None or row[0] is None:
        return None
    try:
        return bytes(row[0]).decode("utf-8")
    except UnicodeDecodeError:
        raise SpillFileCorruptError(f"the meta value {name!r} is not UTF-8 text") from None


def meta_int(db: sqlite3.Connection, name: str) -> int:
    text = meta(db, name)
    try:
        return int(text or 0)
    except ValueError:
        raise SpillFileCorruptError(f"the meta value {name!r} is not a number") from None


def is_ours(db: sqlite3.Connection, path: str) -> bool:
    """Whether the file holds our schema (``False``: an empty database); raises otherwise."""
    application_id = db.execute("PRAGMA application_id").fetchone()[0]
    if application_id != APPLICATION_ID:
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if application_id == 0 and tables == 0:
            return False
        raise SpillFileForeignError(f"{path!r} is not a guarded dead-letter spill file")
    version = meta_int(db, "schema_version")
    if version > SCHEMA_VERSION:
        raise SpillFileVersionError(
            f"{path!r} was written by a newer guarded (spill file schema {version}, "
            f"this version reads up to {SCHEMA_VERSION})"
        )
    return True


__all__ = ["is_ours", "meta", "meta_int", "open_read_only", "open_writable", "prepare"]
