"""The guard's promise under random faults (hypothesis).

Thousands of calls, sequential and concurrent, some cancelled by their callers, against
``guard(FaultyStore(InMemoryStateStore()))`` with random fault schedules. For every call:
nothing but the caller's own cancellation escapes, it returns within its deadline plus a small
margin, and the outcome the metrics count is the one its faults imply. The metric counts equal
the calls made, method by method and outcome by outcome.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import asyncpg.exceptions as pg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import guarded.backends.postgres  # noqa: F401 - registers the PostgreSQL error classifier
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BreakerConfig, RetryConfig
from guarded.errors import InvalidPayloadError
from guarded.guard import guard
from guarded.testing import (
    Ending,
    FaultInjector,
    FaultKind,
    FaultPlan,
    FaultRecord,
    FaultyStore,
    fault_injector,
)
from tests.support.metrics import CALLS

from .support import event, fast_config

ATTEMPT = 0.04
DEADLINE = 0.2
MAX_ATTEMPTS = 3
"""3 attempts of at most 40 ms plus backoff fit the 200 ms deadline, so the deadline seldom decides
when to stop; each call's outcome follows from how its attempts ended (the fault log)."""
MARGIN = 0.06

ERRORS: dict[type[BaseException], tuple[str, bool]] = {
    # error: (outcome when it is the last failure, retryable)
    ConnectionResetError: ("fallback", True),
    TimeoutError: ("timeout", True),
    pg.SerializationError: ("fallback", True),
    ValueError: ("rejected", False),
    RuntimeError: ("fallback", False),
}


@dataclass(frozen=True)
class Op:
    method: str
    args: tuple[Any, ...]
    single_item: bool = False
    consume: bool = False
    bad: bool = False
    fallback: Any = None


def make_op(kind: str, key: int, index: int) -> Op:
    trace, session, name = f"trace-{key}", f"session-{key}", f"key-{key}"
    if kind == "save_event":
        return Op("save_event", (event(trace, index),))
    if kind == "load_history":
        return Op("load_history", (trace,), fallback=[])
    if kind == "save_memory":
        return Op("save_memory_state", (name, {"i": index}))
    if kind == "load_memory":
        return Op("load_memory_state", (name,), single_item=True)
    if kind == "save_pause":
        return Op("save_planner_state", (name, {"i": index}))
    if kind == "load_pause":
        return Op("load_planner_state", (name,), single_item=True, consume=True)
    if kind == "bad_payload":
        return Op("save_memory_state", (name, {"x": math.nan}), bad=True)
    assert kind == "list_tasks"
    return Op("list_tasks", (session,), fallback=[])


KINDS = [
    "save_event",
    "load_history",
    "save_memory",
    "load_memory",
    "save_pause",
    "load_pause",
    "bad_payload",
    "list_tasks",
]
CANCEL_AFTER = [None] * 12 + [0.0, 0.002, 0.01, 0.03, 0.06]


def random_plan(seed: int, before: float, after: float, hang: float, delay: float) -> FaultPlan:
    scale = min(1.0, 0.95 / max(before + after + hang + delay, 1e-9))  # from healthy to an outage
    return FaultPlan.random(
        seed,
        error_before=before * scale,
        error_after=after * scale,
        hang=hang * scale,
        delay=delay * scale,
        errors=list(ERRORS),
        delay_range=(0.0005, 0.004),
    )


plans = st.builds(
    random_plan,
    st.integers(0, 2**32),
    st.floats(0, 0.9),
    st.floats(0, 0.4),
    st.floats(0, 0.1),
    st.floats(0, 0.3),
)
ops = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 3), st.sampled_from(CANCEL_AFTER)),
    min_size=80,
    max_size=120,
)
group_sizes = st.lists(st.integers(1, 30), min_size=1, max_size=10)
breakers = st.sampled_from(["off", "on"])


def error_info(error: BaseException | None) -> tuple[str, bool]:
    """(outcome when it ends the call, retryable) of an attempt's exception."""
    assert error is not None
    if isinstance(error, InvalidPayloadError):
        return ("rejected", False)  # the store refused the payload
    return ERRORS[type(error)]


def repeatable(op: Op, record: FaultRecord) -> bool:
    """Whether the guard retries after this attempt (its rules, applied to what happened)."""
    if record.ending is Ending.CANCELLED:  # the guard's attempt timeout: it may have reached the backend
        return not op.consume
    if record.ending is Ending.RAISED:
        retryable = error_info(record.error)[1]
        return retryable and (not op.consume or record.fault.kind is FaultKind.ERROR_BEFORE)
    return False


