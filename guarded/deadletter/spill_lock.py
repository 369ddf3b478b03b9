"""The lock and the files of a dead-letter spill file: an exclusive ``flock`` on ``<path>.lock``
held for a writer's lifetime (the kernel releases it when the process dies), the pid of its holder,
and renaming a damaged file aside or deleting one with its WAL and shared memory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable

from .spill_errors import SpillFileLockedError

_LOCK_ATTEMPTS = 20


def lock_path(path: str) -> str:
    """The lock file of the spill file ``path``."""
    return path + ".lock"


def acquire_lock(path: str) -> int:
    """Take the exclusive ``flock`` of ``path``'s lock file without waiting; returns its descriptor.

    After the lock is taken, the lock file's path must still name the locked inode: a process
    that removes a spill file (adoption) unlinks the lock file while holding it, and a lock taken
    on the unlinked inode protects nothing, so it is dropped and the open retried.

    Raises :class:`SpillFileLockedError` when a live process holds it, :class:`OSError` when the
    lock file cannot be created.
    """
    name = lock_path(path)
    for _ in range(_LOCK_ATTEMPTS):
        fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise SpillFileLockedError(
                f"dead-letter spill file {path!r} is in use by another process{who}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            held, named = os.fstat(fd), os.stat(name)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode("ascii"))
        except OSError:
            pass  # the pid is for messages only; a full disk must not cost the lock
        return fd
    raise SpillFileLockedError(f"the lock file of {path!r} keeps being replaced; try again")


def is_locked(path: str) -> bool:
    """Whether a live process holds ``path``'s lock (``False`` when there is no lock file)."""
    try:
        fd = os.open(lock_path(path), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def holder_pid(path: str) -> int | None:
    """The pid written into ``path``'s lock file by its last holder, if any."""
    try:
        with open(lock_path(path), "rb") as handle:
            text = handle.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def unlink_quietly(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def set_aside(path: str, *, now: Callable[[], float] = time.time) -> str:
    """Rename a damaged spill file (and its WAL) to ``<path>.corrupt-<UTC timestamp>`` for
    inspection and drop its shared-memory file; returns the new name. Call with its lock held."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now()))
    target = f"{path}.corrupt-{stamp}Z"
    counter = 1
    while os.path.exists(target):
        counter += 1
        target = f"{path}.corrupt-{stamp}Z-{counter}"
    if os.path.exists(path + "-wal"):
        os.rename(path + "-wal", target + "-wal")
    unlink_quietly(path + "-shm")
    os.rename(path, target)
    return target


def remove_files(path: str) -> None:
    """Delete a spill file with its WAL and shared memory (the WAL first, so a crash midway never
    leaves a WAL beside a newer file of the same name). Call with its lock held; the lock file
    itself is removed by :meth:`SpillFile.remove`."""
    unlink_quietly(path + "-wal")
    unlink_quietly(path + "-shm")
    unlink_quietly(path)


__all__ = [
    "acquire_lock",
    "holder_pid",
    "is_locked",
    "lock_path",
    "remove_files",
    "set_aside",
    "unlink_quietly",
]
