"""The bulkhead: a concurrency limit in front of the backend, its line, its statistics, and the
layer that admits each attempt through it.

A :class:`Bulkhead` holds ``limit`` permits. A call takes one when one is free and nobody waits
(no frame, no clock read, no lock: :meth:`Bulkhead.try_acquire`); else it waits in line, first
come first served (:meth:`Bulkhead.wait`), and a released permit goes straight to the first caller
still waiting, so nobody overtakes the line. A waiter whose admission deadline passes leaves the
line with :class:`BulkheadTimeoutError`; a waiter that is cancelled leaves it too, and passes on a
permit it was handed meanwhile, so no permit is ever lost.

The limit comes from the configuration (``bulkhead.max_concurrent``) or, by default, from the
backend: a store declares how many calls it can run at once in the attribute named by
:data:`MAX_CONCURRENCY` (the PostgreSQL store: its pool's maximum size). A backend that declares
nothing has no limit, and the guard then has no bulkhead at all (:func:`bulkhead_for` returns
``None``, the layer does not wrap).

Statistics are plain integers on the hot path, turned into Prometheus metrics at scrape time by
one collector per registry (:func:`bulkhead_for` registers each bulkhead with it).

The layer (:class:`BulkheadLayer`) sits between retry and timeout, so each attempt waits for
admission on its own (a retry does not hold a permit while it backs off) and the per-attempt
timeout measures the backend only, from the moment the attempt is admitted. Time spent in line is
written to :attr:`Call.queued <guarded.pipeline.call.Call.queued>`: it is the guard's own
queueing, which the circuit breaker leaves out of the call's duration.

A caller waits while it has time left for an attempt: ``min(attempt timeout,
breaker.slow_call_duration, half the deadline)`` — the *reserve*. An admitted call thus has the
time to answer, or to be shown slow or failing by its own timeout. Past that it gets
:class:`BulkheadTimeoutError` without the backend being asked; so does a retry that would start
with less than the reserve left, even with a permit free. Under overload the
backend serves whole calls of the callers it admits, instead of starting calls that the deadline
cuts short (which would also look like backend failures to the breaker).

An admission timeout is the guard's queueing, not counted against the backend by the breaker —
with two exceptions, where it is evidence about the backend: no call succeeded in the backend
during the whole wait (the line was held up by a backend that stalls or fails, not by the number
of callers: a healthy backend keeps completing calls), or it ends a retry (the attempt before it
failed in the backend, and the breaker sees only a call's last error).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..backend import MAX_CONCURRENCY
from ..error_classes import ErrorClass
from ..errors import GuardedError
from ..observability import telemetry_names as names
from ..observability.call_stats import DurationSeries
from ..observability.per_registry import PerRegistry, registered
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Step, StepLayer

if TYPE_CHECKING:
    from ..config import BulkheadConfig


class BulkheadTimeoutError(GuardedError, TimeoutError):
    """The call waited in the bulkhead's line until its deadline left no time for the backend.

    Nothing was sent. It is a ``TimeoutError`` (outcome ``timeout``); it is not retried (the line
    is no shorter a moment later); it is otherwise an operational failure: a read answers from the
    stale cache or its fallback, a write is held in the dead-letter buffer and replayed — never
    dropped, never parked. The circuit breaker does not count it against the backend (see
    :attr:`counts_against_backend` for the two exceptions).
    """

    reached_backend: ClassVar[bool] = False
    error_class: ClassVar[ErrorClass] = ErrorClass.OPERATIONAL

    def __init__(self, message: str, *, counts_against_backend: bool = False) -> None:
        super().__init__(message)
        self.counts_against_backend = counts_against_backend
        """Usually ``False``: the line was long, the backend not at fault. ``True`` when the backend
        held the line up (no call succeeded in it while this one waited), or for a retry (the
        attempt before it failed in the backend, and the breaker sees only a call's last error)."""


class MethodStats:
    """Admissions of one method: the calls admitted at once, the waits, the admission timeouts."""

    __slots__ = ("immediate", "timeouts", "waits")

    def __init__(self) -> None:
        self.immediate = 0
        """Calls that found a free permit and did not wait (a wait of 0 s)."""
        self.waits = DurationSeries(names.CALL_DURATION_BUCKETS)
        """Seconds waited by the calls that queued (admitted or timed out; cancelled ones not)."""
        self.timeouts = 0


class Bulkhead:
    """``limit`` permits shared by every call of one guarded store (its own flushes and replays
    included), and the line of callers waiting for one."""

    __slots__ = (
        "__weakref__",
        "_line",
        "_methods",
        "_moves",
        "in_use",
        "limit",
        "store_name",
        "successes",
        "waiting",
    )

    def __init__(self, limit: int, store_name: str) -> None:
        if limit < 1:
            raise ValueError(f"a bulkhead needs at least one permit, not {limit}")
        self.limit = limit
        self.store_name = store_name
        self.in_use = 0
        """Permits held by calls in the backend (or handed to a waiter about to resume)."""
        self.waiting = 0
        """Callers in line."""
        self.successes = 0
        """Calls that returned from the backend without an error (counted by the layer): a caller
        that waited its whole turn while this did not move was held up by the backend itself."""
        self._line: deque[asyncio.Future[bool]] = deque()
        """Waiters in arrival order; one that left (timed out, cancelled) is skipped when reached."""
        self._methods: dict[str, MethodStats] = {}
        self._moves = 0
        """Counts the event loops the guard moved to: a waiter of an earlier one counts for nothing."""

    def stats(self, method: str) -> MethodStats:
        """The admission statistics of ``method`` (created on first use)."""
        found = self._methods.get(method)
        if found is None:
            found = self._methods[method] = MethodStats()
        return found

    def method_stats(self) -> dict[str, MethodStats]:
        """Every method's statistics so far."""
        return dict(self._methods)

    def try_acquire(self) -> bool:
        """Take a permit if one is free and nobody waits for it."""
        if self.in_use < self.limit and not self.waiting:
            self.in_use += 1
            return True
        return False

    async def wait(self, loop: asyncio.AbstractEventLoop, deadline: float) -> bool:
        """Wait in line for a permit until event-loop time ``deadline``: ``True`` once it is
        handed over, ``False`` when the deadline came first (the caller then has no permit).

        A cancellation leaves the line; a permit handed over meanwhile goes to the next waiter.
        """
        if self.in_use < self.limit and not self.waiting:
            self.in_use += 1
            return True
        if loop.time() >= deadline:
            return False
        place: asyncio.Future[bool] = loop.create_future()
        self._line.append(place)
        self.waiting += 1
        moves = self._moves
        timer = loop.call_at(deadline, self._expire, place, moves)
        try:
            return await place
        except BaseException:
            if moves != self._moves:
                raise  # the guard moved to another loop since: its line started afresh
            if place.cancelled():
                self.waiting -= 1  # left the line; the skipped future is dropped when reached
            elif place.done() and place.result():
                self.release()  # handed a permit just as the caller gave up: pass it on
            raise
        finally:
            timer.cancel()

    def moved(self) -> None:
        """The guard moved to a new event loop (:mod:`.loops`): the calls of the old one that held
        permits or waited in line never resume, so every permit is free again. What they do when
        their loop runs again, or when they are collected, leaves the new line alone; a permit one
        of them gives back late is never counted below zero (it may let one more call in while the
        calls since hold theirs)."""
        self._line.clear()
        self.in_use = self.waiting = 0
        self._moves += 1

    def _expire(self, place: asyncio.Future[bool], moves: int) -> None:
        if not place.done() and moves == self._moves:
            place.set_result(False)
            self.waiting -= 1

    def release(self) -> None:
        """Give a permit back: to the first caller still waiting, else to the pool of free ones."""
        line = self._line
        while line:
            place = line.popleft()
            if not place.done():
                place.set_result(True)  # the permit changes hands: in_use stays
                self.waiting -= 1
                return
        if self.in_use:  # else a permit of an old loop's given back after the guard moved
            self.in_use -= 1


def declared_limit(target: object) -> int | None:
    """How many calls ``target`` says it can run at once (:data:`MAX_CONCURRENCY`), or ``None``.

    Raises ``TypeError`` / ``ValueError`` for a declaration that is not an integer of at least 1:
    a backend bug, better found when the guard is built than under load.
    """
    declared = getattr(target, MAX_CONCURRENCY, None)
    if declared is None:
        return None
    if isinstance(declared, bool) or not isinstance(declared, int):
        kind = type(declared).__name__
        raise TypeError(f"{type(target).__qualname__}.{MAX_CONCURRENCY} must be an int or None, not {kind}")
    if declared < 1:
        raise ValueError(f"{type(target).__qualname__}.{MAX_CONCURRENCY} must be at least 1, not {declared}")
    return declared


def bulkhead_for(
    target: object, config: BulkheadConfig, *, store_name: str, registry: CollectorRegistry
) -> Bulkhead | None:
    """The bulkhead of a guard over ``target``: ``config.max_concurrent`` permits, else as many as
    the backend declares (:data:`MAX_CONCURRENCY`); ``None`` (no bulkhead, no cost) when disabled
    or when neither sets a limit. Its metrics are exported through ``registry``."""
    if not config.enabled:
        return None
    limit = config.max_concurrent if config.max_concurrent is not None else declared_limit(target)
    if limit is None:
        return None
    bulkhead = Bulkhead(limit, store_name)
    _collector_for(registry).bulkheads.add(bulkhead)
    return bulkhead


class BulkheadLayer(StepLayer):
    """Admits calls through a :class:`Bulkhead` (shared by every method of the
    store and by the guard's own calls); without one, it leaves every method alone."""

    def __init__(self, bulkhead: Bulkhead | None, *, slow_call_duration: float) -> None:
        self._bulkhead = bulkhead
        self._slow_call_duration = slow_call_duration

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        bulkhead = self._bulkhead
        if bulkhead is None:
            return None
        settings = method.settings
        reserve = min(settings.attempt_timeout, self._slow_call_duration, settings.deadline / 2)
        stats = bulkhead.stats(method.label)
        try_acquire, wait, release = bulkhead.try_acquire, bulkhead.wait, bulkhead.release
        label = method.label

        def refused(call: Call, waited: float, *, stuck: bool) -> BulkheadTimeoutError:
            stats.timeouts += 1
            return BulkheadTimeoutError(
                f"{label}: not admitted to the backend within its deadline "
                f"(waited {waited:.3f}s; {bulkhead.limit} calls at once)",
                counts_against_backend=stuck or call.attempts > 1,
            )

        async def queue(call: Call) -> None:
            loop = call.loop
            began = loop.time()
            successes = bulkhead.successes
            admitted = await wait(loop, call.deadline - reserve)
            waited = loop.time() - began
            call.queued += waited
            stats.waits.observe(waited)
            if not admitted:
                raise refused(call, waited, stuck=bulkhead.successes == successes)

        def admit(call: Call) -> Awaitable[None] | None:
            if call.attempts > 1 and call.loop.time() > call.deadline - reserve:
                raise refused(call, 0.0, stuck=False)  # a retry the deadline would cut short
            if try_acquire():
                stats.immediate += 1
                return None
            return queue(call)

        def succeeded(call: Call, result: Any) -> Any:
            release()
            bulkhead.successes += 1
            return result

        def failed(call: Call, exc: BaseException) -> Any:
            release()
            raise exc

        return Step(enter=admit, ok=succeeded, failed=failed)


# --- metrics ----------------------------------------------------------------------------------------


class _BulkheadCollector(Collector):
    """The bulkhead metrics of one registry, summed by store (and method) over live bulkheads."""

    def __init__(self) -> None:
        self.bulkheads: weakref.WeakSet[Bulkhead] = weakref.WeakSet()
        self._bounds = [*(repr(float(bound)) for bound in names.CALL_DURATION_BUCKETS), "+Inf"]

    def collect(self) -> Iterator[Metric]:
        store_label = [names.LABEL_STORE]
        method_labels = [names.LABEL_STORE, names.LABEL_METHOD]
        gauges = {
            "limit": GaugeMetricFamily(
                names.BULKHEAD_LIMIT, "Calls the bulkhead lets into the backend at once.", labels=store_label
            ),
            "in_use": GaugeMetricFamily(
                names.BULKHEAD_IN_USE, "Calls in the backend now (bulkhead permits held).", labels=store_label
            ),
            "waiting": GaugeMetricFamily(
                names.BULKHEAD_QUEUE_DEPTH, "Calls waiting in line for a bulkhead permit.", labels=store_label
            ),
        }
        waits = HistogramMetricFamily(
            names.BULKHEAD_WAIT,
            "Time calls waited for admission to the backend (0 for a call admitted at once).",
            labels=method_labels,
        )
        timeouts = CounterMetricFamily(
            names.BULKHEAD_TIMEOUTS,
            "Calls not admitted to the backend before their deadline (outcome timeout, nothing sent).",
            labels=method_labels,
        )
        by_store: dict[str, list[int]] = {}
        by_method: dict[tuple[str, str], tuple[list[int], float, int]] = {}
        for bulkhead in list(self.bulkheads):
            totals = by_store.setdefault(bulkhead.store_name, [0, 0, 0])
            totals[0] += bulkhead.limit
            totals[1] += bulkhead.in_use
            totals[2] += bulkhead.waiting
            for method, stats in bulkhead.method_stats().items():
                key = (bulkhead.store_name, method)
                counts, total, timed_out = by_method.get(key, ([0] * len(self._bounds), 0.0, 0))
                own = list(stats.waits.counts)
                own[0] += stats.immediate
                counts = [a + b for a, b in zip(counts, own, strict=True)]
                by_method[key] = (counts, total + stats.waits.total, timed_out + stats.timeouts)
        for store, (limit, in_use, waiting) in sorted(by_store.items()):
            gauges["limit"].add_metric([store], limit)
            gauges["in_use"].add_metric([store], in_use)
            gauges["waiting"].add_metric([store], waiting)
        for key, (counts, total, timed_out) in sorted(by_method.items()):
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(self._bounds, counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            waits.add_metric(list(key), buckets, total)
            timeouts.add_metric(list(key), timed_out)
        yield from gauges.values()
        yield waits
        yield timeouts

    def describe(self) -> Iterator[Metric]:
        for name in (names.BULKHEAD_LIMIT, names.BULKHEAD_IN_USE, names.BULKHEAD_QUEUE_DEPTH):
            yield GaugeMetricFamily(name, "", labels=[names.LABEL_STORE])
        yield HistogramMetricFamily(names.BULKHEAD_WAIT, "", labels=[names.LABEL_STORE, names.LABEL_METHOD])
        yield CounterMetricFamily(names.BULKHEAD_TIMEOUTS, "", labels=[names.LABEL_STORE, names.LABEL_METHOD])


_collector_for: PerRegistry[_BulkheadCollector] = registered(_BulkheadCollector)
