"""Spans (OpenTelemetry SDK, in-memory exporter) and Prometheus metrics with exemplars."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard
from guarded.models import StateUpdate, SteeringEvent
from guarded.testing import Fault, FaultPlan, FaultyStore
from tests.support.metrics import DURATION_COUNT, calls, outcome_counts, retries

from .support import event, fast_config
from .test_fallback import task_state

SECRET = "s3cr3t-PAYLOAD-4d1e"
IDS = {"trace-abc-123", "session-def-456", "task-ghi-789"}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def everything_in(span: ReadableSpan) -> str:
    """Every attribute and event of a span, as text."""
    parts = [span.name, repr(dict(span.attributes or {})), repr(span.status.description)]
    for span_event in span.events:
        parts += [span_event.name, repr(dict(span_event.attributes or {}))]
    return "\n".join(parts)


@pytest.mark.asyncio
async def test_one_client_span_per_logical_call_covering_its_retries(
    exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    plan = FaultPlan.script({"load_history": [Fault.error_before(ConnectionResetError), Fault.delay(0.02)]})
    store = guard(
        FaultyStore(InMemoryStateStore(), plan),
        name="primary",
        registry=CollectorRegistry(),
        tracer_provider=provider,
        config=fast_config(),
    )
    await store.load_history("trace-abc-123")
    (span,) = spans(exporter)
    assert span.name == "load_history"
    assert span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes["db.operation.name"] == "load_history"
    assert attributes["guarded.store"] == "primary"
    assert attributes["guarded.outcome"] == "retried"
    assert attributes["guarded.attempts"] == 2
    assert attributes["penguiflow.trace_id"] == "trace-abc-123"
    assert "error.type" not in attributes  # it ended well
    assert span.status.status_code is not StatusCode.ERROR
    (retry,) = [e for e in span.events if e.name == "retry"]
    assert retry.attributes is not None
    assert retry.attributes["error.type"] == "ConnectionResetError"
    assert retry.attributes["guarded.attempt"] == 1
    assert span.end_time is not None
    assert span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 >= 0.02  # the span covers the second attempt


@pytest.mark.asyncio
async def test_failed_call_span(exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.error_before(ConnectionResetError)))
    store = guard(
        faulty, registry=CollectorRegistry(), tracer_provider=provider, config=fast_config(max_attempts=3)
    )
    assert await store.load_memory_state("k") is None
    (span,) = spans(exporter)
    attributes = dict(span.attributes or {})
    assert attributes["guarded.outcome"] == "fallback"
    assert attributes["guarded.attempts"] == 3
    assert attributes["error.type"] == "ConnectionResetError"
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["retry", "retry", "exception"]
    exception = span.events[-1].attributes
    assert exception is not None
    assert exception["exception.type"] == "ConnectionResetError"
    assert "test_telemetry" not in str(exception["exception.stacktrace"])  # only the guard's frames onward
    assert "faulty.py" in str(exception["exception.stacktrace"])


@pytest.mark.asyncio
async def test_db_system_name_from_the_store(
    exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    class Declared(InMemoryStateStore):
        db_system_name = "postgresql"

    store = guard(Declared(), registry=CollectorRegistry(), tracer_provider=provider)
    await store.list_tasks("s1")
    (span,) = spans(exporter)
    assert (span.attributes or {})["db.system.name"] == "postgresql"


@pytest.mark.asyncio
async def test_penguiflow_ids_are_span_attributes(
    exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), tracer_provider=provider)
    await store.save_event(event("trace-abc-123"))
    state = task_state("session-def-456", "task-ghi-789")
    await store.save_task(state)
    await store.save_update(
        StateUpdate(session_id="session-def-456", task_id="task-ghi-789", update_type="PROGRESS", content=1)
    )
    await store.list_updates("session-def-456", task_id="task-ghi-789")
    await store.save_trajectory("trace-abc-123", "session-def-456", {"steps": []})
    by_name = {span.name: dict(span.attributes or {}) for span in spans(exporter)}
    assert by_name["save_event"]["penguiflow.trace_id"] == "trace-abc-123"
    assert by_name["save_task"]["penguiflow.session_id"] == "session-def-456"
    assert by_name["save_task"]["penguiflow.task_id"] == "task-ghi-789"
    assert by_name["save_update"]["penguiflow.session_id"] == "session-def-456"
    assert by_name["list_updates"]["penguiflow.session_id"] == "session-def-456"
    assert by_name["save_trajectory"]["penguiflow.trace_id"] == "trace-abc-123"
    assert by_name["save_trajectory"]["penguiflow.session_id"] == "session-def-456"


@pytest.mark.asyncio
async def test_caller_span_is_the_parent(exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), tracer_provider=provider)
    tracer = provider.get_tracer("caller")
    with tracer.start_as_current_span("planner step") as parent:
        await store.load_history("t1")
    guarded_span = next(span for span in spans(exporter) if span.name == "load_history")
    assert guarded_span.parent is not None
    assert guarded_span.parent.span_id == parent.get_span_context().span_id


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_no_payload_contents_in_spans(exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
    plan = FaultPlan.script(
        {
            "save_memory_state": [None, Fault.error_after(ConnectionResetError)],
            "save_event": [Fault.error_before(KeyError(SECRET))],
            "load_memory_state": [Fault.error_before(ValueError(SECRET))],
        }
    )
    store = guard(
        FaultyStore(InMemoryStateStore(), plan),
        registry=CollectorRegistry(),
        tracer_provider=provider,
        config=fast_config(max_attempts=1),
    )
    await store.save_memory_state("k", {SECRET: float("nan")})  # rejected: the key is in the error's path
    await store.save_memory_state("k", {"note": SECRET})
    await store.save_event(event("t1", note=SECRET))
    await store.load_memory_state("k")
    await store.save_planner_state("tok", {"note": SECRET, "x": object()})
    await store.save_steering(  # rejected: a lone surrogate in task_id (stores sanitize, not validate)
        SteeringEvent(session_id="s1", task_id="t1\ud800", event_type="REDIRECT", payload={"x": SECRET})
    )
    recorded = spans(exporter)
    assert len(recorded) == 6
    assert sum(1 for span in recorded if span.status.status_code is StatusCode.ERROR) == 6
    for span in recorded:
        assert SECRET not in everything_in(span)


@pytest.mark.asyncio
async def test_cancelled_call_span(exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
    import asyncio

    store = guard(
        FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.hang())),
        registry=CollectorRegistry(),
        tracer_provider=provider,
    )
    call = asyncio.create_task(store.load_history("t1"))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    (span,) = spans(exporter)
    assert (span.attributes or {})["guarded.outcome"] == "cancelled"


# --- metrics ---------------------------------------------------------------------------------------


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_calls_are_counted_by_outcome() -> None:
    registry = CollectorRegistry()
    inner = InMemoryStateStore()
    await inner.save_memory_state("present", {"a": 1})
    plan = FaultPlan.script(
        {
            "load_history": [
                Fault.error_before(ConnectionResetError),
                None,
                Fault.error_before(RuntimeError),
            ],
            "list_tasks": [Fault.hang(), Fault.hang(), Fault.hang()],
        }
    )
    store = guard(FaultyStore(inner, plan), name="primary", registry=registry, config=fast_config())
    await store.load_history("t1")  # retried
    await store.load_history("t1")  # fallback (RuntimeError is not retried)
    await store.load_history("t1")  # ok
    await store.load_memory_state("present")  # ok
    await store.load_memory_state("absent")  # not_found
    await store.save_memory_state("k", {"x": float("inf")})  # rejected
    await store.list_tasks("s1")  # timeout
    controller(store).breaker.force_open()
    await store.list_tasks("s1")  # circuit_open
    assert outcome_counts(registry, "primary") == {
        "retried": 1,
        "fallback": 1,
        "ok": 2,
        "not_found": 1,
        "rejected": 1,
        "timeout": 1,
        "circuit_open": 1,
    }
    assert calls(registry, "load_history", "ok", "primary") == 1
    assert retries(registry, "load_history", "primary") == 1
    assert retries(registry, "list_tasks", "primary") == 2
    labels = {"store": "primary", "method": "load_history", "outcome": "ok"}
    assert registry.get_sample_value(DURATION_COUNT, labels) == 1


@pytest.mark.asyncio
async def test_exemplars_carry_the_trace_id_when_spans_record(
    exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry, tracer_provider=provider)
    await store.load_history("t1")
    (span,) = spans(exporter)
    trace_id = format(span.context.trace_id, "032x")
    exposition = generate_latest(registry).decode()
    assert re.search(
        r'^guarded_store_call_duration_seconds_bucket\{[^}]*method="load_history"[^}]*\} 1\.0 # \{trace_id="'
        + trace_id
        + r'"\} [0-9.e-]+ [0-9.]+$',
        exposition,
        re.MULTILINE,
    ), exposition
    assert exposition.rstrip().endswith("# EOF")


@pytest.mark.asyncio
async def test_no_exemplars_when_spans_do_not_record() -> None:
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry, tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
    await store.load_history("t1")
    exposition = generate_latest(registry).decode()
    assert "trace_id" not in exposition
    assert calls(registry, "load_history", "ok") == 1


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_labels_are_bounded_and_never_ids(
    exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(
        InMemoryStateStore(), FaultPlan.random(3, error_before=0.3, errors=[ConnectionResetError, ValueError])
    )
    store = guard(faulty, name="primary", registry=registry, tracer_provider=provider, config=fast_config())
    for index in range(30):
        await store.save_event(event("trace-abc-123", index))
        await store.list_updates("session-def-456", task_id="task-ghi-789")
        await store.save_task(task_state("session-def-456", "task-ghi-789"))
    allowed = {"store", "method", "outcome", "le", "state", "from_state", "to_state", "health"}
    seen_guard_samples = 0
    for family in registry.collect():
        if not family.name.startswith("guarded_"):
            continue
        for sample in family.samples:
            seen_guard_samples += 1
            assert set(sample.labels) <= allowed, sample
            assert not IDS & set(sample.labels.values()), sample
    assert seen_guard_samples > 0
    assert sum(outcome_counts(registry, "primary").values()) == 90


def test_a_global_tracer_provider_set_after_guard_creation_is_used() -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from prometheus_client import CollectorRegistry
        from guarded import guard
        from guarded.backends.memory import InMemoryStateStore
        from guarded.layers.tracing import RECHECK_SECONDS

        async def main() -> None:
            store = guard(InMemoryStateStore(), registry=CollectorRegistry())
            await store.load_memory_state("before")
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            # Used by the calls that begin once the "no span could record" answer has stood its
            # time (RECHECK_SECONDS): a call right after the first may still take it.
            await asyncio.sleep(2 * RECHECK_SECONDS)
            await store.load_memory_state("after")
            print([span.name for span in exporter.get_finished_spans()])

        asyncio.run(main())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "['load_memory_state']"


@pytest.mark.asyncio
async def test_every_outcome_of_a_method_in_use_reads_zero_until_it_happens() -> None:
    """So increase() and rate() see a method's first failure: a series born at N shows no increase."""
    registry = CollectorRegistry()
    store = guard(InMemoryStateStore(), registry=registry, config=fast_config())
    await store.load_history("t1")
    for outcome in ("fallback", "timeout", "circuit_open", "stale", "dead_lettered"):
        labels = {"store": "default", "method": "load_history", "outcome": outcome}
        assert registry.get_sample_value("guarded_store_calls_total", labels) == 0
    assert calls(registry, "load_history", "ok") == 1
    assert (
        registry.get_sample_value(
            "guarded_store_retries_total", {"store": "default", "method": "load_history"}
        )
        == 0
    )
    assert (
        registry.get_sample_value(
            "guarded_store_calls_total", {"store": "default", "method": "save_event", "outcome": "ok"}
        )
        is None
    )  # methods never called export nothing
