"""The circuit breaker: its state machine (the resilience4j model, independent of asyncio) and the
layer that refuses calls at once while it is open.

CLOSED records every call in a sliding window (count- or time-based); once the window holds at
least ``minimum_calls`` and the failure rate or the slow-call rate reaches its threshold, the
breaker OPENs. OPEN refuses calls until ``open_duration`` has passed, then HALF_OPEN lets
``half_open_probes`` calls through; their results close or re-open it. FORCED_OPEN and DISABLED
are operator states: refuse everything, or let everything through and record nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any

from ..config import BreakerConfig
from ..error_classes import CircuitOpenError, counts_against_backend
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Step, StepLayer


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    FORCED_OPEN = "forced_open"
    DISABLED = "disabled"


TransitionListener = Callable[[BreakerState, BreakerState], None]

# Enum attribute lookups cost about 0.1 µs each on CPython 3.11; the hot path uses these.
_CLOSED = BreakerState.CLOSED
_HALF_OPEN = BreakerState.HALF_OPEN
_OPEN = BreakerState.OPEN
_DISABLED = BreakerState.DISABLED


class _CountWindow:
    """The last ``size`` calls, as a ring of ``failed | slow << 1`` codes."""

    __slots__ = ("_codes", "_next", "_size", "calls", "failures", "slow")

    def __init__(self, size: int) -> None:
        self._codes = [0] * size
        self._next = 0
        self._size = size
        self.calls = self.failures = self.slow = 0

    def add(self, failed: bool, slow: bool, now: float) -> None:
        position = self.add_ok(now)
        if failed or slow:
            self._codes[position] = failed | slow << 1
            self.failures += failed
            self.slow += slow

    def add_ok(self, now: float) -> int:
        """:meth:`add` of a call that neither failed nor was slow; the call's position in the ring."""
        position = self._next
        self._next = (position + 1) % self._size
        if self.calls == self._size:
            old = self._codes[position]
            if old:
                self.failures -= old & 1
                self.slow -= old >> 1
                self._codes[position] = 0
        else:
            self.calls += 1
        return position

    def expire(self, now: float) -> None:
        return None


class _TimeWindow:
    """Per-second buckets covering the last ``seconds`` seconds."""

    __slots__ = ("_buckets", "_seconds", "calls", "failures", "slow")

    def __init__(self, seconds: int) -> None:
        self._buckets: deque[list[int]] = deque()
        self._seconds = seconds
        self.calls = self.failures = self.slow = 0

    def add(self, failed: bool, slow: bool, now: float) -> None:
        self.expire(now)
        second = int(now)
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0, 0])
        bucket = self._buckets[-1]
        bucket[1] += 1
        bucket[2] += failed
        bucket[3] += slow
        self.calls += 1
        self.failures += failed
        self.slow += slow

    def add_ok(self, now: float) -> None:
        self.add(False, False, now)

    def expire(self, now: float) -> None:
        horizon = int(now) - self._seconds
        while self._buckets and self._buckets[0][0] <= horizon:
            _, calls, failures, slow = self._buckets.popleft()
            self.calls -= calls
            self.failures -= failures
            self.slow -= slow


