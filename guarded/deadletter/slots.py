"""Slot files: any number of workers on one configured spill path, each with a file of its own.

The configured path (``{name}`` replaced) is a *base* path. Slot 0 is the base path itself;
slot ``k`` (k >= 1) is the sibling ``<base>.<k>`` (``dlq-agents.sqlite.3``), with its WAL, shared
memory and lock files beside it (``<base>.<k>-wal``, ``<base>.<k>-shm``, ``<base>.<k>.lock``). A
process claims the lowest slot whose lock (a non-blocking ``flock``) it can take and whose file
is usable: missing (created), its own target's, or holding nothing. A file of another backend
target that holds writes, a file written by a newer guarded, or a database of something else is
left untouched and the next slot tried. A damaged file (not a database, malformed) is renamed
aside to ``<path>.corrupt-<UTC timestamp>Z`` for inspection and a fresh one started in its place.

Files with no recorded target (layout version 1, or written without a target) are taken by any
guard configured with the same base path, which records its own target in them and logs a
WARNING: they were written by a guard configured with this very path.

The other slot files of the base path whose lock is free belong to processes that are gone:
:meth:`SlotFiles.orphans` opens them (locked) for adoption. An orphan is locked while it is
adopted, so no two processes take it; its waiting and parked writes are copied into the buffer's
file in one transaction (in their order, only the newest per key kept, and none older than what the
buffer holds or has written for its key, by the logical times of the calls where both sides have
one: :func:`orphan_wins`), then the orphan and its WAL, shared memory and lock files are deleted
(:meth:`~.spill_link.SpillLink.adopt_orphans`). Every function here is synchronous and runs on the
buffer's worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..logical_time import WRITE_TIME_ARGUMENT, kept_write_time
from ..policy_table import PolicyTable
from ..store_identity import identity_digest
from .entries import DeadLetter, index_key_of_canonical
from .gate import Slot
from .spill import (
    RowInfo,
    SpillFile,
    SpillFileCorruptError,
    SpillFileError,
    SpillFileForeignError,
    SpillFileLockedError,
    SpillFileTargetError,
    SpillFileVersionError,
    acquire_lock,
    holder_pid,
    is_locked,
    lock_path,
    set_aside,
)

logger = logging.getLogger("guarded.deadletter")

MAX_SLOTS = 64
"""Slots a process tries before it gives up and keeps its held writes in memory."""

_UNUSABLE = (SpillFileVersionError, SpillFileForeignError, SpillFileTargetError)


def slot_path(base: str, slot: int) -> str:
    """The file of ``slot`` of ``base``: the base path itself for slot 0, ``<base>.<slot>`` else."""
    if slot < 0:
        raise ValueError("slot must not be negative")
    return base if slot == 0 else f"{base}.{slot}"


def named_spill_path(path: str, store_name: str, identity: str | None = None) -> str:
    """The configured spill ``path`` with ``{name}`` replaced by ``store_name``, made safe for a
    file name (any character but letters, digits, ``.``, ``_`` and ``-`` becomes ``_``), and
    ``{identity}`` by a short digest of the store ``identity`` (of ``guard:<name>`` when unknown)."""
    named = path.replace("{name}", re.sub(r"[^A-Za-z0-9._-]", "_", store_name) or "_")
    if "{identity}" in named:
        named = named.replace("{identity}", identity_digest(identity or f"guard:{store_name}"))
    return named


def split_extension(path: str) -> tuple[str, str]:
    """``path`` as ``(root, extension)``: ``("dlq", ".sqlite")`` for ``dlq.sqlite``, ``(path, "")``
    when its name has no extension."""
    root, ext = os.path.splitext(path)
    if not ext or os.sep in ext:
        return path, ""
    return root, ext


def sibling_spill_path(path: str | None, suffix: str) -> str | None:
    """The spill file of another kind of held write beside the spill file ``path``: ``suffix``
    added to its name, before its extension (``dlq-{name}.sqlite`` with ``-artifacts`` →
    ``dlq-{name}-artifacts.sqlite``); ``None`` (memory only) for ``None``."""
    if path is None:
        return None
    root, ext = split_extension(path)
    return f"{root}{suffix}{ext}"


def slot_files(base: str, *, files_only: bool = True) -> list[tuple[int, str]]:
    """``(slot, path)`` of every existing slot file of ``base``, by slot (a directory listing);
    ``files_only=False`` keeps the names that are not regular files (a directory in a slot file's
    place), for tools that must report them rather than pass over them."""
    directory, name = os.path.split(os.path.abspath(base))
    pattern = re.compile(re.escape(name) + r"\.([1-9][0-9]{0,8})")
    found: list[tuple[int, str]] = []
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in names:
        if entry == name:
            found.append((0, base))
            continue
        matched = pattern.fullmatch(entry)
        if matched is not None:
            found.append((int(matched.group(1)), slot_path(base, int(matched.group(1)))))
    found.sort()
    return [(slot, path) for slot, path in found if not files_only or os.path.isfile(path)]


def slot_of(base: str, path: str) -> int | None:
    """The slot number of ``path`` among ``base``'s slot files, ``None`` if it is not one."""
    if path == base:
        return 0
    prefix = base + "."
    suffix = path[len(prefix) :]
    if path.startswith(prefix) and suffix.isdigit() and not suffix.startswith("0"):
        return int(suffix)
    return None


