"""Reads that see the guard's own writes, and answer during an outage (stale-if-error).

Driven by the policy table (``merge_from``, ``merge``, ``read_key``, ``value``):

* a read of a trace or session first flushes the batched writes of that scope, then adds the
  writes still held (queued or dead-lettered) to the backend's answer (read-your-writes);
* a single-value read (memory state, trajectory) answers the newest held write for its key;
* ``load_planner_state`` of a token whose save is still held in the dead-letter buffer first
  delivers that save to the backend (a replay: it loses to a newer save of another worker, and to
  the tombstone of a consume), takes it out of the buffer, and answers what the backend consumes:
  the backend is the truth whenever it can be reached (also when only the save could not reach
  it: the hold then waits for its replay). Only when neither reaches it is the held save answered
  (outcome ``stale``; never with ``answer_held_pauses=False``), and its consume held for replay;
  it leaves the buffer once a resume returned it, never with a resume that was cancelled;
* when the backend fails, the last value this process read or wrote for the key, plus what is
  held, is served with outcome ``stale``; with nothing to serve the failure goes on to the
  fallback layer.

Planner state is never served from the cache, only from the buffer: a token this process saved
directly is in the backend, and answering it from memory would let it be consumed twice.

The stale-if-error cache (:class:`StaleCache`) holds the last value this process read or wrote per
key, bounded (LRU).
When the backend fails, a read answers from here (outcome ``stale``) instead of an empty
default: without it an outage makes a planner load "no memory" and then save an empty memory
over the real one.

**Bounded in entries and in bytes.** Values are live Python objects (a ``load_history`` answer is
a list of event records), so their size is estimated by :func:`estimate_size`, a bounded
sampling walk (its error is described there). The least recently used values go first once
either ``max_entries`` or ``max_bytes`` is exceeded. A value estimated above an eighth of
``max_bytes`` (8 MiB by default) is not kept at all, and the older value of its key is dropped
with it: one huge answer (a 100,000-event history, ~49 MB of objects) would otherwise push out
every memory state, which is what the cache is for, and an older value than the last one read
is not served.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from sys import getsizeof
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..backend import MUST_BE_CURRENT
from ..deadletter.buffer_ports import HeldWriteLookups, WaitingCount
from ..durability.ports import DurabilityPorts
from ..error_classes import is_programming_error
from ..logical_time import WRITE_TIME_ARGUMENT, kept_write_time
from ..observability import telemetry_names as names
from ..observability.scrape_time_gauges import store_total_gauge
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.entry import is_hashable
from ..pipeline.steps import Deferred, Handled, Step, StepLayer
from ..policy import ArgGetter, Kind, Merge
from ..policy_table import PolicyTable

logger = logging.getLogger("guarded")


class StaleReadLayer(StepLayer):
    """Read-your-writes and stale-if-error for reads with a ``merge`` policy; keeps the cache
    up to date from the writes those reads see."""

    def __init__(
        self,
        ports: DurabilityPorts,
        policies: PolicyTable,
        *,
        cache: StaleCache | None,
        answer_held_pauses: bool = True,
        routes_reads: bool = False,
    ) -> None:
        self._ports = ports
        self._routes_reads = routes_reads
        """The backend may answer reads from a copy that lags: reads are marked while writes are held
        (:func:`~guarded.backend.read_must_be_current`)."""
        self._cache = cache
        self._policies = policies
        self._answer_held_pauses = answer_held_pauses
        self._turns: list[dict[Hashable, tuple[asyncio.Lock, list[int]]]] = []
        """The turns of each consume method's held tokens (:meth:`_take`)."""

    def moved(self) -> None:
        """The guard moved to a new event loop: a consume of the old one may hold a token's turn for
        good, and a turn's lock belongs to the loop it waited on. Every turn starts afresh."""
        for turns in self._turns:
            turns.clear()

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        policy = method.policy
        if policy.kind in (Kind.UPSERT, Kind.APPEND):
            remember = self._remembering(method)
            return None if remember is None else Step(ok=remember)
        if policy.merge is None or policy.merge_from is None:
            return None
        value_of = self._policies.get(policy.merge_from).value
        if value_of is None:
            return None
        if policy.merge is Merge.TAKE:
            return self._take(inner, policy.merge_from, policy.read_key, value_of)
        if policy.merge is Merge.LATEST:
            read = self._latest(policy.merge_from, policy.read_key, value_of)
        else:
            read = self._list(method, value_of)
        return self._marking_held(read) if self._routes_reads and read is not None else read

    def _marking_held(self, read: Step) -> Step:
        """``read``, marked one that must be current (:data:`~guarded.backend.MUST_BE_CURRENT`) while
        writes are held: their replay commits on the backend's primary, and a copy that lags would
        miss what the buffer no longer shows once the replay took them out."""
        lookups = self._ports.lookups
        if lookups is None:
            return read
        waiting = lookups.waiting
        enter, ok, failed = read.enter, read.ok, read.failed
        assert enter is not None
        assert ok is not None
        assert failed is not None
        mark, marked = MUST_BE_CURRENT.set, MUST_BE_CURRENT.get

        def marked_enter(call: Call) -> Any:
            entered = enter(call)
            if waiting.depth:
                mark(True)
            return entered

        def unmarked_ok(call: Call, result: Any) -> Any:
            if marked():
                mark(False)
            return ok(call, result)

        def unmarked_failed(call: Call, exc: BaseException) -> Any:
            if marked():
                mark(False)
            return failed(call, exc)

        return Step(enter=marked_enter, ok=unmarked_ok, failed=unmarked_failed)

    def _latest_answered(
        self, write: str, key_of: ArgGetter, value_of: ArgGetter
    ) -> Callable[[Call, Any], Any]:
        """What a single-value read answers once the backend answered it: a write of the key held
        meanwhile is newer than the backend's answer and is answered instead; the answer is kept
        for stale-if-error."""
        lookups, cache = self._ports.lookups, self._cache
        waiting = _waiting(lookups)

        def answered(call: Call, result: Any) -> Any:
            key = key_of(call.args, call.kwargs)
            if waiting.depth:
                raise Deferred(answered_over_held(key, result))
            remember(key, result)
            return result

        async def answered_over_held(key: Any, result: Any) -> Any:
            assert lookups is not None
            held = await lookups.latest_for_key(write, key)
            if held is not None:
                result = value_of(*held)
            remember(key, result)
            return result

        def remember(key: Any, result: Any) -> None:
            if cache is not None and key is not None and is_hashable(key):
                _remember_latest(cache, (write, key), result)

        return answered

    def _list_answered(self, method: MethodSetup, value_of: ArgGetter) -> Callable[[Call, Any], Any]:
        """What a list read answers once the backend answered it: the writes of its scope held
        meanwhile merged in; the answer is kept for stale-if-error."""
        lookups, cache = self._ports.lookups, self._cache
        policy = method.policy
        write, scope_of, name = policy.merge_from, policy.scope_key, policy.name
        assert write is not None
        assert scope_of is not None
        merge = _list_merger(policy.merge_id)

        waiting = _waiting(lookups)

        def answered(call: Call, result: Any) -> Any:
            scope = scope_of(call.args, call.kwargs)
            if not isinstance(scope, str):
                return result
            if waiting.depth:
                raise Deferred(merged_with_held(call, scope, result))
            remember(call, result)
            return result

        async def merged_with_held(call: Call, scope: str, result: Any) -> Any:
            assert lookups is not None
            held = [value_of(*entry) for entry in await lookups.pending_for_scope(write, scope)]
            if held:
                result = merge(list(result), held, call.kwargs)
            remember(call, result)
            return result

        def remember(call: Call, result: Any) -> None:
            if cache is not None:
                cache_key = _call_key(name, call.args, call.kwargs)
                if cache_key is not None:
                    cache.put(cache_key, list(result))

        return answered

    def _remembering(self, method: MethodSetup) -> Callable[[Call, Any], Any] | None:
        """Keeps the value of a successful write for the reads that answer it from the cache."""
        cache = self._cache
        policy = method.policy
        key_of, value_of = policy.lww_key, policy.value
        if cache is None or key_of is None or value_of is None:
            return None
        if Merge.LATEST not in self._policies.merges_from(policy.name):
            return None  # no read answers this write's value from the cache
        name = policy.name

        def remember(call: Call, result: Any) -> Any:
            key = key_of(call.args, call.kwargs)
            if key is not None and is_hashable(key):
                cache.put((name, key), value_of(call.args, call.kwargs))
            return result

        return remember

    def _take(self, inner: Service, write: str, key_of: ArgGetter | None, value_of: ArgGetter) -> Step | None:
        """A consume: registered with the key gate as the newest write of its token (a replay of it
        in flight finishes first, and none starts until the consume is done). While nothing at all
        is held, the backend's answer as it is; else a held pause is answered once (see the module
        docs)."""
        ports = self._ports
        lookups, gate, keeper = ports.lookups, ports.gate, ports.keeper
        if lookups is None or gate is None or keeper is None or key_of is None:
            return None  # the backend's answer as it is
        next_stamp, ensure_open = ports.next_stamp, ports.lifecycle.ensure_open
        lifecycle, is_open = ports.lifecycle, ports.lifecycle.is_open
        slot_of, try_enter = gate.slot, gate.try_enter
        waiting = lookups.waiting
        replay, answer_held = keeper.replay, self._answer_held_pauses
        # One consume of a held token at a time: per slot, a lock and how many consumes use it.
        turns: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}
        self._turns.append(turns)

        def leave(slot: Any, stamp: int, turn: tuple[asyncio.Lock, list[int]] | None, holding: bool) -> None:
            if turn is not None:
                lock, users = turn
                if holding:
                    lock.release()
                users[0] -= 1
                if users[0] == 0 and turns.get(slot) is turn:
                    del turns[slot]
            gate.leave(slot, stamp)

        def take_failed(message: str) -> None:
            logger.exception(
                message,
                extra={"event": "deadletter_take_failed", "store": lookups.store_name, "method": write},
            )

        async def remove(
            key: Any,
            slot: Any,
            stamp: int,
            turn: tuple[asyncio.Lock, list[int]],
            unconsumed: Call,
            saved_at: int | None,
        ) -> None:
            try:
                await lookups.take(write, key)
                # The backend may hold a copy (a save whose answer was lost reached it): hold the
                # consume and replay it, else that copy could be resumed a second time. It carries
                # the held save's logical time: a newer save of the token is not its, and the
                # backend leaves a tombstone of that time.
                kwargs = unconsumed.kwargs
                if saved_at is not None:
                    kwargs = {**kwargs, WRITE_TIME_ARGUMENT: saved_at}
                await keeper.hold(
                    unconsumed.method.policy.name,
                    unconsumed.args,
                    kwargs,
                    key=None,
                    scope=None,
                    stamp=stamp,
                    error="consume_of_held_copy",
                )
            except Exception:  # the entry stays: it may be replayed, and so resumed again
                take_failed("a resumed pause could not be removed from the dead-letter buffer")
            finally:
                leave(slot, stamp, turn, True)

        def enter(call: Call) -> Handled | None:
            if not (lifecycle.opened or is_open()) or waiting.depth:
                return Handled(consume(call))
            key = key_of(call.args, call.kwargs)
            slot = slot_of(write, key) if key is not None else None
            registered = None
            if slot is not None:
                stamp = next_stamp()
                if not try_enter(slot, stamp):
                    return Handled(consume(call))  # a replay of the key is in flight: it waits
                registered = (slot, stamp)
            call.slot = registered
            return None

        leave_gate = gate.leave

        def consumed(call: Call, result: Any) -> Any:
            """The consume ended: its registration given back (one frame on the usual call)."""
            registered = call.slot
            if registered is not None:
                call.slot = None
                slot, stamp = registered
                leave_gate(slot, stamp)
            return result

        def failed(call: Call, exc: BaseException) -> Any:
            consumed(call, None)
            raise exc

        async def consume(call: Call) -> Any:
            key = key_of(call.args, call.kwargs)
            await ensure_open()
            slot = slot_of(write, key) if key is not None else None
            if slot is None:
                return await inner(call)
            # Registered as the newest write of the key: a replay of it already in flight
            # finishes first (the write is then in the backend, not held), and none starts
            # until this is done.
            stamp = next_stamp()
            if not try_enter(slot, stamp):
                await gate.enter(slot, stamp)
            turn: tuple[asyncio.Lock, list[int]] | None = None
            holding = handed_over = False
            try:
                if await lookups.latest_for_key(write, key) is None:
                    return await inner(call)  # nothing held: the backend's answer
                # A held pause leaves the buffer only once a consume returns it: one consume of it
                # at a time; a consume cancelled or failing meanwhile leaves it for the next.
                turn = turns.get(slot)
                if turn is None:
                    turn = turns[slot] = (asyncio.Lock(), [0])
                turn[1][0] += 1
                await turn[0].acquire()
                holding = True
                taken = await lookups.latest_for_key(write, key)
                if taken is None:
                    return await inner(call)  # the consume before this one returned it
                args, kwargs = taken
                try:
                    # Delivered as a replay: a newer save of another worker, or the tombstone of
                    # a consume, wins over it.
                    await replay(write, args, dict(kwargs))
                except Exception:
                    pass  # not delivered: the hold stays, and the backend is asked as it is
                else:
                    try:
                        await lookups.take(write, key)
                    except Exception:  # it stays and is replayed again: refused, being in the backend
                        take_failed("a delivered pause could not be removed from the dead-letter buffer")
                    return await inner(call)  # the backend is the truth: its newest save, or None
                try:
                    # A backend that answers is the truth, though the hold could not reach it: the
                    # hold waits for its replay (which loses to this consume's tombstone). This
                    # also consumes a copy of the save that reached it (its answer lost).
                    return await inner(call)
                except Exception as exc:
                    if not answer_held:
                        raise  # never answered from the hold: it waits for its replay
                    failure = exc
                held = value_of(*taken)
                # A buffer closed meanwhile could not let the pause go (the next guard would hand
                # it out again): refused. Else its removal is registered before any await, so a
                # close starting from now waits for it.
                lookups.check_open()
                call.settle(Outcome.STALE, failure)  # the backend could not be reached
                # Removed in a task of its own (the caller can no longer cancel it), still
                # registered against replays and holding the turn until it is gone. A copy of the
                # save may be in the backend (its answer lost): the consume is held too.
                saved_at = kept_write_time(kwargs.get(WRITE_TIME_ARGUMENT))
                task = call.loop.create_task(remove(key, slot, stamp, turn, call, saved_at))
                lookups.removing(task)  # kept referenced, and waited for by the buffer's close
                handed_over = True
                return held
            finally:
                if not handed_over:
                    leave(slot, stamp, turn, holding)

        return Step(enter=enter, ok=consumed, failed=failed)

    def _latest(self, write: str, key_of: ArgGetter | None, value_of: ArgGetter) -> Step | None:
        """A single-value read: answered over a write of its key held meanwhile, and when the backend
        fails, from what is held or was last read (stale-if-error)."""
        ports = self._ports
        lookups, cache, ensure_open = ports.lookups, self._cache, ports.lifecycle.ensure_open
        lifecycle, is_open = ports.lifecycle, ports.lifecycle.is_open
        if key_of is None:
            return None
        answered = self._latest_answered(write, key_of, value_of)

        def enter(call: Call) -> Awaitable[None] | None:
            return None if lifecycle.opened or is_open() else ensure_open()

        async def held_value(key: Any) -> tuple[bool, Any]:
            if lookups is None or lookups.is_empty:
                return False, None
            held = await lookups.latest_for_key(write, key)
            return (False, None) if held is None else (True, value_of(*held))

        def failed(call: Call, exc: BaseException) -> Any:
            if not isinstance(exc, Exception) or is_programming_error(exc):
                raise exc  # a bug, not an outage: rejected, never hidden behind a stale value
            raise Deferred(stale(call, exc))

        async def stale(call: Call, exc: Exception) -> Any:
            key = key_of(call.args, call.kwargs)
            cache_key = (write, key) if key is not None and is_hashable(key) else None
            found, value = await held_value(key)
            if not found and cache is not None and cache_key is not None and cache_key in cache:
                found, value = True, cache.get(cache_key)
            if not found:
                raise exc
            call.settle(Outcome.STALE, exc)
            return value

        return Step(enter=enter, ok=answered, failed=failed)

    def _list(self, method: MethodSetup, value_of: ArgGetter) -> Step | None:
        """A list read: the writes of its scope still queued are flushed first; answered with the
        writes held meanwhile merged in, and when the backend fails, from what is held or was last
        read (stale-if-error)."""
        ports = self._ports
        lookups, cache, queue = ports.lookups, self._cache, ports.queue
        lifecycle = ports.lifecycle
        ensure_open, is_open = lifecycle.ensure_open, lifecycle.is_open
        policy = method.policy
        write = policy.merge_from
        scope_of = policy.scope_key
        assert write is not None
        if scope_of is None:
            return None
        write_batched = queue is not None and queue.takes(self._policies.get(write))
        pending_for_scope = queue.pending_for_scope if queue is not None else None
        merge = _list_merger(policy.merge_id)
        name = policy.name
        answered = self._list_answered(method, value_of)

        def enter(call: Call) -> Awaitable[None] | None:
            opened = lifecycle.opened or is_open()
            if write_batched:
                scope = scope_of(call.args, call.kwargs)
                if isinstance(scope, str) and pending_for_scope(write, scope):  # type: ignore[misc]
                    return flushed_first(scope, opened)
            return None if opened else ensure_open()

        async def flushed_first(scope: str, opened: bool) -> None:
            if not opened:
                await ensure_open()
            assert queue is not None
            await queue.flush_scope(write, scope)  # what waits for the scope, queued or in flight

        def held_values(scope: str) -> list[Any]:
            values: list[Any] = []
            if write_batched and queue is not None:
                values.extend(value_of(w.args, w.kwargs) for w in queue.pending_for_scope(write, scope))
            return values

        async def held_in_buffer(scope: str) -> list[Any]:
            assert lookups is not None
            return [value_of(*held) for held in await lookups.pending_for_scope(write, scope)]

        def anything_held() -> bool:
            return lookups is not None and not lookups.is_empty

        def failed(call: Call, exc: BaseException) -> Any:
            if not isinstance(exc, Exception) or is_programming_error(exc):
                raise exc  # a bug, not an outage: rejected, never hidden behind a stale value
            scope = scope_of(call.args, call.kwargs)
            if not isinstance(scope, str):
                raise exc
            raise Deferred(stale(call, scope, exc))

        async def stale(call: Call, scope: str, exc: Exception) -> Any:
            cache_key = _call_key(name, call.args, call.kwargs)
            held = held_values(scope)
            if anything_held():
                held += await held_in_buffer(scope)
            cached = cache.get(cache_key) if cache is not None and cache_key is not None else None
            if cached is None and not held:
                raise exc
            call.settle(Outcome.STALE, exc)
            return merge(list(cached or ()), held, call.kwargs)

        return Step(enter=enter, ok=answered, failed=failed)


