"""Dead-letter layer: a write that finally fails is acknowledged and kept, not lost.

Retries exhausted, breaker open, timeout: the write goes to the dead-letter buffer (outcome
``dead_lettered``) and the caller returns normally. Bad data (the backend rejected it) is parked
with its reason and never retried; the caller sees outcome ``rejected``. So is a programming
error (a ``TypeError`` or ``AttributeError`` of the backend): parked, never held for replay, and
logged at ERROR. After a direct write succeeds, older held writes of the same last-write-wins key are
discarded, and a replay of the key already in flight finishes first
(:class:`~guarded.deadletter.gate.KeyGate`), so a replay can never overwrite newer data. Each
last-write-wins write carries the logical time of its call (:mod:`guarded.backend`), kept
with it when held, so a backend that opts in refuses a replay older than what another process
wrote since.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..backend import LOGICAL_TIMES as logical_times
from ..backend import current_logical_time
from ..error_classes import error_type, no_wait_fixes
from ..errors import WriteSupersededError
from ..logical_time import WRITE_TIME_ARGUMENT
from ..observability.failure_log import FailureLog
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Deferred, Step, StepLayer
from ..policy import MethodPolicy
from .buffer_ports import DirectWriteGate, HeldWriteKeeper, Lifecycle


class TakesWrites(Protocol):
    """The write queue, as far as this layer asks: whether it takes a method's writes."""

    def takes(self, policy: MethodPolicy) -> bool: ...


class DeadLetterPorts(Protocol):
    """What the dead-letter layer receives of the guard's durability."""

    @property
    def lifecycle(self) -> Lifecycle: ...

    @property
    def next_stamp(self) -> Callable[[], int]: ...

    @property
    def queue(self) -> TakesWrites | None: ...

    @property
    def keeper(self) -> HeldWriteKeeper | None: ...

    @property
    def gate(self) -> DirectWriteGate | None: ...


