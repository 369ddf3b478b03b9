"""The tracing layer alone, with the OpenTelemetry SDK recording into an in-memory exporter and a
scripted inner service standing for the layers inside it.

The promise: one CLIENT span per logical call, named by the method, with the database-client
attributes, the call's outcome and attempts, one event per retry and the PenguiFlow ids of the
call; the span is current while the inner layers run; a failure sets the error status and records
the exception with a safe message only (never payload text); a cancelled call still ends its span
(``cancelled``) and the cancellation goes on; with nothing recording, no span is made and the
inner service's awaitable is handed back as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from guarded.errors import CallerError
from guarded.layers.tracing import TracingLayer
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome
from guarded.pipeline.call import Call
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

SECRET = "ssn 123-45-6789"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


def layer(exporter: InMemorySpanExporter, **provider: Any) -> TracingLayer:
    tracer_provider = TracerProvider(**provider)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracingLayer(
        tracer_provider.get_tracer("guarded-test"),
        db_system_name="postgresql",
        tracer_provider=tracer_provider,
    )


def settles(outcome: Outcome, *, error: BaseException | None = None, attempts: int = 1) -> Any:
    """An inner service that ends the call as the layers inside the tracing layer would."""

    async def inner(call: Call) -> str:
        call.outcome, call.error, call.attempts = outcome, error, attempts
        return "answer"

    return inner


def texts(span: ReadableSpan) -> str:
    """Every attribute and event of ``span`` as text."""
    values = [*span.attributes.values()]
    for event in span.events:
        values.extend(event.attributes.values())
    return " ".join(str(value) for value in values)


async def test_one_client_span_per_call_with_its_attributes_current_while_inner_layers_run(
    exporter: InMemorySpanExporter,
) -> None:
    setup = method_setup("load_history")
    seen: list[Any] = []

    async def inner(call: Call) -> list[Any]:
        call.attempts = 1
        seen.append((trace.get_current_span(), call.span))
        return []

    outside = trace.get_current_span()
    assert await layer(exporter).wrap(inner, setup)(new_call(setup, "trace-7")) == []
    [span] = exporter.get_finished_spans()
    [(current, on_call)] = seen
    assert current is on_call
    assert on_call.get_span_context() == span.get_span_context()
    assert trace.get_current_span() is outside, "the context is restored"
    assert (span.name, span.kind, span.status.status_code) == (
        "load_history",
        SpanKind.CLIENT,
        StatusCode.UNSET,
    )
    assert dict(span.attributes) == {
        "db.operation.name": "load_history",
        "db.system.name": "postgresql",
        names.SPAN_ATTR_STORE: "s",
        "penguiflow.trace_id": "trace-7",
        names.SPAN_ATTR_OUTCOME: "ok",
        names.SPAN_ATTR_ATTEMPTS: 1,
    }


async def test_each_retry_is_an_event_of_the_one_span(exporter: InMemorySpanExporter) -> None:
    setup = method_setup("load_memory_state")

    async def retried(call: Call) -> None:
        call.attempts = 1
        call.note_retry("ConnectionResetError", 0.01)
        call.attempts = 2
        call.note_retry("TimeoutError", 0.02)
        call.attempts, call.outcome = 3, Outcome.RETRIED

    await layer(exporter).wrap(retried, setup)(new_call(setup, "k"))
    [span] = exporter.get_finished_spans()
    assert [(event.name, dict(event.attributes)) for event in span.events] == [
        (
            names.SPAN_EVENT_RETRY,
            {"guarded.attempt": 1, "error.type": "ConnectionResetError", "guarded.backoff_seconds": 0.01},
        ),
        (
            names.SPAN_EVENT_RETRY,
            {"guarded.attempt": 2, "error.type": "TimeoutError", "guarded.backoff_seconds": 0.02},
        ),
    ]
    assert (span.attributes[names.SPAN_ATTR_OUTCOME], span.attributes[names.SPAN_ATTR_ATTEMPTS]) == (
        "retried",
        3,
    )


async def test_a_failure_is_an_error_span_whose_exception_never_quotes_the_payload(
    exporter: InMemorySpanExporter,
) -> None:
    setup = method_setup("load_memory_state")
    error = RuntimeError(f"backend echoed the row: {SECRET}")
    await layer(exporter).wrap(settles(Outcome.FALLBACK, error=error), setup)(new_call(setup, "k"))
    [span] = exporter.get_finished_spans()
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, "RuntimeError")
    assert (span.attributes["error.type"], span.attributes[names.SPAN_ATTR_OUTCOME]) == (
        "RuntimeError",
        "fallback",
    )
    [exception] = [event for event in span.events if event.name == "exception"]
    assert exception.attributes["exception.type"] == "RuntimeError"
    assert SECRET not in texts(span)


async def test_a_call_raised_in_strict_mode_ends_its_span_with_its_outcome(
    exporter: InMemorySpanExporter,
) -> None:
    setup = method_setup("load_memory_state")

    async def rejected(call: Call) -> None:
        call.error, call.outcome = CallerError("wrong call"), Outcome.REJECTED
        raise call.error

    with pytest.raises(CallerError):
        await layer(exporter).wrap(rejected, setup)(new_call(setup, "k"))
    [span] = exporter.get_finished_spans()
    assert (span.attributes[names.SPAN_ATTR_OUTCOME], span.status.status_code) == (
        "rejected",
        StatusCode.ERROR,
    )


async def test_a_cancelled_call_ends_its_span_as_cancelled_and_the_cancellation_goes_on(
    exporter: InMemorySpanExporter,
) -> None:
    setup = method_setup("load_memory_state")
    outside = trace.get_current_span()
    task = asyncio.ensure_future(layer(exporter).wrap(ScriptedService().hang(), setup)(new_call(setup, "k")))
    await settle()
    assert exporter.get_finished_spans() == ()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [span] = exporter.get_finished_spans()
    assert (span.attributes[names.SPAN_ATTR_OUTCOME], span.attributes["error.type"]) == (
        "cancelled",
        "asyncio.exceptions.CancelledError",
    )
    assert trace.get_current_span() is outside


async def test_with_a_sampler_that_drops_everything_no_span_is_made_nor_attached(
    exporter: InMemorySpanExporter,
) -> None:
    setup = method_setup("load_memory_state")
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    answer.set_result("answer")
    call = new_call(setup, "k")
    outside = trace.get_current_span()
    seen: list[Any] = []

    def inner(call: Any) -> asyncio.Future[str]:
        seen.append(trace.get_current_span())
        return answer

    service = layer(exporter, sampler=ALWAYS_OFF).wrap(inner, setup)
    assert await service(call) == "answer"
    assert (exporter.get_finished_spans(), call.span, seen) == ((), None, [outside])


async def test_under_a_parent_that_is_not_sampled_nothing_is_attached_to_the_call(
    exporter: InMemorySpanExporter,
) -> None:
    setup = method_setup("load_memory_state")
    unsampled = NonRecordingSpan(SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(0)))
    token = otel_context.attach(trace.set_span_in_context(unsampled))
    try:
        call = new_call(setup, "k")
        assert await layer(exporter).wrap(ScriptedService().answer("answer"), setup)(call) == "answer"
    finally:
        otel_context.detach(token)
    assert (exporter.get_finished_spans(), call.span) == ((), None)


async def test_a_provider_set_later_is_used_once_the_off_answer_has_stood_its_time(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no provider set, "no span could record" is looked up with the public API (which reads
    ``os.environ`` each time) at most once per ``RECHECK_SECONDS``; a provider set meanwhile is
    used from the first call after that."""
    from guarded.layers import tracing as tracing_module

    now = [1000.0]
    looked_up = []
    public_lookup = trace.get_tracer_provider

    def counted_lookup() -> Any:
        looked_up.append(now[0])
        return public_lookup()

    monkeypatch.setattr(tracing_module, "_monotonic", lambda: now[0])
    monkeypatch.setattr(trace, "get_tracer_provider", counted_lookup)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # the test's own reach: no provider yet
    setup = method_setup("load_memory_state")
    tracing = TracingLayer(trace.ProxyTracerProvider().get_tracer("guarded-test"))

    async def call_once() -> bool:
        call = new_call(setup, "k")
        await tracing.wrap(ScriptedService().answer("answer"), setup)(call)
        return bool(exporter.get_finished_spans())

    assert [await call_once() for _ in range(50)] == [False] * 50
    assert looked_up == [1000.0], "one public lookup while the answer stands"

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    assert await call_once() is False, "the off answer still stands"
    now[0] += tracing_module.RECHECK_SECONDS
    assert await call_once() is True
    assert len(exporter.get_finished_spans()) == 1
    assert set(looked_up[1:]) == {now[0]}, "looked up again only once the answer expired"