def _remember_latest(cache: StaleCache, key: Hashable, answer: Any) -> None:
    """The backend's answer is the key's last value: kept, or, when there is none, the older value
    forgotten (an outage must not bring back a state the backend no longer has)."""
    if answer is None:
        cache.discard(key)
    else:
        cache.put(key, answer)


def _call_key(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Hashable | None:
    if not kwargs:
        key: tuple[Any, ...] = (name, args, ())
    else:
        items = tuple(kwargs.items())
        if len(items) == 2:
            if items[1][0] < items[0][0]:  # sorted by name, as below: two names, one comparison
                items = (items[1], items[0])
        elif len(items) > 2:
            items = tuple(sorted(items))
        key = (name, args, items)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _list_merger(merge_id: str | None) -> Callable[[list[Any], Sequence[Any], Mapping[str, Any]], list[Any]]:
    """Adds held values to a list answer: same ``merge_id`` replaces, equal items are not
    repeated, items with a ``ts`` stay in ``ts`` order, and a ``limit`` keeps the newest."""

    def merge(items: list[Any], held: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        if merge_id is not None:
            position = {getattr(item, merge_id, None): index for index, item in enumerate(items)}
            for value in held:
                index = position.get(getattr(value, merge_id, None))
                if index is None:
                    position[getattr(value, merge_id, None)] = len(items)
                    items.append(value)
                else:
                    items[index] = value
        else:
            for value in held:
                if value not in items:
                    items.append(value)
        if items and all(hasattr(item, "ts") for item in items):
            items.sort(key=lambda item: item.ts)
        limit = kwargs.get("limit")
        if isinstance(limit, int) and limit >= 0 and len(items) > limit:
            items = items[len(items) - limit :]
        return items

    return merge


class _NothingHeld:
    """The waiting count of a guard without a dead-letter buffer."""

    depth = 0


def _waiting(lookups: HeldWriteLookups | None) -> WaitingCount:
    """The live count of held writes the hooks test (always 0 without a buffer)."""
    return lookups.waiting if lookups is not None else _NothingHeld()


# --- the stale-if-error cache -------------------------------------------------------------------

_MISSING = object()

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Default of ``stale.max_bytes``."""
LARGEST_SHARE = 8
"""A value estimated above ``max_bytes // LARGEST_SHARE`` is not kept."""

SAMPLE = 16
"""Items of a container measured by :func:`estimate_size`; a larger one is extrapolated from them."""
VISITS = 1024
"""Objects :func:`estimate_size` measures at most per value (its cost bound)."""
_MAX_DEPTH = 64
_ATOMS = frozenset({str, int, float, bool, type(None), bytes, complex})
_STR_ASCII = getsizeof("")
"""An ASCII ``str`` takes this plus one byte per character."""
_STR_WIDE = getsizeof("\U0001f427") - 4
"""Any other ``str`` at most this plus four bytes per character (counted so: errs high)."""
_SMALL_INT = 2**30
_INT_SIZE = getsizeof(_SMALL_INT - 1)
"""An ``int`` of one 30-bit digit (small cached ones are shared: counted so, errs high)."""
_FIXED: dict[type, int] = {float: getsizeof(0.0), bool: 0, type(None): 0}
"""Sizes taken as constant: ``True``, ``False`` and ``None`` are shared singletons."""
_SEQUENCES = (list, tuple)
_COLLECTIONS = (set, frozenset)
_slot_names: dict[type, tuple[str, ...]] = {}
LEARN = 8
"""Instances of a class (a record: an event, a task) measured before the mean of their sizes
stands in for the next ones; records of one class have much the same shape, and measuring a
pydantic model walks every field (a list of tasks cost about 25 µs a read without this)."""
RELEARN = 1024
"""One instance in this many is measured again, so the mean follows what the records hold. A
measurement costs about 12 µs for a PenguiFlow update: at one in 64 it cost a read of three
records about 0.5 µs on average, at one in 1,024 about 0.04 µs."""
_learned: dict[type, list[int]] = {}
"""Per class: instances seen, instances measured, their total size."""


def estimate_size(value: Any) -> int:
    """An estimate of the bytes ``value`` and what it references take (``sys.getsizeof`` summed).

    Cheap by construction: at most :data:`SAMPLE` items of any container are measured (a list
    or tuple at evenly spaced indices, a mapping or set from its start) and the container's
    total is extrapolated from their mean; at most :data:`VISITS` objects are measured in all,
    after which a container is extrapolated from the items measured so far. A 100,000-event
    history costs about as much as 16 of its events (~0.1 ms), a small flat memory state about
    a microsecond.

    Objects of a class (records) are measured :data:`LEARN` times, then sized by the mean of
    what was measured (one in :data:`RELEARN` is measured again).

    Error: for trees of built-in containers, scalars and objects with ``__dict__`` or ``__slots__``,
    with no container sampled and no record sized by its class's mean, it is ``sys.getsizeof``
    summed except that a non-ASCII string is counted at four bytes a character and small integers,
    ``True``, ``False`` and ``None`` at a fixed size. Objects referenced several times (interned
    strings, small integers, dict keys shared by ``json.loads``, the same list in two places) are
    counted each time. So it errs high. A sampled container whose items differ in size errs by how
    far the sample's mean is from the whole's (for items of similar shape, such as events, a few per
    cent). Against ``tracemalloc`` (tests/test_stale_cache_bytes.py): 1.4x to 1.6x for a history
    decoded by one ``json.loads``, a wide memory state and one with non-ASCII text. Memory an object
    holds outside Python objects (a C buffer not reported by ``__sizeof__``) is not seen.
    """
    if type(value) is dict and len(value) <= SAMPLE:  # a memory state: no budget list, no call per item
        total = getsizeof(value)
        for key, item in value.items():
            total += _STR_ASCII + len(key) if type(key) is str and key.isascii() else _size(key, [VISITS], 1)
            kind = type(item)
            if kind is str:
                total += _STR_ASCII + len(item) if item.isascii() else _STR_WIDE + 4 * len(item)
            elif kind in _FIXED:
                total += _FIXED[kind]
            elif kind is int and -_SMALL_INT < item < _SMALL_INT:
                total += _INT_SIZE
            else:
                total += _size(item, [VISITS // SAMPLE], 1)
        return total
    if type(value) is list and 0 < len(value) <= SAMPLE:
        known = _records_of_known_size(value)
        if known is not None:
            return getsizeof(value) + known
    return _size(value, [VISITS], 0)


def _records_of_known_size(items: list[Any]) -> int | None:
    """The size of ``items`` when all are records of one class whose mean size is learned and none
    is due to be measured again (a list read's answer: tasks, updates); ``None`` otherwise. The
    same sum :func:`_size` gives, without a call per item."""
    kind = type(items[0])
    learned = _learned.get(kind)
    count = len(items)
    if learned is None or learned[1] < LEARN or learned[0] % RELEARN + count >= RELEARN:
        return None
    for item in items:
        if type(item) is not kind:
            return None
    learned[0] += count
    return count * (learned[2] // learned[1])


def _size(value: Any, budget: list[int], depth: int) -> int:
    budget[0] -= 1
    kind = type(value)
    if kind is str:
        return _str_size(value)
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return fixed
    size = getsizeof(value)
    if kind in _ATOMS or budget[0] <= 0 or depth >= _MAX_DEPTH:
        return size
    depth += 1
    count = measured = total = 0
    if kind is list or kind is tuple or (kind is not dict and isinstance(value, _SEQUENCES)):
        count = len(value)
        indices = range(count) if count <= SAMPLE else [i * count // SAMPLE for i in range(SAMPLE)]
        for index in indices:
            if measured and budget[0] <= 0:
                break
            item = value[index]
            if type(item) is str and item.isascii():  # _item_size, inlined for the usual item
                total += _STR_ASCII + len(item)
            else:
                total += _item_size(item, budget, depth)
            measured += 1
    elif kind is dict or isinstance(value, Mapping):
        count = len(value)
        for key, item in value.items():
            if measured == SAMPLE or (measured and budget[0] <= 0):
                break
            # _item_size, inlined for the usual key (ASCII text) and the usual scalar values.
            total += (
                _STR_ASCII + len(key)
                if type(key) is str and key.isascii()
                else _item_size(key, budget, depth)
            )
            item_kind = type(item)
            if item_kind is str and item.isascii():
                total += _STR_ASCII + len(item)
            elif item_kind in _FIXED:
                total += _FIXED[item_kind]
            else:
                total += _item_size(item, budget, depth)
            measured += 1
    elif isinstance(value, _COLLECTIONS):
        count = len(value)
        for item in value:
            if measured == SAMPLE or (measured and budget[0] <= 0):
                break
            total += _item_size(item, budget, depth)
            measured += 1
    else:
        learned = _learned.get(kind)
        if learned is None:
            learned = _learned[kind] = [0, 0, 0]
        learned[0] += 1
        if learned[1] >= LEARN and learned[0] % RELEARN:
            return learned[2] // learned[1]  # a record like the ones measured before
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            size += _size(attributes, budget, depth)
        for name in _slots_of(kind):
            item = getattr(value, name, _MISSING)
            if item is not _MISSING:
                size += _item_size(item, budget, depth)
        learned[1] += 1
        learned[2] += size
        return size
    return size + (total * count // measured if measured else 0)


def _item_size(item: Any, budget: list[int], depth: int) -> int:
    """:func:`_size` of an item, the common scalars without a call."""
    kind = type(item)
    if kind is str:
        length = len(item)
        return _STR_ASCII + length if item.isascii() else _STR_WIDE + 4 * length
    fixed = _FIXED.get(kind)
    return fixed if fixed is not None else _size(item, budget, depth)


def _str_size(value: str) -> int:
    length = len(value)
    return _STR_ASCII + length if value.isascii() else _STR_WIDE + 4 * length


def _slots_of(kind: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``kind`` and its bases (``__dict__`` and ``__weakref__`` left out)."""
    names_ = _slot_names.get(kind)
    if names_ is None:
        found: list[str] = []
        for klass in kind.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and name not in found:
                    found.append(name)
        names_ = _slot_names[kind] = tuple(found)
    return names_


def _unchanged(held: Any, value: dict[Any, Any]) -> bool:
    """Whether ``value``, a mapping, equals the one ``held`` (compared in C; a mapping whose items
    cannot be compared counts as changed)."""
    if held is value:
        return True
    if type(held) is not dict:
        return False
    try:
        return bool(held == value)
    except Exception:  # an item whose __eq__ raises
        return False


class StaleCache:
    """At most ``max_entries`` values by key and about ``max_bytes`` of them (see
    :func:`estimate_size`); the least recently used goes first.

    Its size is exported at scrape time in ``registry`` as ``guarded_stale_cache_entries{store}``
    and ``guarded_stale_cache_bytes{store}`` (the estimate).
    """

    def __init__(
        self,
        max_entries: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        store_name: str = "default",
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._max = max_entries
        self._max_bytes = max_bytes
        self._largest = max_bytes // LARGEST_SHARE
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._bytes = 0
        self.store_name = store_name
        target = REGISTRY if registry is None else registry
        store_total_gauge(target, names.STALE_ENTRIES, "Values held for stale-if-error reads.", len).add(self)
        store_total_gauge(
            target,
            names.STALE_BYTES,
            "Estimated bytes of the values held for stale-if-error reads.",
            lambda cache: cache.bytes,
        ).add(self)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def bytes(self) -> int:
        """The estimated size of the values held (the sum of their :func:`estimate_size`)."""
        return self._bytes

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._values.get(key, _MISSING)
        if value is _MISSING:
            return default
        self._values.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def put(self, key: Hashable, value: Any) -> None:
        """Hold ``value`` as the last one of ``key``, evicting the least recently used values
        beyond the bounds; a value too large to hold drops the older value of ``key``."""
        if self._max <= 0:
            return
        values = self._values
        if type(value) is dict and _unchanged(values.get(key, _MISSING), value):
            values[key] = value  # the same state read or written again: its size is known
            values.move_to_end(key)
            return
        size = estimate_size(value)
        if size > self._largest:
            self.discard(key)
            return
        self._bytes += size - self._sizes.get(key, 0)
        self._sizes[key] = size
        values[key] = value
        values.move_to_end(key)
        while len(values) > self._max or self._bytes > self._max_bytes:
            evicted, _ = values.popitem(last=False)
            self._bytes -= self._sizes.pop(evicted)

    def discard(self, key: Hashable) -> None:
        if self._values.pop(key, _MISSING) is not _MISSING:
            self._bytes -= self._sizes.pop(key)