class CircuitBreaker:
    """A circuit breaker. ``allow()`` before a call, then exactly one of ``record()`` / ``release()``.

    ``allow()`` returns an admission ticket (or ``None`` when refused) to hand back to ``record`` /
    ``release``; results of calls admitted before the last state change are ignored, so a slow call
    from before the breaker opened can never be mistaken for a half-open probe.
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_generation",
        "_listeners",
        "_minimum_calls",
        "_opened_at",
        "_probe_results",
        "_probes_in_flight",
        "_slow_call_duration",
        "_state",
        "_window",
        "_window_is_timed",
        "config",
    )

    def __init__(self, config: BreakerConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._listeners: list[TransitionListener] = []
        self._state = BreakerState.CLOSED if config.enabled else BreakerState.DISABLED
        self._window = self._new_window()
        self._opened_at = 0.0
        self._probes_in_flight = 0
        self._probe_results: list[tuple[bool, bool]] = []
        self._generation = 0
        # A count window never holds more than ``window_size`` calls (resilience4j caps it too).
        minimum = config.minimum_calls
        self._minimum_calls = min(minimum, config.window_size) if config.window == "count" else minimum
        self._slow_call_duration = config.slow_call_duration
        self._window_is_timed = config.window == "time"

    def _new_window(self) -> _CountWindow | _TimeWindow:
        if self.config.window == "time":
            return _TimeWindow(self.config.window_size)
        return _CountWindow(self.config.window_size)

    @property
    def state(self) -> BreakerState:
        """The current state (an OPEN breaker whose wait is over reports HALF_OPEN)."""
        if self._state is _OPEN and self._clock() - self._opened_at >= self.config.open_duration:
            self._transition(BreakerState.HALF_OPEN)
        return self._state

    def peek_state(self) -> BreakerState:
        """The state :attr:`state` would report, without changing anything (for scrapes, which may
        run on another thread)."""
        state = self._state
        if state is _OPEN and self._clock() - self._opened_at >= self.config.open_duration:
            return BreakerState.HALF_OPEN
        return state

    def add_listener(self, listener: TransitionListener) -> None:
        """Call ``listener(old, new)`` on every state change."""
        self._listeners.append(listener)

    def allow(self) -> int | None:
        """An admission ticket when a call may proceed now, else ``None``.

        A HALF_OPEN breaker admits ``half_open_probes`` calls.
        """
        state = self._state
        if state is _CLOSED or state is _DISABLED:
            return self._generation
        state = self.state
        if (
            state is _HALF_OPEN
            and self._probes_in_flight + len(self._probe_results) < self.config.half_open_probes
        ):
            self._probes_in_flight += 1
            return self._generation
        return None

    def record(self, ticket: int, *, failed: bool, duration: float) -> None:
        """Record the result of a call admitted with ``ticket``."""
        if ticket != self._generation:
            return
        slow = duration >= self._slow_call_duration
        if self._state is _CLOSED:
            window = self._window
            window.add(failed, slow, self._clock() if self._window_is_timed else 0.0)
            # A success can only trip the breaker by bringing the window up to its minimum size.
            if (failed or slow or window.calls <= self._minimum_calls) and self._tripped(
                window.calls, window.failures, window.slow
            ):
                self._open()
        elif self._state is _HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            self._probe_results.append((failed, slow))
            if len(self._probe_results) >= self.config.half_open_probes:
                failures = sum(result[0] for result in self._probe_results)
                slow_calls = sum(result[1] for result in self._probe_results)
                if self._tripped(len(self._probe_results), failures, slow_calls, minimum=1):
                    self._open()
                else:
                    self._close()

    def record_success(self, ticket: int, duration: float) -> None:
        """:meth:`record` of a call that did not fail (the usual case first)."""
        if ticket != self._generation:
            return
        if self._state is _CLOSED and duration < self._slow_call_duration:
            window = self._window
            window.add_ok(self._clock() if self._window_is_timed else 0.0)
            if window.calls <= self._minimum_calls and self._tripped(
                window.calls, window.failures, window.slow
            ):
                self._open()
            return
        self.record(ticket, failed=False, duration=duration)

    def release(self, ticket: int) -> None:
        """Give back an admission without a result (the call was cancelled or its error is ignored)."""
        if ticket == self._generation and self._state is _HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)

    def _tripped(self, calls: int, failures: int, slow: int, minimum: int | None = None) -> bool:
        if calls < (self._minimum_calls if minimum is None else minimum):
            return False
        return (
            failures / calls >= self.config.failure_rate_threshold
            or slow / calls >= self.config.slow_call_rate_threshold
        )

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._transition(BreakerState.OPEN)

    def _close(self) -> None:
        self._transition(BreakerState.CLOSED)

    def _transition(self, new: BreakerState) -> None:
        old = self._state
        if old is new:
            return
        self._state = new
        self._generation += 1
        self._probes_in_flight = 0
        self._probe_results = []
        if new is BreakerState.CLOSED:
            self._window = self._new_window()
        for listener in self._listeners:
            listener(old, new)

    def remaining_open(self) -> float:
        """Seconds until an OPEN breaker lets probes through (0 when it already would; infinite
        when FORCED_OPEN)."""
        if self._state is BreakerState.FORCED_OPEN:
            return float("inf")
        if self._state is not _OPEN:
            return 0.0
        return max(0.0, self.config.open_duration - (self._clock() - self._opened_at))

    def probe_now(self) -> None:
        """End an OPEN breaker's wait early: it goes HALF_OPEN and admits probes (used by a drain
        at shutdown, whose budget may be shorter than ``open_duration``). Operator states stay."""
        if self._state is _OPEN:
            self._transition(BreakerState.HALF_OPEN)

    def force_open(self) -> None:
        """Operator control: refuse every call until :meth:`reset`."""
        self._transition(BreakerState.FORCED_OPEN)

    def disable(self) -> None:
        """Operator control: let every call through and record nothing until :meth:`reset`."""
        self._transition(BreakerState.DISABLED)

    def reset(self) -> None:
        """Back to CLOSED with an empty window."""
        self._transition(BreakerState.CLOSED)
        self._window = self._new_window()

    @property
    def failure_rate(self) -> float:
        """Failure rate of the current window (0 when empty)."""
        self._window.expire(self._clock())
        return self._window.failures / self._window.calls if self._window.calls else 0.0


class CircuitBreakerLayer(StepLayer):
    """Admits calls through a :class:`CircuitBreaker` and records their results.

    The breaker judges the backend only. A call's duration leaves out the time it waited for
    admission by the bulkhead (:attr:`Call.queued <guarded.pipeline.call.Call.queued>`). A failure is
    recorded only when ``counts(error)`` says it is the backend's
    (:func:`~guarded.error_classes.counts_against_backend`: not bad data, which is the caller's fault,
    not an admission timeout of the bulkhead, which never asked the backend); otherwise the
    admission is given back without a result.
    """

    def __init__(
        self, breaker: CircuitBreaker, *, counts: Callable[[BaseException], bool] = counts_against_backend
    ) -> None:
        self.breaker = breaker
        self._counts = counts

    def step(self, method: MethodSetup, inner: Service) -> Step:
        breaker = self.breaker
        counts = self._counts
        allow, record, record_success, release = (
            breaker.allow,
            breaker.record,
            breaker.record_success,
            breaker.release,
        )
        refusal = f"circuit open for store {method.store_name!r}"

        def admit(call: Call) -> None:
            ticket = allow()
            if ticket is None:
                raise CircuitOpenError(refusal)
            call.ticket = ticket

        def succeeded(call: Call, result: Any) -> Any:
            ticket = call.ticket
            assert ticket is not None
            record_success(ticket, call.loop.time() - call.started - call.queued)
            return result

        def failed(call: Call, exc: BaseException) -> Any:
            ticket = call.ticket
            assert ticket is not None
            if isinstance(exc, Exception) and counts(exc):
                record(ticket, failed=True, duration=call.loop.time() - call.started - call.queued)
            else:
                release(ticket)
            raise exc

        return Step(enter=admit, ok=succeeded, failed=failed)
