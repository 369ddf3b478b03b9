"""The metrics layer alone, over a scripted inner service standing for the layers inside it
(which settle the call's outcome), read back from a registry of its own.

The promise: one latency observation per logical call, labelled with the outcome the inner layers
settled (a cancelled call too: ``cancelled``, and the cancellation goes on); retries counted; a
failure on an operational condition counted apart; an exemplar carries the trace id when the call
has a recording span.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg.exceptions as pg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

import guarded.backends.postgres  # noqa: F401 - registers the PostgreSQL error classifier
from guarded.errors import CallerError
from guarded.layers.metrics import MetricsLayer, guard_instruments
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome
from guarded.pipeline.call import Call
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.metrics import DURATION_COUNT, calls, outcome_counts, retries, sample
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

STORE = "s"
"""The store of :func:`~tests.support.layers.method_setup`."""


def settles(outcome: Outcome, *, error: BaseException | None = None, attempts: int = 1) -> Any:
    """An inner service that ends the call as the layers inside the metrics layer would."""

    async def inner(call: Call) -> str:
        call.outcome, call.error, call.attempts = outcome, error, attempts
        return "answer"

    return inner


async def test_each_call_is_observed_once_under_its_outcome() -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_memory_state")
    service = MetricsLayer(guard_instruments(registry)).wrap(ScriptedService().answer(1).answer(2), setup)
    assert [await service(new_call(setup, "k")) for _ in range(2)] == [1, 2]
    assert calls(registry, "load_memory_state", "ok", store=STORE) == 2
    labels = {"store": STORE, "method": "load_memory_state", "outcome": "ok"}
    assert sample(registry, DURATION_COUNT, **labels) == 2
    assert outcome_counts(registry, STORE) == {"ok": 2}


@pytest.mark.parametrize(
    "outcome", [Outcome.STALE, Outcome.FALLBACK, Outcome.DEAD_LETTERED, Outcome.NOT_FOUND]
)
async def test_the_outcome_settled_inside_is_the_label(outcome: Outcome) -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_memory_state")
    service = MetricsLayer(guard_instruments(registry)).wrap(settles(outcome, error=TimeoutError()), setup)
    assert await service(new_call(setup, "k")) == "answer"
    assert outcome_counts(registry, STORE) == {outcome.value: 1}


async def test_retries_are_counted_by_method() -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_history")
    service = MetricsLayer(guard_instruments(registry)).wrap(settles(Outcome.RETRIED, attempts=3), setup)
    await service(new_call(setup, "t"))
    assert retries(registry, "load_history", store=STORE) == 2
    assert outcome_counts(registry, STORE) == {"retried": 1}


async def test_the_latency_covers_the_whole_call() -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_memory_state")

    async def slow(call: Call) -> None:
        await asyncio.sleep(0.05)

    await MetricsLayer(guard_instruments(registry)).wrap(slow, setup)(new_call(setup, "k"))
    labels = {"store": STORE, "method": "load_memory_state", "outcome": "ok"}
    assert sample(registry, names.CALL_DURATION + "_sum", **labels) >= 0.05


async def test_a_cancelled_call_is_counted_as_cancelled_and_the_cancellation_goes_on() -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_memory_state")
    call = new_call(setup, "k")
    task = asyncio.ensure_future(
        MetricsLayer(guard_instruments(registry)).wrap(ScriptedService().hang(), setup)(call)
    )
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (call.outcome, outcome_counts(registry, STORE)) == (Outcome.CANCELLED, {"cancelled": 1})


async def test_a_call_raised_in_strict_mode_is_counted_under_its_settled_outcome() -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_memory_state")

    async def rejected(call: Call) -> None:
        call.outcome = Outcome.REJECTED
        raise CallerError("wrong call")

    with pytest.raises(CallerError):
        await MetricsLayer(guard_instruments(registry)).wrap(rejected, setup)(new_call(setup, "k"))
    assert outcome_counts(registry, STORE) == {"rejected": 1}


async def test_only_a_failure_on_an_operational_condition_is_counted_as_one() -> None:
    registry = CollectorRegistry()
    setup = method_setup("save_memory_state")
    layer = MetricsLayer(guard_instruments(registry))
    missing_table = pg.UndefinedTableError('relation "memory_states" does not exist')
    await layer.wrap(settles(Outcome.DEAD_LETTERED, error=missing_table), setup)(new_call(setup, "k", {}))
    await layer.wrap(settles(Outcome.DEAD_LETTERED, error=ConnectionResetError()), setup)(
        new_call(setup, "k", {})
    )
    counted = {
        found.labels["condition"]: found.value
        for family in registry.collect()
        for found in family.samples
        if found.name == names.OPERATIONAL_ERRORS and found.labels["store"] == STORE
    }
    assert counted == {"undefined_object": 1.0}


async def test_a_recording_span_puts_its_trace_id_on_the_exemplar() -> None:
    registry = CollectorRegistry()
    setup = method_setup("load_memory_state")
    span = TracerProvider().get_tracer("test").start_span("load_memory_state")
    call = new_call(setup, "k")
    call.span = span  # as the tracing layer outside it does
    await MetricsLayer(guard_instruments(registry)).wrap(ScriptedService().answer(None), setup)(call)
    span.end()
    exemplars = [
        found.exemplar.labels["trace_id"]
        for family in registry.collect()
        for found in family.samples
        if found.name == names.CALL_DURATION + "_bucket" and found.exemplar is not None
    ]
    assert exemplars == [format(span.get_span_context().trace_id, "032x")]