def _signature(path: str) -> tuple[int, int, int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)


@dataclass
class SlotFiles:
    """Claims a slot of ``base`` and finds orphaned slot files, for one buffer.

    ``check_target``: refuse files of another target (``False``: any file is taken as it is,
    for tools that work on an explicit file). ``pinned``: only the base path itself, no slots.
    ``former_base``: the default path of earlier versions, shared by every store of the user: its
    slot files are adopted too, but only those that recorded exactly this ``target``.
    """

    base: str
    store_name: str
    target: str | None
    synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    check_target: bool = True
    pinned: bool = False
    max_slots: int = MAX_SLOTS
    former_base: str | None = None
    now: Callable[[], float] = time.time
    _skip: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    # --- claiming ---------------------------------------------------------------------------------

    def claim(self, *, create: bool, min_generation: int) -> SpillFile | None:
        """Lock and open the lowest usable slot file.

        ``create``: a missing file may be created (else only existing files are considered and
        ``None`` is returned when none is usable). A slot whose file cannot be opened for another
        reason (``OSError``, an unreadable file) is passed over like a locked one.

        Raises :class:`SpillFileLockedError` when ``create`` and no slot is usable (or the first
        error that made a slot unusable, when every slot failed that way).
        """
        if create:
            os.makedirs(os.path.dirname(os.path.abspath(self.base)), exist_ok=True)
        if self.pinned:
            candidates = [(0, self.base)]
        elif create:
            candidates = [(slot, slot_path(self.base, slot)) for slot in range(self.max_slots)]
        else:
            candidates = slot_files(self.base)
        busy = unusable = 0
        first_error: BaseException | None = None
        for _, path in candidates:
            if not create and not os.path.isfile(path):
                continue
            if self._skipped(path):
                unusable += 1
                continue
            try:
                fd = acquire_lock(path)
                spill = self._open(
                    path, fd, create=create, min_generation=min_generation, fresh_if_corrupt=True
                )
            except SpillFileLockedError:
                busy += 1
                continue
            except (OSError, SpillFileError) as exc:
                first_error = first_error or exc
                unusable += 1
                continue
            if spill is None:
                unusable += 1
                continue
            return spill
        if not create:
            # Writes the former default path holds for this target are adopted into a file of
            # this buffer's own: make one for them.
            return self.claim(create=True, min_generation=min_generation) if self._former_waiting() else None
        if first_error is not None and not busy:
            raise first_error
        if self.pinned:
            pid = holder_pid(self.base)
            who = f" (pid {pid})" if pid is not None and busy else ""
            raise SpillFileLockedError(f"dead-letter spill file {self.base!r} is not usable{who}")
        raise SpillFileLockedError(
            f"no usable dead-letter spill slot for {self.base!r}: {busy} of {len(candidates)} slots in use "
            f"by live processes, {unusable} holding files this process cannot use"
        )

    def _open(
        self, path: str, fd: int, *, create: bool, min_generation: int, fresh_if_corrupt: bool
    ) -> SpillFile | None:
        """Open ``path`` under its lock ``fd`` (released unless a file is returned); ``None`` for a
        file this process must leave alone."""
        try:
            if not create and not os.path.isfile(path):
                os.close(fd)
                return None
            try:
                return self._open_locked(path, fd, min_generation)
            except SpillFileCorruptError as exc:
                aside = self.set_aside(path, exc)
                if not fresh_if_corrupt or aside is None:
                    os.close(fd)
                    return None
                return self._open_locked(path, fd, min_generation)
            except _UNUSABLE as exc:
                os.close(fd)
                self._remember_skip(path, exc)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    def _open_locked(self, path: str, fd: int, min_generation: int) -> SpillFile:
        spill = SpillFile.open(
            path,
            synchronous=self.synchronous,
            lock_fd=fd,
            target=self.target,
            check_target=self.check_target,
            min_generation=min_generation,
        )
        if spill.legacy_entries:
            logger.warning(
                "dead-letter spill file %r of store %r recorded no backend target; its %d write(s) were "
                "left by a guard configured with this path and are taken as writes for %s",
                path,
                self.store_name,
                spill.legacy_entries,
                self.target,
                extra={
                    "event": "deadletter_legacy_file",
                    "store": self.store_name,
                    "path": path,
                    "entries": spill.legacy_entries,
                },
            )
        return spill

    def set_aside(self, path: str, exc: BaseException, *, held: int | None = None) -> str | None:
        """Rename the damaged file ``path`` aside (its lock held by the caller) and log one ERROR
        with its new name; ``None`` (and the ERROR says so) when it cannot be renamed."""
        try:
            aside = set_aside(path, now=self.now)
        except OSError as rename_error:
            logger.error(
                "dead-letter spill file %r of store %r is damaged (%s) and cannot be renamed aside: %s",
                path,
                self.store_name,
                exc,
                rename_error,
                extra={"event": "deadletter_spill_corrupt", "store": self.store_name, "path": path},
            )
            return None
        held_text = "" if held is None else f"; the {held} write(s) only it held are in it"
        logger.error(
            "dead-letter spill file %r of store %r is damaged (%s): renamed to %r for inspection%s",
            path,
            self.store_name,
            exc,
            aside,
            held_text,
            extra={
                "event": "deadletter_spill_corrupt",
                "store": self.store_name,
                "path": path,
                "renamed_to": aside,
            },
        )
        return aside

    def replace_corrupt(
        self, spill: SpillFile, exc: BaseException, *, held: int | None, min_generation: int
    ) -> tuple[str | None, SpillFile | None, BaseException | None]:
        """Close the damaged ``spill`` keeping its lock, rename it aside and start a fresh file in
        its place; returns the new name, the fresh file (``None`` when it could not be started)
        and why not."""
        fd = spill.close_keeping_lock()
        if fd is None:
            return None, None, SpillFileError("the damaged spill file had no lock")
        aside = self.set_aside(spill.path, exc, held=held)
        if aside is None:
            os.close(fd)
            return None, None, exc
        try:
            return aside, self._open_locked(spill.path, fd, min_generation), None
        except (SpillFileError, OSError) as error:
            with contextlib.suppress(OSError):
                os.close(fd)
            return aside, None, error
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    # --- orphans ----------------------------------------------------------------------------------

    def orphans(self, own: str | None) -> list[SpillFile]:
        """The slot files of other processes that are gone, opened and locked, with writes in them.

        Files whose lock is held, of another target, of a newer layout or foreign are skipped
        (and remembered, so the next look costs a ``stat``); damaged ones are renamed aside;
        empty ones are removed.
        """
        if self.pinned:
            return []
        found: list[SpillFile] = []
        candidates = slot_files(self.base)
        if self.former_base is not None and self.former_base != self.base:
            candidates += [entry for entry in slot_files(self.former_base) if self._recorded_here(entry[1])]
        for _, path in candidates:
            if path == own or self._skipped(path):
                continue
            pid = holder_pid(path)
            try:
                fd = acquire_lock(path)
            except SpillFileLockedError:
                continue
            except OSError:
                continue
            try:
                spill = self._open(path, fd, create=False, min_generation=0, fresh_if_corrupt=False)
            except (SpillFileError, OSError) as exc:
                logger.debug("cannot open spill file %r for adoption: %s", path, exc)
                continue
            if spill is None:
                continue
            spill.previous_pid = pid
            if spill.is_empty:
                try:
                    spill.remove()
                except OSError as exc:
                    logger.debug("cannot remove empty spill file %r: %s", path, exc)
                continue
            found.append(spill)
        return found

    def _former_waiting(self) -> bool:
        """Whether a file of the former default path that no live process holds recorded this target."""
        if self.former_base is None or self.former_base == self.base:
            return False
        return any(
            self._recorded_here(path) and not is_locked(path) for _, path in slot_files(self.former_base)
        )

    def _recorded_here(self, path: str) -> bool:
        """Whether the file ``path`` of the former default path recorded this buffer's target (read
        only; any other file, one with no recorded target included, is left alone and remembered)."""
        if self.target is None or self._skipped(path):
            return False
        try:
            reader = SpillFile.open_read_only(path)
        except (SpillFileError, OSError) as exc:
            logger.debug("cannot read spill file %r of the former default path: %s", path, exc)
            return False
        try:
            recorded = reader.target
        finally:
            reader.close()
        if recorded == self.target:
            return True
        self._remember_skip(
            path,
            SpillFileTargetError(
                f"a file of the former default path recorded for {recorded or 'no store'}, not {self.target}"
            ),
        )
        return False

    def set_aside_orphan(self, spill: SpillFile, exc: BaseException) -> None:
        """An orphan turned out damaged while being read: rename it aside and drop its lock file."""
        fd = spill.close_keeping_lock()
        try:
            if self.set_aside(spill.path, exc) is not None:
                with contextlib.suppress(OSError):
                    os.unlink(lock_path(spill.path))
        finally:
            if fd is not None:
                os.close(fd)

    # --- files left alone -------------------------------------------------------------------------

    def _skipped(self, path: str) -> bool:
        known = self._skip.get(path)
        if known is None:
            return False
        if _signature(path) == known:
            return True
        del self._skip[path]
        return False

    def _remember_skip(self, path: str, exc: BaseException) -> None:
        signature = _signature(path)
        if signature is None:
            return
        first = path not in self._skip
        self._skip[path] = signature
        if first:
            logger.warning(
                "dead-letter spill file %r is left alone by store %r: %s",
                path,
                self.store_name,
                exc,
                extra={"event": "deadletter_spill_skipped", "store": self.store_name, "path": path},
            )


