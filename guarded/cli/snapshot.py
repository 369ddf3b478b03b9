"""``guarded snapshot capture|list|show|diff|restore|tag|gc``: snapshots from the command line.

Stores are given as ``module:callable`` factories (sync or async, as ``guarded check`` takes
them): ``--snapshots`` names the snapshot store's (or ``GUARDED_SNAPSHOT_STORE``; ``--dir PATH``
is short for a file store in ``PATH``), ``capture --from`` and ``restore --into`` the StateStore's.
``guarded.backends.postgres.factory:create_snapshot_store`` builds a PostgreSQL one from the
``GUARDED_PG_*`` variables. The plain stores are used (no guard): an operator sees every failure.

Exit codes as every command's (docs/cli.md): 0 done; 1 a problem (a corrupt snapshot, a conflict,
a format this code cannot load); 2 a user error (a bad option, a factory that does not import, an
unknown snapshot id); 3 a store that cannot be reached; 4 a PostgreSQL schema not migrated; 130
Ctrl-C, saying what was done. ``--json`` prints one JSON object on stdout.

This module builds the parser; :mod:`.snapshot_actions` runs each action, :mod:`.snapshot_run` opens
the stores and turns failures into exit codes, :mod:`.snapshot_output` prints and counts progress.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from ..durations import parse_duration
from .snapshot_actions import (
    capture_command,
    diff_command,
    gc_command,
    list_command,
    restore_command,
    show_command,
    tag_command,
)
from .snapshot_run import STORE_VARIABLE, run_action
from .support import duration, whole_number, with_hint


def register(subparsers: Any) -> None:
    """Add the ``snapshot`` subcommand and its actions."""
    parser = subparsers.add_parser(
        "snapshot",
        help="capture, list, compare, restore, tag and collect snapshots of a session's state",
        description=(
            "Snapshots of what a StateStore holds for one session or trace (docs/snapshots.md). The "
            f"snapshot store is a module:callable factory (--snapshots, or {STORE_VARIABLE}), or a file "
            "store directory (--dir); capture --from and restore --into name StateStore factories."
        ),
        epilog="See docs/cli.md for the exit codes every guarded command shares.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(
        name: str, help_text: str, handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
    ) -> Any:
        sub = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        sub.add_argument(
            "--snapshots",
            metavar="MODULE:CALLABLE",
            help=f"factory of the snapshot store (default: ${STORE_VARIABLE})",
        )
        sub.add_argument(
            "--dir", metavar="PATH", help="a file snapshot store in PATH (instead of --snapshots)"
        )
        sub.add_argument(
            "--app-dir",
            default=".",
            metavar="DIR",
            help="directory put first on sys.path before importing factories (default: the current one)",
        )
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        sub.set_defaults(handler=lambda args: run_action(args, handler))
        return sub

    sub = action(
        "capture", "capture a session's or a trace's state from a StateStore into a snapshot", capture_command
    )
    sub.add_argument(
        "--from", dest="source", required=True, metavar="MODULE:CALLABLE", help="StateStore factory"
    )
    subject = sub.add_mutually_exclusive_group(required=True)
    subject.add_argument("--session", metavar="ID", help="capture everything of this session")
    subject.add_argument("--trace", metavar="ID", help="capture everything of this trace")
    sub.add_argument("--trace-session", metavar="ID", help="with --trace: the session of its trajectory")
    sub.add_argument(
        "--tag", action="append", default=[], metavar="TAG", help="tag the snapshot (repeatable)"
    )
    sub.add_argument("--description", default="", help="a description kept with the snapshot")
    sub.add_argument("--parent", metavar="ID", help="the snapshot this one follows (lineage)")
    sub.add_argument("--id", dest="snapshot_id", metavar="ID", help="the snapshot's id (default: a new UUID)")
    sub.add_argument(
        "--memory-key", action="append", default=[], metavar="KEY", help="a memory key (repeatable)"
    )
    sub.add_argument("--trace-id", action="append", default=[], metavar="ID", help="a trace of the session")
    sub.add_argument(
        "--pause-token", action="append", default=[], metavar="TOKEN", help="a pause to copy (repeatable)"
    )

    sub = action("list", "list snapshots, oldest first", list_command)
    sub.add_argument("--subject", metavar="ID", help="only snapshots of this session or trace")
    sub.add_argument("--kind", choices=("session", "trace"), help="only snapshots of sessions, or of traces")
    sub.add_argument("--tag", metavar="TAG", help="only snapshots with this tag")
    sub.add_argument(
        "--since", type=_when, metavar="WHEN", help="created at or after: ISO time, or an age (2h)"
    )
    sub.add_argument("--until", type=_when, metavar="WHEN", help="created before: ISO time, or an age (30m)")
    sub.add_argument("--limit", type=whole_number(1), default=50, metavar="N", help="snapshots per page (50)")
    sub.add_argument("--cursor", metavar="CURSOR", help="the page after this cursor (printed by a listing)")
    sub.add_argument("--all", action="store_true", help="every page")

    sub = action("show", "show a snapshot's record and lineage", show_command)
    sub.add_argument("snapshot_id", metavar="ID")

    sub = action("diff", "what changed from snapshot A to snapshot B", diff_command)
    sub.add_argument("a", metavar="A")
    sub.add_argument("b", metavar="B")

    sub = action(
        "restore",
        "write a snapshot into a StateStore (idempotent; never over newer data unless --rollback)",
        restore_command,
    )
    sub.add_argument("snapshot_id", metavar="ID")
    sub.add_argument("--into", required=True, metavar="MODULE:CALLABLE", help="StateStore factory")
    sub.add_argument(
        "--rollback",
        action="store_true",
        help="write the snapshot's values over newer ones, as of now, and list what was overwritten",
    )
    sub.add_argument(
        "--include-pauses",
        action="store_true",
        help="restore pause tokens too (re-created only with --rollback)",
    )
    sub.add_argument(
        "--skip-unsupported", action="store_true", help="leave out sections the store cannot take"
    )

    sub = action("tag", "add tags to a snapshot (or remove them with --remove)", tag_command)
    sub.add_argument("snapshot_id", metavar="ID")
    sub.add_argument("tags", nargs="+", metavar="TAG")
    sub.add_argument("--remove", action="store_true", help="remove the tags instead")

    sub = action(
        "gc", "delete what the retention policy no longer keeps, then unreferenced blobs", gc_command
    )
    sub.add_argument("--keep-last", type=whole_number(1), metavar="N", help="per subject, keep the newest N")
    sub.add_argument(
        "--max-age", type=duration(), metavar="DURATION", help="delete snapshots older than this"
    )
    sub.add_argument("--include-tagged", action="store_true", help="apply the policy to tagged snapshots too")
    sub.add_argument(
        "--grace", type=duration(allow_zero=True), default=0.0, metavar="DURATION", help="keep younger blobs"
    )


# --- values --------------------------------------------------------------------------------------


def _when(text: str) -> datetime:
    """An ISO-8601 time (UTC when it names no zone) or an age: ``2h`` is two hours ago."""
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        try:
            return datetime.now(UTC) - timedelta(seconds=parse_duration(text))
        except ValueError:
            raise argparse.ArgumentTypeError(
                with_hint(f"{text!r} is neither a time nor an age", "write 2026-01-31T12:00:00Z or 2h, 30d")
            ) from None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


__all__ = ["STORE_VARIABLE", "register"]