class DeadLetterLayer(StepLayer):
    """Keeps failed dead-letter-eligible writes (policy ``dead_letter``) that are not batched."""

    def __init__(self, ports: DeadLetterPorts, failure_log: FailureLog) -> None:
        self._lifecycle = ports.lifecycle
        self._keeper = ports.keeper
        self._gate = ports.gate
        self._queue = ports.queue
        self._next_stamp = ports.next_stamp
        self._log = failure_log

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        keeper, gate, queue = self._keeper, self._gate, self._queue
        policy = method.policy
        if keeper is None or gate is None or not policy.dead_letter:
            return None
        if queue is not None and queue.takes(policy):
            return None  # the write queue's owner holds what a batch could not write
        name = policy.name
        key_of, scope_of = policy.lww_key, policy.scope_key
        next_stamp = self._next_stamp
        lifecycle = self._lifecycle
        is_open, ensure_open = lifecycle.is_open, lifecycle.ensure_open
        hold, park = keeper.hold, keeper.park
        note_superseding, drop_superseded = keeper.note_superseding, keeper.drop_superseded
        slot_of, try_enter, wait_for_slot, leave = gate.slot, gate.try_enter, gate.enter, gate.leave
        set_time = logical_times.set
        log = self._log

        def opened(call: Call) -> Awaitable[None] | None:
            return None if lifecycle.opened or is_open() else ensure_open()

        def enter(call: Call) -> Awaitable[None] | None:
            if not (lifecycle.opened or is_open()):
                return opened_first(call)
            stamp = next_stamp()
            assert key_of is not None
            # The logical time of the call (the caller's, when it set one: a snapshot restore): the
            # backend refuses to let a write older than the row's replace it, so a replay of this
            # write never undoes a newer one.
            key = key_of(call.args, call.kwargs)
            slot = slot_of(name, key) if key is not None else None
            call.held = (stamp, slot, set_time((current_logical_time(),)), key)
            if slot is not None and not try_enter(slot, stamp):
                # A replay of the key is in flight: it finishes first.
                return entered_after(call, slot, stamp)
            return None

        async def opened_first(call: Call) -> None:
            await ensure_open()
            waiting = enter(call)
            if waiting is not None:
                await waiting

        async def entered_after(call: Call, slot: Any, stamp: int) -> None:
            try:
                await wait_for_slot(slot, stamp)
            except BaseException:
                _release_key((stamp, None, call.held[2], None), leave)
                call.held = None
                raise

        def give_back(call: Call) -> None:
            held = call.held
            call.held = None
            _release_key(held, leave)

        def written(call: Call, result: Any) -> Any:
            stamp, slot, _, _ = call.held
            # Even with nothing held: the buffer remembers the newest successful write of the key,
            # so an older write of it that fails later is discarded, not replayed.
            try:
                slot = None if slot is None else note_superseding(slot, stamp, current_logical_time())
            except BaseException:
                give_back(call)
                raise
            if slot is None:  # nothing of the key held: the usual case, no coroutine
                give_back(call)
                return result
            raise Deferred(dropped(call, slot, stamp, result))

        async def dropped(call: Call, slot: Any, stamp: int, result: Any) -> Any:
            try:
                await drop_superseded(slot, stamp)
            finally:
                give_back(call)
            return result

        def failed(call: Call, exc: BaseException) -> Any:
            if not isinstance(exc, Exception) and not _raised_by_store(exc):
                give_back(call)
                raise exc  # the caller's cancellation, KeyboardInterrupt, SystemExit
            if isinstance(exc, WriteSupersededError):
                give_back(call)
                raise exc  # the backend refused it as older: outcome refused, nothing to replay
            stamp, _, _, key = call.held
            raise Deferred(kept_key(call, exc, stamp, key))

        async def kept_key(call: Call, exc: BaseException, stamp: int, key: Any) -> Any:
            try:
                return await kept(call, exc, stamp, key)
            finally:
                give_back(call)

        def failed_keyless(call: Call, exc: BaseException) -> Any:
            if not isinstance(exc, Exception) and not _raised_by_store(exc):
                raise exc  # the caller's cancellation, KeyboardInterrupt, SystemExit
            if isinstance(exc, WriteSupersededError):
                raise exc  # the backend refused it as older: outcome refused, nothing to replay
            raise Deferred(kept(call, exc, next_stamp(), None))

        async def kept(call: Call, exc: BaseException, stamp: int, key: Any) -> Any:
            if no_wait_fixes(exc):
                # Bad data, or a bug of the backend's (a TypeError, an AttributeError): no wait
                # fixes it, so it is never held for replay; parked with its reason, it can be
                # replayed once the bug is fixed (guarded dlq replay --parked).
                await park(name, call.args, call.kwargs, exc)
                raise exc
            scope = scope_of(call.args, call.kwargs) if scope_of is not None else None
            times = logical_times.get()
            # Bounded by the call's deadline: a commit that cannot finish in time is a write
            # refused, never a call that waits for the disk.
            if not await hold(
                name,
                call.args,
                call.kwargs if times is None else {**call.kwargs, WRITE_TIME_ARGUMENT: times[0]},
                key=key,
                scope=scope if isinstance(scope, str) else None,
                stamp=stamp,
                error=error_type(exc),
                deadline=call.deadline,
            ):
                raise exc
            call.settle(Outcome.DEAD_LETTERED, exc)
            log.dead_lettered(method, exc)
            return None

        if key_of is None:
            return Step(enter=opened, failed=failed_keyless)
        return Step(enter=enter, ok=written, failed=failed)


def _release_key(held: tuple[int, Any, Any, Any], leave: Callable[[Any, int], None]) -> None:
    """Give back what a write took before the backend call (``Call.held``: its stamp, key slot,
    logical-time token and key): the logical time unset, the slot left."""
    stamp, slot, token, _ = held
    if token is not None:
        try:  # noqa: SIM105 - inline: suppress() costs a context manager per call
            logical_times.reset(token)
        except ValueError:  # outside the call's context: a closed loop's call collected as garbage
            pass
    if slot is not None:
        leave(slot, stamp)


def _raised_by_store(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``CancelledError`` the store raised on its own (an internal future of
    its driver was cancelled; the caller did not cancel): a failure of the write like any other,
    as the fallback layer sees it, so the write is held, not dropped behind a fallback answer."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is not None and not task.cancelling()
