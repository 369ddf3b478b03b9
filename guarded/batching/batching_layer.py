"""Batching layer: append-only writes (policy ``batch``) go through the guard's
:class:`~guarded.batching.batcher.Batcher`, coalesced with concurrent writes of their method into
bulk writes.

Group commit (``ack="commit"``, the default): the caller returns once the batch holding its write
is committed, to the backend (outcome ``ok``) or to the dead-letter buffer when the backend cannot
take it (``dead_lettered``); bad data is parked (``rejected``); a write neither could take is
``refused`` (:class:`~guarded.errors.WriteNotKeptError`), each caller of a batch answered for its
own write, within its deadline: a spill-file commit that cannot finish in time refuses the write
(:func:`guarded.deadletter.buffer.commit_deadline`). Write-behind (``ack="enqueue"``, an explicit
opt-in): the caller returns once the write is queued.

Legacy aliases share their target's queue (``save_task_update`` is written as ``save_update``), so
reads of the target and of its alias see them (read-your-writes). A full queue makes the caller
wait, up to its deadline; then the write is dead-lettered: memory stays bounded, nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeAlias

from ..backend import ITEM_KEYS
from ..deadletter.buffer_ports import HeldWriteKeeper, Lifecycle
from ..errors import WriteNotKeptError, WriteRefusedError
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Step, StepLayer
from ..policy import MethodPolicy
from .batcher import ALONE, QUEUED, Batcher, PendingWrite


class WriteQueue:
    """The batcher, as the batching and read layers see it."""

    __slots__ = (
        "flush_scope",
        "kept_kwargs",
        "offer",
        "pending_for_scope",
        "runs_as_called",
        "submit",
        "write_alone",
    )

    def __init__(self, batcher: Batcher, kept_kwargs: Callable[[PendingWrite], Mapping[str, Any]]) -> None:
        self.submit: Callable[..., Awaitable[bool]] = batcher.submit
        """``submit(write, deadline=...)``: queue ``write``; ``False`` when no room came in time."""
        self.offer: Callable[[PendingWrite], int] = batcher.offer
        """``offer(write)``: queue ``write`` without waiting; ``QUEUED``, ``ALONE`` (then await
        ``write_alone(method)`` at once) or ``NO_ROOM`` (then ``submit`` it)."""
        self.write_alone: Callable[..., Awaitable[Outcome | None]] = batcher.write_alone
        """``write_alone(method, started=None)``: write the lone write :attr:`offer` answered
        ``ALONE`` for, in the caller's task (``started``: the caller's own call of it, when
        :attr:`runs_as_called`); the awaitable answers the write's outcome."""
        self.runs_as_called: Callable[[str], bool] = batcher.runs_as_called
        """Whether a lone write of a method goes to the backend as the call its caller made, so
        the caller's call may carry it through the layers below (no second call of the guard's)."""
        self.flush_scope: Callable[[str, str], Awaitable[None]] = batcher.flush_scope
        """Write out what waits for one trace or session (before a read of it)."""
        self.pending_for_scope: Callable[[str, str], list[PendingWrite]] = batcher.pending_for_scope
        """The writes of a method waiting for one trace or session."""
        self.kept_kwargs = kept_kwargs
        """The arguments a batched write is held with when the queue has no room for it."""

    @staticmethod
    def takes(policy: MethodPolicy) -> bool:
        """Whether the queue takes the calls of ``policy``'s method (they never reach the layers
        that hold single writes: a failed batch is held by the owner)."""
        return policy.batch


class BatchingPorts(Protocol):
    """What the batching layer receives of the guard's durability."""

    @property
    def lifecycle(self) -> Lifecycle: ...

    @property
    def next_stamp(self) -> Callable[[], int]: ...

    @property
    def queue(self) -> WriteQueue | None: ...

    @property
    def keeper(self) -> HeldWriteKeeper | None: ...


