"""``guarded dlq replay`` and ``guarded dlq purge``: operating the spill files of a path that no
live process holds (replaying their writes into a store a factory builds, or deleting them)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bulk_forms import bulk_methods_of
from ..deadletter import (
    ReplayResult,
    ReplaySummary,
    SpillFile,
    store_sender,
)
from ..deadletter.replay import Send, SendBulk
from ..guard_core import core_of
from ..store_identity import declared_identity, store_identity
from .check import build_store, close_store, load_factory
from .dlq_files import (
    Failures,
    SlotFile,
    file_dict,
    pinned_buffer,
    quiet_recovery,
    unknown_totals,
    writable_files,
)
from .plugin import is_unreachable
from .progress import Progress
from .support import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    UnreachableError,
    UsageError,
    interrupted,
    report,
)


def _counted(store: Any, state: _Replay) -> tuple[Send, SendBulk | None]:
    """The store's senders, advancing the progress by each write the store took and keeping the
    last failure not followed by a success (to tell a backend that is down)."""
    send, send_bulk = store_sender(store)
    progress = state.progress

    async def counted(method: str, call_args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReplayResult:
        try:
            result = await send(method, call_args, kwargs)
        except Exception as exc:
            state.failure = exc
            raise
        if result is ReplayResult.OK:
            state.failure = None
            progress.advance(1, detail=method)
        return result

    if send_bulk is None:
        return counted, None
    bulk = send_bulk

    async def counted_bulk(method: str, calls: list[Any]) -> ReplayResult:
        try:
            result = await bulk(method, calls)
        except Exception as exc:
            state.failure = exc
            raise
        if result is ReplayResult.OK:
            state.failure = None
            progress.advance(len(calls), detail=method)
        return result

    return counted, counted_bulk


async def _replay_file(
    file: SlotFile, args: argparse.Namespace, store: Any, state: _Replay
) -> tuple[ReplaySummary | None, int, int, str | None]:
    buffer = pinned_buffer(file.path)
    try:
        waiting = await buffer.open()
        if buffer.spill_path is None:
            return None, 0, 0, buffer.spill_error or f"cannot open {file.path!r}"
        unparked = await buffer.unpark() if args.include_parked else 0
        send, send_bulk = _counted(store, state)
        summary = await buffer.replay(
            send, send_bulk=send_bulk, bulk_methods=bulk_methods_of(store), rate=args.rate, target=store
        )
        state.quarantined.append((await buffer.stats()).quarantined_total)
        return summary, waiting, unparked, None
    finally:
        await buffer.aclose()


@dataclass
class _Replay:
    """What a replay has done so far (read after Ctrl-C too)."""

    progress: Progress
    target: str | None = None
    done: list[tuple[SlotFile, ReplaySummary, int, int]] = field(default_factory=list)
    quarantined: list[int] = field(default_factory=list)
    failure: BaseException | None = None
    """The last send that failed, unless a send succeeded since."""

    @property
    def backend_down(self) -> bool:
        """The pass said so, or the last sends failed to reach the backend."""
        if any(summary.backend_down for _, summary, _, _ in self.done):
            return True
        return self.failure is not None and is_unreachable(self.failure)


def identity_of(store: object) -> str:
    """The identity a guard records for the held writes of ``store``: a guarded store's as its
    guard records it (its name and application setting), else as a guard named ``default``."""
    core = core_of(store)
    if core is None:
        return store_identity(store, "default")
    return store_identity(core.target, core.name, application=core.config.dead_letter.application)


def check_identities(files: Sequence[SlotFile], identity: str, retarget: str | None) -> None:
    """Refuse (a :class:`UsageError`, nothing replayed) when a file recorded another identity
    than the store's ``identity``, unless ``retarget`` names exactly the identity it recorded
    (files that recorded none, written before files recorded one, are taken as before; the files
    were chosen by ``retarget`` already, see :func:`replay_command`)."""
    recorded = sorted({file.target for file in files if file.target is not None})
    foreign = [target for target in recorded if target != identity]
    refused = [target for target in foreign if target != retarget]
    if refused:
        raise UsageError(
            f"the spill files hold writes recorded for {', '.join(refused)}, not for the store "
            f"the factory built ({identity}); nothing was replayed",
            f"replay them with a factory of that store, or move them deliberately with "
            f"--retarget {refused[0]!r}",
        )


async def _replay(
    args: argparse.Namespace, files: Sequence[SlotFile], failures: Failures, state: _Replay
) -> None:
    factory = load_factory(args.store)
    store = await build_store(factory, args.store)
    state.target = declared_identity(core.target if (core := core_of(store)) is not None else store)
    try:
        check_identities(files, identity_of(store), args.retarget)
    except UsageError:
        await close_store(store)
        raise
    state.progress.start()
    try:
        for file in files:
            summary, waiting, unparked, error = await _replay_file(file, args, store, state)
            if summary is None:
                failures.report(file, error or f"cannot open {file.path!r}")
                continue
            state.done.append((file, summary, waiting, unparked))
            if state.backend_down:
                break  # the other files wait for the backend too
    finally:
        state.progress.close()
        await close_store(store)


def _still_waiting(files: Sequence[SlotFile]) -> int:
    """Writes waiting in ``files`` now (read-only; unreadable files count as none)."""
    left = 0
    for file in files:
        with contextlib.suppress(Exception):
            reader = SpillFile.open_read_only(file.path)
            try:
                left += reader.totals().pending
            finally:
                reader.close()
    return left


def replay_command(args: argparse.Namespace) -> int:
    failures = Failures()
    files, busy = writable_files(args, failures, target=args.target or args.retarget, check_targets=True)
    if args.retarget is not None and not any(file.target == args.retarget for file in files):
        raise UsageError(
            f"--retarget {args.retarget!r} is not the identity the spill files recorded "
            f"({', '.join(sorted({str(file.target) for file in files})) or 'no file to replay'})",
            "give --retarget exactly the identity 'guarded dlq list' shows as the files' target",
        )
    sys.path.insert(0, os.path.abspath(args.app_dir))
    total = sum(file.waiting for file in files)
    state = _Replay(Progress("replay", total=total, unit="writes"))
    if files:
        try:
            with quiet_recovery():
                asyncio.run(_replay(args, files, failures, state))
        except KeyboardInterrupt:
            left = _still_waiting(files)
            raise interrupted(
                f"replayed {state.progress.summary()} before Ctrl-C; {left:,} write(s) still wait in "
                f"{args.path} (nothing was lost); run 'guarded dlq replay' again to continue"
            ) from None
    done = state.done
    quarantined = state.quarantined
    visited = {file.path for file, _, _, _ in done}
    unvisited = sum(file.waiting for file in files if file.path not in visited)
    replayed = sum(summary.replayed for _, summary, _, _ in done)
    parked = sum(summary.parked for _, summary, _, _ in done)
    remaining = sum(summary.remaining for _, summary, _, _ in done) + unvisited
    down = state.backend_down
    waiting = sum(count for _, _, count, _ in done)
    unparked = sum(count for _, _, _, count in done)
    stopped = any(summary.stopped_early for _, summary, _, _ in done)
    errors = [summary.last_error for _, summary, _, _ in done if summary.last_error]
    known = not failures.count  # a total that left an unreadable file out would read as "nothing waits"
    totals = {
        "waiting": waiting,
        "unparked": unparked,
        "replayed": replayed,
        "parked": parked,
        "remaining": remaining,
        "quarantined": sum(quarantined),
    }
    document = {
        "path": args.path,
        **{name: value if known else None for name, value in totals.items()},
        "stopped_early": stopped,
        "backend_down": down,
        "target": state.target,
        "last_error": errors[-1] if errors else None,
        "skipped_in_use": busy,
        "files": [
            {
                "slot": file.slot,
                "path": file.path,
                "target": file.target,
                "waiting": count,
                "error": None,
                **summary.to_dict(),
            }
            for file, summary, count, _ in done
        ]
        + [file_dict(file) for file in failures.files],
    }
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
    else:
        if known:
            source = f"{len(done)} file(s) of {args.path}"
            print(f"replayed {replayed} of {waiting + unparked} write(s) from {source}")
        elif done:
            print(f"replayed from {len(done)} file(s) of {args.path}; {unknown_totals(failures)}")
        for file, summary, count, _ in done:
            print(f"  slot {file.slot} ({file.path}): {summary.replayed} of {count} replayed")
        if known:
            if unparked:
                print(f"  {unparked} parked write(s) were moved back for this replay")
            print(f"  parked now:  {parked}")
            print(f"  remaining:   {remaining}")
            if sum(quarantined):
                print(f"  quarantined: {sum(quarantined)} unreadable row(s) set aside (list --quarantined)")
        if busy:
            print(f"  skipped:     {busy} file(s) in use by live processes")
        if stopped:
            print("  stopped early: the store still fails; run replay again later")
        if errors:
            print(f"  last error:  {errors[-1]}")
    if down:
        where = f" ({state.target})" if state.target else ""
        why = f": {errors[-1]}" if errors else ""
        waiting_text = f"{remaining:,} write(s)" if known else "writes"
        return report(
            UnreachableError(
                f"the store's backend{where} is not answering; the replay stopped{why}; {waiting_text} "
                f"still wait in {args.path} (nothing was lost)",
                "bring the backend back, then run 'guarded dlq replay' again",
                target=state.target,
            )
        )
    if failures.count:
        return EXIT_USAGE
    return EXIT_PROBLEM if remaining or parked or busy else EXIT_OK


async def _purge(
    files: Sequence[SlotFile], failures: Failures, *, pending: bool, parked: bool, quarantined: bool
) -> list[tuple[SlotFile, int]]:
    """Each file purged, with the count of rows it deleted (a file it could not open reported)."""
    purged: list[tuple[SlotFile, int]] = []
    for file in files:
        buffer = pinned_buffer(file.path)
        try:
            await buffer.open()
            if buffer.spill_path is None:
                failures.report(file, buffer.spill_error or f"cannot open {file.path!r}")
                continue
            purged.append((file, await buffer.purge(pending=pending, parked=parked, quarantined=quarantined)))
        finally:
            await buffer.aclose()
    return purged


def purge_command(args: argparse.Namespace) -> int:
    if not (args.pending or args.parked or args.quarantined):
        raise UsageError("nothing to purge was chosen", "add --pending, --parked and/or --quarantined")
    if not args.yes:
        raise UsageError("purging deletes writes for good", "add --yes to confirm")
    failures = Failures()
    files, busy = writable_files(args, failures, target=None, check_targets=False)
    with quiet_recovery():
        done = (
            asyncio.run(
                _purge(
                    files, failures, pending=args.pending, parked=args.parked, quarantined=args.quarantined
                )
            )
            if files
            else []
        )
    removed = sum(count for _, count in done)
    known = not failures.count
    if args.json:
        print(
            json.dumps(
                {
                    "path": args.path,
                    "purged": removed if known else None,
                    "pending": args.pending,
                    "parked": args.parked,
                    "quarantined": args.quarantined,
                    "skipped_in_use": busy,
                    "files": [
                        {"slot": file.slot, "path": file.path, "purged": count, "error": None}
                        for file, count in done
                    ]
                    + [{**file_dict(file), "purged": None} for file in failures.files],
                }
            )
        )
    else:
        what = " and ".join(
            name
            for name, chosen in (
                ("pending", args.pending),
                ("parked", args.parked),
                ("quarantined", args.quarantined),
            )
            if chosen
        )
        if known:
            print(f"purged {removed} {what} write(s) from {len(files)} file(s) of {args.path}")
        elif done:
            print(f"purged {what} writes from {len(done)} file(s) of {args.path}; {unknown_totals(failures)}")
            for file, count in done:
                print(f"  slot {file.slot} ({file.path}): {count} purged")
    if failures.count:
        return EXIT_USAGE
    return EXIT_PROBLEM if busy else EXIT_OK
