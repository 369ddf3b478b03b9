"""Adopting orphans: the slot files of processes that are gone move into a buffer's own file.

An orphan is locked while it is adopted, so no two processes take it; its waiting and parked
writes are copied into the buffer's file in one transaction (in their order, only the newest per
key kept, and none older than what the buffer holds or has written for its key, by the logical
times of the calls where both sides have one), then the orphan and its WAL, shared memory and lock
files are deleted. See :meth:`~.buffer.DeadLetterBuffer.adopt_orphans`.
"""

from __future__ import annotations

import logging

from ..logical_time import WRITE_TIME_ARGUMENT, kept_write_time
from ..policy_table import PolicyTable
from .entries import DeadLetter, index_key_of_canonical
from .gate import Slot
from .held import HeldIndex
from .spill import RowInfo, SourceReadError, SpillCapError, SpillFile, is_corruption
from .spill_link import SPILL_ERRORS, SpillLink

logger = logging.getLogger("guarded.deadletter")

_ORDERED_BY_DATA = frozenset(
    policy.name for policy in PolicyTable.for_state_store() if policy.ordered_by_data
)
"""Methods the backend orders by their data, not by the logical time of the call."""


async def adopt_orphans(link: SpillLink) -> int:
    """(Under the lock.) Claim a slot file left by an earlier process when none is claimed (or
    retry a failed one when due), then adopt the orphans; returns how many writes were taken."""
    claimed = 0
    if link.failed:
        if link.monotonic() >= link.retry_at:
            await link.recover()
    elif link.spill is None:
        claimed = await link.claim(create=False)
        link.counters.adopted_total += claimed
    return claimed + await adopt_if_usable(link)


async def adopt_if_usable(link: SpillLink) -> int:
    """Adopt every orphan of the base path while the buffer's own file is usable; returns how many
    writes (waiting and parked) were adopted."""
    files = link.files
    if files is None or files.pinned or not link.usable():
        return 0
    own = link.spill.path if link.spill is not None else None
    try:
        orphans = await link.job(lambda: files.orphans(own))
    except SPILL_ERRORS as exc:
        logger.debug("looking for orphaned spill files of %r failed: %s", link.path, exc)
        return 0
    adopted = 0
    for index, orphan in enumerate(orphans):
        if not link.usable():
            for other in orphans[index:]:
                await _release(link, other)
            break
        adopted += await _adopt_one(link, orphan)
    link.counters.adopted_total += adopted
    return adopted


async def _release(link: SpillLink, orphan: SpillFile) -> None:
    try:
        await link.job(orphan.close)
    except SPILL_ERRORS as exc:
        logger.debug("closing spill file %r failed: %s", orphan.path, exc)


async def _drop_orphan(link: SpillLink, orphan: SpillFile, exc: BaseException) -> None:
    files = link.files
    assert files is not None
    if is_corruption(exc):
        try:
            await link.job(lambda: files.set_aside_orphan(orphan, exc))
            return
        except SPILL_ERRORS as error:
            logger.debug("setting spill file %r aside failed: %s", orphan.path, error)
    await _release(link, orphan)


async def _keep_and_supersede(
    link: SpillLink, orphan: SpillFile, rows: list[RowInfo]
) -> tuple[list[RowInfo], dict[int, Slot], int]:
    """Which of an orphan's waiting ``rows`` to keep: ``(kept rows, the buffer's own waiting
    entries they replace, how many rows were superseded)``.

    Of the orphan's writes of a key the newest is kept. Where this process also wrote the key
    directly or holds a write of it, the logical times of the calls decide (see
    :func:`_orphan_wins`): the orphan may be a worker that ran beside this one, so its writes are
    not older for being adopted."""
    held: HeldIndex = link.held
    slots = {row.seq: (row.method, index_key_of_canonical(row.key)) for row in rows if row.key is not None}
    newest: dict[Slot, RowInfo] = {}
    for row in rows:
        slot = slots.get(row.seq)
        if slot is not None:
            best = newest.get(slot)
            if best is None or (row.generation, row.stamp) >= (best.generation, best.stamp):
                newest[slot] = row
    contested = {slot for slot in newest if slot in held.recent or held.keys.get(slot)}
    theirs: dict[int, DeadLetter] = {}
    ours: dict[int, DeadLetter] = {}
    if contested:
        wanted = [newest[slot].seq for slot in contested]
        theirs = {entry.seq: entry for entry in await link.job(lambda: orphan.fetch(wanted))}
        own = [seq for slot in contested for seq in held.keys.get(slot, {})]
        ours = {entry.seq: entry for entry in await link.load(own)} if own else {}
    keep: list[RowInfo] = []
    victims: dict[int, Slot] = {}
    superseded = 0
    for row in rows:
        slot = slots.get(row.seq)
        if slot is not None:
            if newest[slot] is not row:
                superseded += 1
                continue
            if slot in contested:
                verdict = _orphan_wins(held, slot, row, theirs.get(row.seq), ours)
                if verdict is None:
                    superseded += 1
                    continue
                victims.update(dict.fromkeys(verdict, slot))
        keep.append(row)
    return keep, victims, superseded


