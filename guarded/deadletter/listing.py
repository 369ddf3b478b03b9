"""Reading what a dead-letter buffer holds: waiting writes in order, those of one scope, parked
writes and quarantined rows, from memory and the spill file together; and decoding a held call."""

from __future__ import annotations

import logging

from ..codec import RecordTypes
from ..errors import InvalidPayloadError
from .calls import decode_call
from .entries import DeadLetter, ParkedWrite
from .replay import Call
from .spill import QuarantinedRow
from .spill_link import SpillLink

logger = logging.getLogger("guarded.deadletter")


def decode_entry(entry: DeadLetter, types: RecordTypes, store_name: str) -> Call | None:
    """The decoded call of a waiting entry; ``None`` (logged) when it cannot be decoded."""
    try:
        return decode_call(entry.method, entry.call, types)
    except InvalidPayloadError as exc:
        logger.error(
            "dead-letter entry %d of store %r cannot be decoded: %s",
            entry.seq,
            store_name,
            exc.reason,
            extra={"event": "deadletter_undecodable", "store": store_name, "method": entry.method},
        )
        return None


async def waiting_page(link: SpillLink, after: int, limit: int | None) -> list[DeadLetter]:
    """Waiting entries after ``after`` in order: the file's and the memory-only ones."""
    held, spill = link.held, link.spill
    found: list[DeadLetter] = []
    if spill is not None:
        read = await link.read(lambda: spill.page(after, limit), None)
        if read is None:  # the file cannot be read: what memory holds of it
            found = [entry for seq, entry in held.memory.items() if seq > after]
        elif held.pending_deletes:
            found = [entry for entry in read if entry.seq not in held.pending_deletes]
        else:
            found = read
    volatile = [entry for seq, entry in held.volatile.items() if seq > after]
    if volatile:
        merged = {entry.seq: entry for entry in found}
        merged.update((entry.seq, entry) for entry in volatile)
        found = sorted(merged.values(), key=lambda entry: entry.seq)
    return found if limit is None else found[:limit]


async def waiting_in_scope(link: SpillLink, method: str, scope: str) -> list[DeadLetter]:
    """The waiting entries of ``method`` in ``scope``, oldest first (no file access when memory
    holds them all)."""
    held = link.held
    found = held.scopes.get((method, scope))
    if found is None or found.total <= 0:
        return []
    in_memory = [entry for seq in list(found.held) if (entry := held.held_entry(seq)) is not None]
    spill = link.spill
    if len(found.held) >= found.total or spill is None:
        return sorted(in_memory, key=lambda entry: entry.seq)
    no_entries: list[DeadLetter] = []
    merged = {
        entry.seq: entry
        for entry in await link.read(lambda: spill.for_scope(method, scope), no_entries)
        if entry.seq not in held.pending_deletes
    }
    merged.update((entry.seq, entry) for entry in in_memory if entry.seq in held.volatile)
    return sorted(merged.values(), key=lambda entry: entry.seq)


async def parked_writes(link: SpillLink, limit: int | None) -> list[ParkedWrite]:
    """Parked writes, oldest first, at most ``limit``."""
    spill = link.spill
    found: list[ParkedWrite] = []
    if spill is not None:
        found = await link.read(lambda: spill.parked(limit), found)
    if link.held.parked_memory:
        found = sorted([*found, *link.held.parked_memory.values()], key=lambda write: write.seq)
    return found if limit is None else found[:limit]


async def quarantined_rows(link: SpillLink, limit: int | None, *, with_raw: bool) -> list[QuarantinedRow]:
    """Rows of the spill file moved to its quarantine table, oldest first, at most ``limit``."""
    spill = link.spill
    found: list[QuarantinedRow] = []
    if spill is None:
        return found
    return await link.read(lambda: spill.quarantined(limit, with_raw=with_raw), found)


__all__ = ["decode_entry", "parked_writes", "quarantined_rows", "waiting_in_scope", "waiting_page"]
