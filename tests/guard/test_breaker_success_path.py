"""``CircuitBreaker.record_success`` (the success hook's fast path) against ``record(failed=False)``:
the same calls, results, clock and operator actions leave two breakers in the same state, window
and generation, step by step, for count and time windows."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from guarded.config import BreakerConfig
from guarded.layers.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(breaker: CircuitBreaker) -> tuple[Any, ...]:
    window = breaker._window
    return (
        breaker.peek_state(),
        breaker._generation,
        window.calls,
        window.failures,
        window.slow,
        breaker._probes_in_flight,
        tuple(breaker._probe_results),
    )


steps = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.booleans(), st.sampled_from([0.001, 0.5, 1.0, 2.5])),
        st.tuples(st.just("wait"), st.sampled_from([0.3, 1.0, 4.0, 11.0]), st.just(0.0)),
        st.tuples(
            st.sampled_from(["reset", "force_open", "disable", "probe_now"]), st.just(False), st.just(0.0)
        ),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    steps=steps,
    window=st.sampled_from(["count", "time"]),
    size=st.integers(1, 12),
    minimum=st.integers(1, 8),
    probes=st.integers(1, 4),
)
def test_record_success_moves_the_breaker_exactly_as_record_does(
    steps: list[tuple[str, Any, float]], window: str, size: int, minimum: int, probes: int
) -> None:
    config = BreakerConfig(
        window=window,  # type: ignore[arg-type]
        window_size=size,
        minimum_calls=minimum,
        half_open_probes=probes,
        open_duration=10.0,
        slow_call_duration=1.0,
    )
    clock = Clock()
    general, fast = CircuitBreaker(config, clock=clock), CircuitBreaker(config, clock=clock)
    for action, argument, duration in steps:
        if action == "call":
            tickets = general.allow(), fast.allow()
            assert (tickets[0] is None) == (tickets[1] is None)
            if tickets[0] is not None and tickets[1] is not None:
                general.record(tickets[0], failed=argument, duration=duration)
                if argument:
                    fast.record(tickets[1], failed=True, duration=duration)
                else:
                    fast.record_success(tickets[1], duration)
        elif action == "wait":
            clock.now += argument
        else:
            getattr(general, action)()
            getattr(fast, action)()
        assert snapshot(fast) == snapshot(general)


def test_a_stale_ticket_records_nothing() -> None:
    breaker = CircuitBreaker(BreakerConfig(minimum_calls=1, window_size=1), clock=Clock())
    ticket = breaker.allow()
    assert ticket is not None
    breaker.force_open()
    breaker.reset()
    breaker.record_success(ticket, 0.001)
    assert breaker._window.calls == 0


def test_successes_wrapping_twice_over_an_old_failure_count_it_out_once() -> None:
    config = BreakerConfig(window_size=3, minimum_calls=3)
    general, fast = CircuitBreaker(config, clock=Clock()), CircuitBreaker(config, clock=Clock())
    for breaker, record in (
        (general, lambda t: general.record(t, failed=False, duration=0.01)),
        (fast, lambda t: fast.record_success(t, 0.01)),
    ):
        ticket = breaker.allow()
        assert ticket is not None
        breaker.record(ticket, failed=True, duration=0.01)
        for _ in range(8):
            ticket = breaker.allow()
            assert ticket is not None
            record(ticket)
    assert snapshot(fast) == snapshot(general)
    assert fast._window.failures == 0