class BatchingLayer(StepLayer):
    """Hands batch-eligible writes to the guard's batcher (group commit or write-behind)."""

    def __init__(self, ports: BatchingPorts) -> None:
        self._lifecycle = ports.lifecycle
        self._queue = ports.queue
        self._keeper = ports.keeper
        self._next_stamp = ports.next_stamp

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        """Nothing for a method the queue does not take. For a batched write this layer ends the
        call (the batcher writes it) -- for a group-commit write queued behind a running flush,
        the caller awaits the write's own future, with no frame of its own -- and settles the
        write's outcome."""
        steps = self._steps(method, inner)
        if steps is None:
            return None
        enqueued, settle = steps
        return Step(run=enqueued, ok=settle)

    def _steps(self, method: MethodSetup, inner: Service) -> _Steps | None:
        """The two steps of a batched write of ``method`` (``None`` when the queue does not take
        it): handing the call's write to the batcher, which returns what to await for the
        batcher's verdict (its outcome, ``None`` once settled), and the caller's answer to it.
        A lone write that is exactly its caller's call goes to the backend as that call, through
        ``inner`` (the layers below: breaker, retry, bulkhead, timeout)."""
        queue, keeper = self._queue, self._keeper
        policy = method.policy
        if queue is None or keeper is None or not queue.takes(policy):
            return None
        name = policy.alias_of or policy.name
        scope_of = policy.scope_key
        next_stamp = self._next_stamp
        offer, write_alone, submit = queue.offer, queue.write_alone, queue.submit
        lifecycle = self._lifecycle
        is_open, ensure_open = lifecycle.is_open, lifecycle.ensure_open
        hold, kept_kwargs = keeper.hold, queue.kept_kwargs
        commit = method.settings.ack == "commit"
        as_called = policy.alias_of is None and queue.runs_as_called(name)
        item_keys_now = ITEM_KEYS.get
        ok, rejected, dead_lettered = Outcome.OK, Outcome.REJECTED, Outcome.DEAD_LETTERED
        refused = Outcome.REFUSED

        async def finish(call: Call, write: PendingWrite, offered: int) -> Outcome | None:
            # Group commit, leader style: when no flush of the method runs, the caller writes its
            # own write at once in its own task (no flush task, no loop iteration); otherwise the
            # write joins the next batch and the caller waits for that batch's commit.
            if offered == ALONE:
                await write_alone(name)
                queued = True
            else:
                queued = offered == QUEUED or await submit(write, deadline=call.deadline)
            if queued:
                done = write.done
                return None if done is None else await done
            kept = await hold(
                name,
                call.args,
                kept_kwargs(write),
                key=None,
                scope=write.scope,
                stamp=write.stamp,
                error="queue_full",
                deadline=call.deadline,
            )
            call.settle(dead_lettered if kept else rejected)
            return None

        def settle(call: Call, outcome: Outcome | None) -> None:
            if outcome is None or outcome is ok:
                return None
            if outcome is rejected:
                raise WriteRefusedError(
                    f"{name}: the backend refused the write; it is parked with its reason "
                    "(guarded dlq list --parked)"
                )
            if outcome is refused:
                raise WriteNotKeptError(
                    "the backend did not take the write and the dead-letter buffer had no room for it "
                    "(see the deadletter_refused log record)",
                    method=name,
                )
            call.settle(outcome)
            return None

        async def opened_first(call: Call) -> Outcome | None:
            await ensure_open()
            return await enqueued(call)

        def enqueued(call: Call) -> Awaitable[Outcome | None]:
            if not (lifecycle.opened or is_open()):
                return opened_first(call)
            args, kwargs = call.args, call.kwargs
            scope = scope_of(args, kwargs) if scope_of is not None else None
            done = call.loop.create_future() if commit else None
            write = PendingWrite(
                name,
                args,
                kwargs,
                scope if isinstance(scope, str) else None,
                next_stamp(),
                call.started,
                done,
                call.deadline,
            )
            offered = offer(write)
            if done is not None:
                # Awaited by the caller as they are, no frame of ours: the write's own future, or
                # the lone write's flush in the caller's task, which answers the write's outcome.
                if offered == QUEUED:
                    return done
                if offered == ALONE:
                    if as_called and item_keys_now() is None:
                        return write_alone(name, inner(call))
                    return write_alone(name)
            return finish(call, write, offered)

        return enqueued, settle


_Steps: TypeAlias = tuple[
    Callable[[Call], Awaitable["Outcome | None"]],
    Callable[[Call, "Outcome | None"], None],
]
