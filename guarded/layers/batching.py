"""Batching layer: append-only writes (policy ``batch``) go through the guard's
:class:`~guarded.durability.batching.Batcher`, coalesced with concurrent writes of their method into
bulk writes.

Group commit (``ack="commit"``, the default): the caller returns once the batch holding its write
is committed, to the backend (outcome ``ok``) or to the dead-letter buffer when the backend cannot
take it (``dead_lettered``); bad data is parked (``rejected``). Write-behind (``ack="enqueue"``, an
explicit opt-in): the caller returns once the write is queued.

Legacy aliases share their target's queue (``save_task_update`` is written as ``save_update``), so
reads of the target and of its alias see them (read-your-writes). A full queue makes the caller
wait, up to its deadline; then the write is dead-lettered: memory stays bounded, nothing is dropped.
"""

from __future__ import annotations

from typing import Any

from ..durability.batching import ALONE, QUEUED, PendingWrite
from ..durability.ports import DurabilityPorts
from ..errors import WriteRefusedError
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.compiled import PASS, Hooks


class BatchingLayer:
    """Hands batch-eligible writes to the guard's batcher (group commit or write-behind)."""

    def __init__(self, ports: DurabilityPorts) -> None:
        self._lifecycle = ports.lifecycle
        self._queue = ports.queue
        self._keeper = ports.keeper
        self._next_stamp = ports.next_stamp

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        queue, keeper = self._queue, self._keeper
        policy = method.policy
        if queue is None or keeper is None or not queue.takes(policy):
            return inner
        name = policy.alias_of or policy.name
        scope_of = policy.scope_key
        next_stamp = self._next_stamp
        is_open, ensure_open = self._lifecycle.is_open, self._lifecycle.ensure_open
        offer, write_alone, submit = queue.offer, queue.write_alone, queue.submit
        hold, kept_kwargs = keeper.hold, keeper.kept_kwargs
        commit = method.settings.ack == "commit"
        ok, rejected = Outcome.OK, Outcome.REJECTED

        async def batched(call: Call) -> Any:
            if not is_open():
                await ensure_open()
            scope = scope_of(call.args, call.kwargs) if scope_of is not None else None
            write = PendingWrite(
                name,
                call.args,
                call.kwargs,
                scope if isinstance(scope, str) else None,
                next_stamp(),
                call.started,
                call.loop.create_future() if commit else None,
            )
            # Group commit, leader style: when no flush of the method runs, the caller writes its
            # own write at once in its own task (no flush task, no loop iteration); otherwise the
            # write joins the next batch and the caller waits for that batch's commit.
            offered = offer(write)
            if offered == ALONE:
                await write_alone(name)
                queued = True
            else:
                queued = offered == QUEUED or await submit(write, deadline=call.deadline)
            if queued:
                done = write.done
                if done is not None:
                    outcome = await done
                    if outcome is rejected:
                        raise WriteRefusedError(
                            f"{name}: the backend refused the write; it is parked with its reason "
                            "(guarded dlq list --parked)"
                        )
                    if outcome is not ok:
                        call.outcome = outcome
                return None
            kept = await hold(
                name,
                call.args,
                kept_kwargs(write),
                key=None,
                scope=write.scope,
                stamp=write.stamp,
                error="queue_full",
            )
            call.outcome = Outcome.DEAD_LETTERED if kept else Outcome.REJECTED
            return None

        return batched

    def hooks(self, method: MethodSetup) -> Hooks:
        """Nothing for a method the queue does not take; for a batched write this layer ends the
        call (the batcher writes it), so the compiled path awaits it in place of the backend."""
        queue = self._queue
        if queue is None or self._keeper is None or not queue.takes(method.policy):
            return PASS
        return Hooks(terminal=self.wrap(_unreachable, method))


def _unreachable(call: Call) -> Any:
    raise AssertionError("a batched write never reaches the layers inside the batching layer")