# --- adoption: which of an orphan's writes win ------------------------------------------------------

_ORDERED_BY_DATA = frozenset(
    policy.name for policy in PolicyTable.for_state_store() if policy.ordered_by_data
)
"""Methods the backend orders by their data, not by the logical time of the call."""


def newest_per_key(rows: Sequence[RowInfo]) -> dict[Slot, RowInfo]:
    """The newest of an orphan's waiting ``rows`` of each last-write-wins key (the others it holds
    of the key are superseded when it is adopted)."""
    newest: dict[Slot, RowInfo] = {}
    for row in rows:
        if row.key is not None:
            slot = (row.method, index_key_of_canonical(row.key))
            best = newest.get(slot)
            if best is None or (row.generation, row.stamp) >= (best.generation, best.stamp):
                newest[slot] = row
    return newest


def _written_at(entry: DeadLetter | None) -> int | None:
    """The logical time a held write kept of its call (``None`` when unknown)."""
    if entry is None:
        return None
    kwargs = entry.call.get("kwargs")
    return kept_write_time(kwargs.get(WRITE_TIME_ARGUMENT)) if isinstance(kwargs, dict) else None


def orphan_wins(
    slot: Slot,
    row: RowInfo,
    theirs: DeadLetter | None,
    ours: Mapping[int, DeadLetter],
    *,
    recent: bool,
    direct_time: int | None,
    waiting: Mapping[int, tuple[int, int]] | None,
    generation: int,
) -> list[int] | None:
    """Whether an orphan's newest write ``row`` of ``slot`` (``theirs``: its entry, when read) is
    newer than what the adopting buffer wrote directly (``recent``: it did, at logical time
    ``direct_time`` when known) or holds of the key (``waiting``: seq -> (generation, stamp) of its
    entries, ``ours`` those read; ``generation``: the buffer's own file generation): ``None`` when
    it is not (superseded), else the buffer's own waiting entries of the key it replaces.

    A write the backend orders by its own data (a task's ``updated_at``) is kept beside the
    buffer's. Otherwise, with a logical time on both sides the later call wins, an equal time the
    buffer's. Without (a write held before logical times existed, a direct write whose time was not
    noted), as before them: a write of the buffer's own run wins; an own write of an earlier run
    loses to an orphan's enqueued later. The orphan may be a worker that ran beside this one, so
    its writes are not older for being adopted."""
    if slot[0] in _ORDERED_BY_DATA:
        return []  # kept beside this process's writes of the key: the backend orders them
    their_time = _written_at(theirs)
    if recent and (their_time is None or direct_time is None or direct_time >= their_time):
        return None
    if not waiting:
        return []
    times = [_written_at(ours.get(seq)) for seq in waiting]
    if their_time is not None and None not in times:
        return list(waiting) if their_time > max(time for time in times if time is not None) else None
    if any(own_generation == generation for own_generation, _ in waiting.values()):
        return None
    if all(seq in ours for seq in waiting):
        return list(waiting) if max(ours[seq].enqueued_at for seq in waiting) < row.enqueued_at else None
    return []


__all__ = [
    "MAX_SLOTS",
    "SlotFiles",
    "named_spill_path",
    "newest_per_key",
    "orphan_wins",
    "sibling_spill_path",
    "slot_files",
    "slot_of",
    "slot_path",
    "split_extension",
]