def _written_at(entry: DeadLetter | None) -> int | None:
    """The logical time a held write kept of its call (``None`` when unknown)."""
    if entry is None:
        return None
    kwargs = entry.call.get("kwargs")
    return kept_write_time(kwargs.get(WRITE_TIME_ARGUMENT)) if isinstance(kwargs, dict) else None


def _orphan_wins(
    held: HeldIndex, slot: Slot, row: RowInfo, theirs: DeadLetter | None, ours: dict[int, DeadLetter]
) -> list[int] | None:
    """Whether the orphan's newest write ``row`` of ``slot`` is newer than what this process wrote
    directly or holds of the key: ``None`` when it is not (superseded), else the buffer's own
    waiting entries of the key it replaces.

    A write the backend orders by its own data (a task's ``updated_at``) is kept beside this
    process's. Otherwise, with a logical time on both sides the later call wins, an equal time
    this process's. Without (a write held before logical times existed, a direct write whose time
    was not noted), as before them: a write of this process, of its own run, wins; an own write of
    an earlier run loses to an orphan's enqueued later."""
    if slot[0] in _ORDERED_BY_DATA:
        return []  # kept beside this process's writes of the key: the backend orders them
    their_time = _written_at(theirs)
    if slot in held.recent:
        direct = held.recent_times.get(slot)
        if their_time is None or direct is None or direct >= their_time:
            return None
    waiting = held.keys.get(slot)
    if not waiting:
        return []
    times = [_written_at(ours.get(seq)) for seq in waiting]
    if their_time is not None and None not in times:
        return list(waiting) if their_time > max(time for time in times if time is not None) else None
    if any(generation == held.generation for generation, _ in waiting.values()):
        return None
    if all(seq in ours for seq in waiting):
        return list(waiting) if max(ours[seq].enqueued_at for seq in waiting) < row.enqueued_at else None
    return []


async def _adopt_one(link: SpillLink, orphan: SpillFile) -> int:
    spill, held = link.spill, link.held
    assert spill is not None

    def read() -> tuple[list[RowInfo], list[int]]:
        orphan.check_all()  # rows that cannot be read go to its quarantine table, copied with it
        return list(orphan.index_rows()), orphan.parked_seqs()

    try:
        rows, parked_seqs = await link.job(read)
    except SPILL_ERRORS as exc:
        link.collect_set_aside(orphan, adopted_from=orphan.path)
        await _drop_orphan(link, orphan, exc)
        return 0
    link.collect_set_aside(orphan, adopted_from=orphan.path)
    keep, victims, superseded = await _keep_and_supersede(link, orphan, rows)
    renumbered: dict[int, int] = {}
    for old in sorted([row.seq for row in keep] + parked_seqs):
        renumbered[old] = held.next_seq
        held.next_seq += 1
    pending_map = {row.seq: renumbered[row.seq] for row in keep}
    parked_map = {seq: renumbered[seq] for seq in parked_seqs}
    try:
        result = await link.job(
            lambda: spill.take_over(
                orphan,
                pending_map,
                parked_map,
                delete=list(victims),
                max_bytes=link.config.max_disk_bytes,
            )
        )
    except SourceReadError as exc:
        await _drop_orphan(link, orphan, exc.__cause__ or exc)
        return 0
    except SpillCapError:
        # Its writes stay in the orphan's file, adopted once this file has the room.
        await _release(link, orphan)
        logger.warning(
            "dead-letter buffer of store %r leaves %r for later: its writes do not fit under "
            "max_disk_bytes=%d now",
            link.store_name,
            orphan.path,
            link.config.max_disk_bytes,
            extra={"event": "deadletter_adoption_deferred", "store": link.store_name, "path": orphan.path},
        )
        return 0
    except SPILL_ERRORS as exc:
        await _release(link, orphan)
        await link.spill_failed(exc)
        return 0
    for row in keep:
        held.index_row(RowInfo(pending_map[row.seq], row.method, row.key, row.scope, row.stamp, 0, row.size))
    link.counters.superseded(superseded + link.apply_write(result))
    pid = orphan.previous_pid
    try:
        await link.job(orphan.remove)
    except SPILL_ERRORS as exc:
        logger.warning(
            "adopted spill file %r could not be removed (%s): its writes may be replayed twice",
            orphan.path,
            exc,
            extra={"event": "deadletter_orphan_not_removed", "store": link.store_name},
        )
    logger.warning(
        "dead-letter buffer of store %r adopted %d waiting and %d parked write(s) from %r, left by a "
        "process that is gone%s (%d superseded)",
        link.store_name,
        len(keep),
        len(parked_seqs),
        orphan.path,
        "" if pid is None else f" (pid {pid})",
        superseded,
        extra={
            "event": "deadletter_adopted",
            "store": link.store_name,
            "path": orphan.path,
            "adopted": len(keep),
            "parked": len(parked_seqs),
            "superseded": superseded,
        },
    )
    return len(keep) + len(parked_seqs)


__all__ = ["adopt_if_usable", "adopt_orphans"]
