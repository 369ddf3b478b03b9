"""``guarded dlq list|stats|replay|purge``: inspect and operate the dead-letter spill files of a path.

``--path`` is the configured spill path (``{name}`` replaced): the commands work on every slot
file of it (the path itself, and ``<path>.<k>`` of the other processes configured with it; see
:mod:`guarded.deadletter.slots`) and say which file each write is in. ``list`` and ``stats``
open the files read-only and work beside the live processes that own them. ``replay`` and
``purge`` need a file's lock: a file held by a live process is skipped (exit 1). Reading creates
and changes no file (:meth:`~guarded.deadletter.spill.SpillFile.open_read_only`). A file that cannot
be read (damaged, foreign, of a newer layout, not a file) gets one error line, the others are
still served, no total is printed (``--json``: ``null``), and the exit status is 2. Rows of a
file that cannot be read (a column of the wrong type, text that is not UTF-8, a call that is not
JSON) never stop a command: they are left out, counted, and listed by ``list --quarantined`` (a
guard or ``replay`` moves them to the file's quarantine table). Payload contents are never
printed unless ``list --show-payload`` asks for them.

``replay`` shows progress (counts and rate) on stderr while it sends, and Ctrl-C says how many
writes were replayed and how many still wait. Exit codes follow :mod:`guarded.cli.support`: 0
success, 1 writes left behind (parked, remaining, or files held by live processes), 2 user error
or an unreadable file, 3 the store's backend is unreachable, 130 interrupted.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..deadletter import (
    SpillFileError,
    SpillFileLockedError,
)
from .dlq_files import UNRECORDED_ERROR, error, error_text
from .dlq_list import list_command, stats_command
from .dlq_replay import purge_command, replay_command
from .support import (
    EXIT_PROBLEM,
    EXIT_USAGE,
    CommandError,
    positive_number,
    report,
    whole_number,
)

if TYPE_CHECKING:
    from . import Subparsers

PROG = "guarded dlq"


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
        "by live processes), 2 when a file was recorded for another store identity (nothing is replayed; "
        "--retarget moves it deliberately), 3 when the store's backend cannot be reached.",
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
        "--retarget",
        default=None,
        metavar="FROM_IDENTITY",
        help="replay files recorded for another store identity into this store, a deliberate move: "
        "FROM_IDENTITY must equal the identity the files recorded (their target in 'dlq list')",
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


def _handle(command: Any, args: argparse.Namespace) -> int:
    try:
        return int(command(args))
    except CommandError as exc:
        return report(exc)
    except SpillFileLockedError as exc:
        error(str(exc), "stop that process first (list and stats work while it runs)")
        return EXIT_PROBLEM
    except SpillFileError as exc:
        error(str(exc), "check --path: it must be a guarded dead-letter spill file")
        return EXIT_USAGE


def run_list(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq list``."""
    return _handle(list_command, args)


def run_stats(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq stats``."""
    return _handle(stats_command, args)


def run_replay(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq replay``."""
    return _handle(replay_command, args)


def run_purge(args: argparse.Namespace) -> int:
    """Handler of ``guarded dlq purge``."""
    return _handle(purge_command, args)


__all__ = ["UNRECORDED_ERROR", "error_text", "register", "run_list", "run_purge", "run_replay", "run_stats"]