def expected_outcome(op: Op, records: list[FaultRecord], result: Any, duration: float) -> str:
    """The outcome a call must have, from what its attempts met."""
    if not records:
        return "circuit_open"  # the breaker refused it before any attempt
    for record in records[:-1]:
        assert repeatable(op, record), f"{op.method} repeated after {record}"
    last = records[-1]
    if len(records) < MAX_ATTEMPTS and duration < DEADLINE - 0.05:  # time was left for another attempt
        assert not repeatable(op, last), f"{op.method} gave up too early: {records}"
    if last.ending is Ending.CANCELLED:
        return "timeout"
    if last.ending is Ending.RAISED:
        return error_info(last.error)[0]
    assert last.ending is Ending.RETURNED, last
    if op.single_item and result is None:
        return "not_found"
    return "ok" if len(records) == 1 else "retried"


async def run_example(
    plan: FaultPlan, spec: list[tuple[str, int, float | None]], sizes: list[int], breaker: str
) -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(InMemoryStateStore(), plan)
    injector: FaultInjector = fault_injector(faulty)
    config = fast_config(
        attempt=ATTEMPT,
        deadline=DEADLINE,
        retry=RetryConfig(
            max_attempts=MAX_ATTEMPTS,
            critical_max_attempts=MAX_ATTEMPTS,
            initial_backoff=0.001,
            max_backoff=0.004,
            jitter=0.001,
        ),
        breaker=BreakerConfig(
            enabled=breaker == "on",
            window_size=20,
            minimum_calls=10,
            failure_rate_threshold=0.5,
            open_duration=0.03,
            half_open_probes=2,
        ),
    )
    store = guard(faulty, name="prop", registry=registry, config=config)
    loop = asyncio.get_running_loop()
    durations: dict[str, float] = {}
    stall = [0.0]

    async def measure_stalls() -> None:
        """The worst lateness of the event loop: the process starved of CPU, not the guard's doing."""
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            stall[0] = max(stall[0], loop.time() - before - 0.005)

    heartbeat = asyncio.create_task(measure_stalls())

    async def call(name: str, op: Op) -> Any:
        started = loop.time()
        try:
            return await getattr(store, op.method)(*op.args)
        finally:
            durations[name] = loop.time() - started

    async def cancel_later(task: asyncio.Task[Any], delay: float, cancelled: dict[str, bool]) -> None:
        await asyncio.sleep(delay)
        cancelled[task.get_name()] = task.cancel()

    expected: Counter[tuple[str, str]] = Counter()
    made = 0
    position = 0
    group = 0
    while position < len(spec):
        batch = spec[position : position + sizes[group % len(sizes)]]
        group += 1
        tasks: list[tuple[str, Op, asyncio.Task[Any]]] = []
        cancellers = []
        cancelled: dict[str, bool] = {}
        for kind, key, cancel_after in batch:
            name = f"call-{position}"
            op = make_op(kind, key, position)
            position += 1
            task = asyncio.create_task(call(name, op), name=name)
            tasks.append((name, op, task))
            if cancel_after is not None:
                cancellers.append(asyncio.create_task(cancel_later(task, cancel_after, cancelled)))
        results = await asyncio.gather(*(task for _, _, task in tasks), return_exceptions=True)
        await asyncio.gather(*cancellers)
        for (name, op, _), result in zip(tasks, results, strict=True):
            assert name in durations, f"{name} never started"
            made += 1
            limit = DEADLINE + MARGIN + stall[0]
            assert durations[name] <= limit, (
                name,
                op.method,
                durations[name],
                stall[0],
                injector.records(task=name),
            )
            if isinstance(result, asyncio.CancelledError):
                assert cancelled.get(name), f"{name}: CancelledError without a cancellation by the caller"
                expected[(op.method, "cancelled")] += 1
                continue
            assert not isinstance(result, BaseException), f"{name}: {result!r} escaped the guard"
            assert not cancelled.get(name), f"{name}: the caller's cancellation was swallowed"
            outcome = expected_outcome(op, injector.records(task=name), result, durations[name])
            if outcome not in ("ok", "retried", "not_found"):
                assert result == op.fallback, (name, outcome, result)
                assert type(result) is type(op.fallback)
            expected[(op.method, outcome)] += 1

    heartbeat.cancel()
    counted: Counter[tuple[str, str]] = Counter()
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == CALLS and sample.value:
                assert sample.labels["store"] == "prop"
                counted[(sample.labels["method"], sample.labels["outcome"])] += int(sample.value)
    assert made == len(spec)
    assert sum(counted.values()) == made
    assert counted == expected
    assert injector.hanging == 0


@pytest.mark.lenient
@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plan=plans, spec=ops, sizes=group_sizes, breaker=breakers)
def test_nothing_escapes_deadlines_hold_and_metrics_count_every_call(
    plan: FaultPlan, spec: list[tuple[str, int, float | None]], sizes: list[int], breaker: str
) -> None:
    asyncio.run(run_example(plan, spec, sizes, breaker))
