"""Last-write-wins keys of a dead-letter buffer: a successful direct write of a key makes its older
waiting writes stale (they are dropped, never replayed over newer data), and a dead-lettered
planner state can be taken out instead of replayed."""

from __future__ import annotations

from collections.abc import Sequence

from .entries import DeadLetter
from .gate import Slot
from .held import HeldIndex
from .spill_link import SPILL_ERRORS, SpillLink


def note_direct_write(
    held: HeldIndex, slot: Slot, stamp: int, *, remember: int, logical_time: int | None = None
) -> None:
    """A direct write of ``slot`` with call stamp ``stamp`` (and ``logical_time``, when known)
    succeeded: remember it (the latest ``remember`` keys), so an older write of the key that fails
    afterwards is discarded, and an orphan's write of it adopted later is compared with it."""
    recent = held.recent
    if recent.get(slot, stamp - 1) < stamp:
        recent[slot] = stamp
        recent.move_to_end(slot)
        times = held.recent_times
        if logical_time is None:
            times.pop(slot, None)
        else:
            times[slot] = logical_time
        if len(recent) > remember:
            forgotten, _ = recent.popitem(last=False)
            times.pop(forgotten, None)


async def drop_stale(link: SpillLink, slot: Slot, stamp: int) -> int:
    """(Under the lock.) Drop the waiting writes of ``slot`` older than a direct write with call
    stamp ``stamp`` of this process; returns how many were dropped (counted as superseded)."""
    held = link.held
    waiting = held.keys.get(slot)
    position = (held.generation, stamp)
    stale = [seq for seq, other in (waiting or {}).items() if other < position]
    if not stale:
        return 0
    removed = await remove_waiting(link, slot, stale)
    link.counters.superseded(removed)
    return removed


async def take_newest(link: SpillLink, slot: Slot) -> DeadLetter | None:
    """(Under the lock.) Remove every waiting write of ``slot`` and return the newest."""
    seqs = sorted(link.held.keys.get(slot, {}))
    if not seqs:
        return None
    found = await link.load([seqs[-1]])
    removed = await remove_waiting(link, slot, seqs)
    link.counters.superseded(max(0, removed - 1))
    return found[0] if found else None


async def remove_waiting(link: SpillLink, slot: Slot, seqs: Sequence[int]) -> int:
    """(Under the lock.) Remove waiting entries of ``slot``; returns how many were there."""
    held = link.held
    removed = 0
    in_file: list[int] = []
    for seq in seqs:
        entry = held.volatile.get(seq)
        if entry is not None:
            held.forget(seq, entry.method, slot, entry.scope)
            removed += 1
        elif seq in held.keys.get(slot, {}):
            in_file.append(seq)
    if not in_file:
        return removed
    spill = link.spill
    if spill is not None and link.usable():
        try:
            result = await link.job(lambda: spill.delete(in_file))
        except SPILL_ERRORS as exc:
            for seq in in_file:
                held.defer_delete(seq, slot)
            await link.spill_failed(exc)
            return removed + len(in_file)
        return removed + link.apply_write(result)
    for seq in in_file:
        held.defer_delete(seq, slot)
    return removed + len(in_file)


__all__ = ["drop_stale", "note_direct_write", "remove_waiting", "take_newest"]
