"""Parking: writes refused as bad data are kept with their reason, never replayed automatically
(until an operator unparks them). In the spill file's ``parked`` table, or in memory while it is
unavailable; one the file has no room for under its byte cap is not kept (counted as refused)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..codec import JSONObject
from ..errors import InvalidPayloadError
from .calls import encode_call
from .entries import DeadLetter, ParkedWrite, readable_text
from .held import slot_of
from .spill import SpillCapError, dumps
from .spill_link import SPILL_ERRORS, SpillLink
from .telemetry import REFUSE_DISK_CAP


def parkable(
    method: str, args: Sequence[Any], kwargs: Any, reason: str
) -> tuple[str, JSONObject | None, int, str]:
    """``(method, encoded call, its size, reason)`` of a write to park; when the call cannot be
    encoded only the reason is kept (the call is then ``None``)."""
    call: JSONObject | None
    reason = readable_text(str(reason))
    try:
        call = encode_call(method, tuple(args), kwargs)
        size = len(dumps(call).encode("utf-8"))
    except InvalidPayloadError as exc:
        call, size = None, 0
        detail = readable_text(str(exc))
        if not reason:
            reason = detail
        elif detail not in reason:
            reason = f"{reason} (call not kept: {detail})"
    return readable_text(method), call, size, reason


class Parking:
    """Parks writes of one buffer (see the module docs); every method runs under its lock."""

    def __init__(self, link: SpillLink, clock: Callable[[], float]) -> None:
        self.link = link
        self.clock = clock

    async def park_new(self, method: str, call: JSONObject | None, size: int, reason: str) -> ParkedWrite:
        """Park a write that never waited (the guard refused it as bad data)."""
        link, held = self.link, self.link.held
        await link.prepare(create=True)
        parked = ParkedWrite(
            seq=held.next_seq,
            method=method,
            call=call,
            reason=reason[:2000],
            parked_at=self.clock(),
            size=size,
        )
        held.next_seq += 1
        spill = link.spill
        kept = False
        if spill is not None and link.usable():
            try:
                result = await link.job(lambda: spill.park([parked], max_bytes=link.config.max_disk_bytes))
            except SpillCapError:
                link.refusal([method], REFUSE_DISK_CAP)  # nothing kept is evicted for it
                return parked
            except SPILL_ERRORS as exc:
                await link.spill_failed(exc)
            else:
                link.apply_write(result)
                kept = True
        if not kept:
            held.hold_parked(parked)
            await link.flush_or_enforce()
        link.counters.parked(method)
        return parked

    async def park_waiting(self, entry: DeadLetter, reason: str, epoch: int) -> bool:
        """Park a waiting entry the backend refused; ``False`` when it no longer waits."""
        link, held = self.link, self.link.held
        if entry.seq not in held.volatile and (
            epoch != held.epoch or not held.still_waiting(entry, has_file=link.spill is not None)
        ):
            return False
        reason = readable_text(reason)[:2000]
        now = self.clock()
        slot = slot_of(entry)
        spill = link.spill
        if entry.seq not in held.volatile and spill is not None and link.usable():
            try:
                result = await link.job(lambda: spill.park_pending(entry.seq, reason=reason, parked_at=now))
            except SPILL_ERRORS as exc:
                await link.spill_failed(exc)
                if held.epoch != epoch:
                    return await self.park_waiting(entry, reason, held.epoch)
            else:
                if not link.apply_write(result):
                    return False
                link.counters.parked(entry.method)
                return True
        if entry.seq in held.volatile:
            held.forget(entry.seq, entry.method, slot, entry.scope)
        else:
            held.defer_delete(entry.seq, slot)
        held.hold_parked(ParkedWrite(entry.seq, entry.method, entry.call, reason, now, entry.size))
        await link.flush_or_enforce()
        link.counters.parked(entry.method)
        return True


__all__ = ["Parking", "parkable"]
