"""An operator's maintenance of a dead-letter buffer: unparking parked writes (once the cause was
fixed) and purging waiting, parked or quarantined writes. Both run under the buffer's lock."""

from __future__ import annotations

from collections import OrderedDict

from .entries import DeadLetter
from .held import HeldIndex
from .spill import RowInfo, WriteResult
from .spill_link import SPILL_ERRORS, SpillLink


async def unpark(link: SpillLink, limit: int | None) -> int:
    """(Under the lock.) Move parked writes that kept their call back to the waiting writes;
    returns how many."""
    held = link.held
    await link.prepare(create=False)
    moved = _unpark_memory(held, limit)
    left = None if limit is None else limit - moved
    spill = link.spill
    if spill is not None and link.usable() and (left is None or left > 0):

        def move() -> tuple[WriteResult, list[RowInfo]]:
            result = spill.unpark(left)
            return result, list(spill.index_rows())

        try:
            result, rows = await link.job(move)
        except SPILL_ERRORS as exc:
            await link.spill_failed(exc)
        else:
            before = held.depth
            held.reindex(rows)
            held.apply_totals(result.totals)
            held.epoch += 1
            moved += held.depth - before
    if moved and link.usable() and held.volatile:
        await link.flush()
    return moved


def _unpark_memory(held: HeldIndex, limit: int | None) -> int:
    movable = [parked for parked in held.parked_memory.values() if parked.call is not None]
    if limit is not None:
        movable = movable[:limit]
    for parked in movable:
        assert parked.call is not None
        del held.parked_memory[parked.seq]
        held.parked_memory_bytes -= parked.size
        held.remember(
            DeadLetter(
                seq=parked.seq,
                method=parked.method,
                call=parked.call,
                key=None,
                scope=None,
                stamp=0,
                enqueued_at=parked.parked_at,
                size=parked.size,
                error="unparked: " + parked.reason,
            ),
            None,
        )
    if movable:
        held.volatile = OrderedDict(sorted(held.volatile.items()))
        held.epoch += 1
    return len(movable)


async def purge(link: SpillLink, *, pending: bool, parked: bool, quarantined: bool) -> int:
    """(Under the lock.) Delete every waiting and/or parked write, and/or the quarantined rows of
    the spill file; returns how many were deleted."""
    held = link.held
    await link.prepare(create=False)
    removed = 0
    spill = link.spill
    file_purged = spill is None
    if spill is not None and link.usable():
        try:
            removed += await link.job(
                lambda: spill.purge(pending=pending, parked=parked, quarantined=quarantined)
            )
            held.apply_totals(await link.job(spill.totals))
            file_purged = True
        except SPILL_ERRORS as exc:
            await link.spill_failed(exc)
    if pending:
        removed += len(held.volatile)
        if file_purged:
            held.clear_waiting()
        else:
            for entry in list(held.volatile.values()):
                held.forget_entry(entry)
        held.epoch += 1
    if parked:
        removed += len(held.parked_memory)
        held.clear_parked_memory()
    return removed


__all__ = ["purge", "unpark"]
