"""Running a ``guarded snapshot`` action: the snapshot store and the StateStores it opens from
``module:callable`` factories (or ``--dir``), and the failures it turns into one ``error:`` line and
an exit code (docs/cli.md), Ctrl-C included."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal

from ..errors import CapabilityError
from ..snapshots import (
    FileSnapshotStore,
    FormatVersionError,
    InvalidCursorError,
    SnapshotConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    SnapshotStore,
    SnapshotStoreNotFoundError,
    SnapshotStoreUnavailableError,
)
from .check import build_store, close_store, load_factory
from .plugin import command_error, is_unreachable
from .support import (
    CommandError,
    NotMigratedError,
    ProblemError,
    UnreachableError,
    UsageError,
    interrupted,
)

StoreAccess = Literal["create", "write", "read"]
"""What an action does with the snapshot store (:func:`snapshot_store`)."""

STORE_VARIABLE = "GUARDED_SNAPSHOT_STORE"
"""The snapshot store's factory when ``--snapshots`` is not given."""
LIST_HINT = "'guarded snapshot list' lists the snapshots"


class _State:
    """What an action has done so far (for Ctrl-C)."""

    def __init__(self) -> None:
        self.done = "nothing was changed"


def run_action(
    args: argparse.Namespace, handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
) -> int:
    """Run the action ``handler`` with ``--app-dir`` first on ``sys.path``; what it raises as the
    :class:`CommandError` of its exit code (Ctrl-C: what ``args.state`` says was done)."""
    sys.path.insert(0, os.path.abspath(args.app_dir))
    args.state = _State()
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        raise interrupted(args.state.done) from None
    except CommandError:
        raise
    except SnapshotNotFoundError as exc:
        raise UsageError(str(exc), LIST_HINT) from exc
    except SnapshotStoreNotFoundError as exc:
        raise UsageError(
            str(exc), "check --dir: it names the directory a 'guarded snapshot capture' created"
        ) from exc
    except InvalidCursorError as exc:
        raise UsageError(str(exc), "pass the cursor a listing printed, or leave --cursor out") from exc
    except FormatVersionError as exc:
        raise ProblemError(
            str(exc), "load it with the guarded release (or migrations) that knows it"
        ) from exc
    except (SnapshotCorruptError, SnapshotConflictError) as exc:
        raise ProblemError(str(exc), "nothing was changed; capture again under a new id") from exc
    except CapabilityError as exc:
        raise UsageError(str(exc), "pass --skip-unsupported to leave those sections out") from exc
    except SnapshotStoreUnavailableError as exc:
        raise UnreachableError(str(exc), "check that the store's backend is up") from exc
    except Exception as exc:
        raise _backend_failure(exc) from exc


def _backend_failure(exc: BaseException) -> CommandError:
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    meant = command_error(exc)
    if meant is not None:
        return meant
    if is_unreachable(exc):
        return UnreachableError(
            f"a store stopped answering: {why}", "check that its backend is up, then run the command again"
        )
    if isinstance(exc, ValueError):
        return UsageError(why, "check the values given")
    raise exc


async def snapshot_store(args: argparse.Namespace, *, access: StoreAccess) -> Any:
    """The snapshot store ``--dir`` or ``--snapshots`` (else ``$GUARDED_SNAPSHOT_STORE``) names.

    ``access`` is what the action does with a file store: ``"create"`` (``capture``: a new
    directory becomes a store), ``"write"`` (``tag``, ``gc``: the store must exist) or ``"read"``
    (``list``, ``show``, ``diff``, a restore's source: nothing is created or changed)."""
    if args.dir is not None:
        if args.snapshots is not None:
            raise UsageError("--dir and --snapshots both name the snapshot store", "pass one of them")
        return FileSnapshotStore(Path(args.dir), create=access == "create", read_only=access == "read")
    spec = args.snapshots or os.environ.get(STORE_VARIABLE) or None
    if spec is None:
        raise UsageError(
            "no snapshot store given",
            f"pass --dir PATH (a file store) or --snapshots MODULE:CALLABLE (or set {STORE_VARIABLE})",
        )
    store = await _build(spec)
    if not isinstance(store, SnapshotStore):
        await close_store(store)
        raise UsageError(
            f"{spec!r} returned a {type(store).__qualname__}, not a SnapshotStore",
            "name a factory returning a snapshot store, e.g. "
            "guarded.backends.postgres.factory:create_snapshot_store",
        )
    return store


async def state_store(spec: str) -> Any:
    """The StateStore the factory ``spec`` returns (``capture --from``, ``restore --into``)."""
    return await _build(spec)


async def _build(spec: str) -> Any:
    """The store a factory returns; a schema that is not migrated exits 4, as ``guarded pg``
    commands do, not as a failing factory."""
    factory = load_factory(spec)
    try:
        return await build_store(factory, spec)
    except CommandError as exc:
        cause = exc.__cause__
        meant = None if cause is None else command_error(cause)
        if isinstance(meant, NotMigratedError):
            raise meant from cause
        raise


__all__ = ["LIST_HINT", "STORE_VARIABLE", "run_action", "snapshot_store", "state_store"]
