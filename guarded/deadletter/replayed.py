"""What a replay pass removes: the writes the backend took (counted as replayed, even when the
pass is cancelled meanwhile), and a recount when the file holds fewer waiting writes than counted."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .entries import DeadLetter
from .held import slot_of
from .spill_link import SPILL_ERRORS, SpillLink

logger = logging.getLogger("guarded.deadletter")


async def remove_replayed(
    link: SpillLink, entries: Sequence[DeadLetter], epoch: int, *, superseded: bool = False
) -> int:
    """The backend took ``entries`` (``superseded``: left them alone, as its rows hold newer
    writes): remove (and count) those still waiting; returns how many."""
    held = link.held

    async def op() -> list[DeadLetter]:
        done = await removed()
        # Counted here, inside the operation: it completes even when the replaying task is
        # cancelled meanwhile (a drain stops a background pass), so no replay goes uncounted.
        if superseded:
            link.counters.superseded(len(done))
            for entry in done:
                logger.info(
                    "a replayed %s was older than what the backend holds: superseded, not applied",
                    entry.method,
                    extra={"store": link.counters.store_name, "method": entry.method},
                )
            return done
        for entry in done:
            link.counters.replayed(entry.method)
        return done

    async def removed() -> list[DeadLetter]:
        done: list[DeadLetter] = []
        in_file: list[DeadLetter] = []
        for entry in entries:
            if entry.seq in held.volatile:
                held.forget_entry(entry)
                done.append(entry)
            elif epoch == held.epoch:
                in_file.append(entry)
        if not in_file:
            return done
        spill = link.spill
        if spill is not None and link.usable():
            seqs = [entry.seq for entry in in_file]
            try:
                result = await link.job(lambda: spill.delete(seqs))
            except SPILL_ERRORS as exc:
                done.extend(_defer_replayed(link, in_file))
                await link.spill_failed(exc)
            else:
                deleted = {row.seq for row in result.deleted}
                link.apply_write(result)
                done.extend(entry for entry in in_file if entry.seq in deleted)
        elif spill is not None:
            done.extend(_defer_replayed(link, in_file))
        return done

    return len(await link.mutate(op))


def _defer_replayed(link: SpillLink, entries: Sequence[DeadLetter]) -> list[DeadLetter]:
    done: list[DeadLetter] = []
    for entry in entries:
        if not link.held.still_waiting(entry, has_file=link.spill is not None):
            continue
        link.held.defer_delete(entry.seq, slot_of(entry))
        done.append(entry)
    return done


async def resync(link: SpillLink) -> None:
    """The file holds no waiting write but the count says some wait (rows that could not be
    read and were set aside while counted): count again from the file."""
    held = link.held

    async def op() -> None:
        spill = link.spill
        if spill is None or not link.usable() or held.volatile or held.pending_deletes:
            return
        try:
            rows = await link.job(lambda: list(spill.index_rows()))
            totals = await link.job(spill.totals)
        except SPILL_ERRORS as exc:
            link.read_failed(spill, exc)
            return
        if held.depth != len(rows):
            logger.warning(
                "dead-letter buffer of store %r counted %d waiting write(s), its spill file holds %d: "
                "counted again",
                link.store_name,
                held.depth,
                len(rows),
                extra={"event": "deadletter_recounted", "store": link.store_name},
            )
            held.reindex(rows)
            held.epoch += 1
        held.apply_totals(totals)

    await link.mutate(op)


__all__ = ["remove_replayed", "resync"]
