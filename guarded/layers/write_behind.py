"""Write-behind layer: append-only writes (policy ``batch``) are queued and acknowledged at once;
the batcher writes them in bulk and dead-letters what fails.

A full queue makes the caller wait, up to its deadline; then the write is dead-lettered
(outcome ``dead_lettered``) — memory stays bounded and nothing is dropped.
"""

from __future__ import annotations

from typing import Any

from ..batching import PendingWrite
from ..call import Call, MethodSetup, Service
from ..durability import Durability
from ..outcome import Outcome


class WriteBehindLayer:
    """Hands batch-eligible writes to the guard's :class:`~guarded.batching.Batcher`."""

    def __init__(self, durability: Durability) -> None:
        self._durability = durability

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        durability = self._durability
        batcher = durability.batcher
        policy = method.policy
        if batcher is None or not policy.batch:
            return inner
        name = policy.name
        scope_of = policy.scope_key
        next_stamp = durability.next_stamp
        submit = batcher.submit

        async def write_behind(call: Call) -> Any:
            if not durability.opened:
                await durability.open()
            scope = scope_of(call.args, call.kwargs) if scope_of is not None else None
            write = PendingWrite(
                name,
                call.args,
                call.kwargs,
                scope if isinstance(scope, str) else None,
                next_stamp(),
                call.loop.time(),
            )
            if await submit(write, deadline=call.deadline):
                return None
            kept = await durability.dead_letter(
                name,
                call.args,
                durability.kept_kwargs(write),
                key=None,
                scope=write.scope,
                stamp=write.stamp,
                error="queue_full",
            )
            call.outcome = Outcome.DEAD_LETTERED if kept else Outcome.REJECTED
            return None

        return write_behind
