"""OpenTelemetry tracing: one CLIENT span per logical call, covering every retry.

Attributes follow the database-client semantic conventions where they apply
(``db.system.name``, ``db.operation.name``, ``error.type``) plus ``guarded.store``,
``guarded.outcome``, ``guarded.attempts``, and the PenguiFlow ids of the call
(``penguiflow.trace_id`` / ``session_id`` / ``task_id``) — ids belong on spans, never on metric
labels. No payload contents: recorded exceptions carry only a safe message.
When the span is not recording, nothing is attached to the context and no attribute is set after
its start.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode, Tracer, TracerProvider

from ..error_classes import error_type, safe_message
from ..observability import telemetry_names as names
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Handled, Step, StepLayer

RECHECK_SECONDS = 0.001
"""How long the answer "no span could record" stands before the tracer provider is looked at
again: a provider set while calls run is used by the calls that begin at most this long after."""

_monotonic = time.monotonic


class TracingLayer(StepLayer):
    """Wraps each call in a span from ``tracer``."""

    def __init__(
        self,
        tracer: Tracer,
        *,
        db_system_name: str | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self._tracer = tracer
        self._db_system_name = db_system_name
        self._provider = tracer_provider
        self.off_until = float("-inf")
        """Until this ``time.monotonic()`` no span could record (see :data:`RECHECK_SECONDS`)."""
        self.on = False
        """A span could record: an SDK provider whose sampler does not drop all. It stays so (a
        provider's sampler is fixed, and the global provider is set once)."""

    def _tracing_off(self) -> bool:
        """Whether no span could record: no SDK provider at all, or one whose sampler drops all.

        Then no span is created (the API's no-op span still costs about a microsecond, and the
        SDK's unsampled span about four). ``trace.get_tracer_provider()`` reads ``os.environ``
        on every call while no provider is set (about 0.7 µs), so its "off" stands for
        :data:`RECHECK_SECONDS`.
        """
        now = _monotonic()
        if now < self.off_until:
            return True
        provider = self._provider or trace.get_tracer_provider()
        if type(provider) is ProxyTracerProvider or getattr(provider, "sampler", None) is ALWAYS_OFF:
            self.off_until = now + RECHECK_SECONDS
            return True
        self.on = True
        return False

    def step(self, method: MethodSetup, inner: Service) -> Step:
        tracer = self._tracer
        span_name = method.label
        ids = method.policy.ids
        static_attributes: dict[str, str] = {
            "db.operation.name": method.label,
            names.SPAN_ATTR_STORE: method.store_name,
        }
        if self._db_system_name:
            static_attributes["db.system.name"] = self._db_system_name
        tracing_off = self._tracing_off
        layer = self

        def begin(call: Call) -> Handled | None:
            # tracing_off()'s usual answers, inlined: no span could record, nothing to do.
            if not layer.on and (_monotonic() < layer.off_until or tracing_off()):
                return None
            return Handled(spanned(call))

        async def spanned(call: Call) -> Any:
            # The call's ids go in with the static attributes: one attribute set built, not two.
            span = tracer.start_span(
                span_name,
                kind=SpanKind.CLIENT,
                attributes={**static_attributes, **ids.extract(call.args, call.kwargs)},
            )
            if not span.is_recording():
                return await inner(call)
            call.span = span
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                result = await inner(call)
            except Exception:  # strict mode: a rejected call raised, its outcome set
                _finish(span, call)
                raise
            except BaseException as exc:
                span.set_attributes(
                    {
                        names.SPAN_ATTR_OUTCOME: "cancelled",
                        names.SPAN_ATTR_ATTEMPTS: call.attempts,
                        "error.type": error_type(exc),
                    }
                )
                raise
            else:
                _finish(span, call)
                return result
            finally:
                otel_context.detach(token)
                span.end()

        return Step(enter=begin)


def _finish(span: trace.Span, call: Call) -> None:
    span.set_attributes(
        {names.SPAN_ATTR_OUTCOME: call.outcome.value, names.SPAN_ATTR_ATTEMPTS: call.attempts}
    )
    for attempt, failure_type, delay in call.retries or ():
        span.add_event(
            names.SPAN_EVENT_RETRY,
            {"guarded.attempt": attempt, "error.type": failure_type, "guarded.backoff_seconds": delay},
        )
    error = call.error
    if error is not None:
        kind = error_type(error)
        span.set_attribute("error.type", kind)
        # Not span.record_exception(): its exception.stacktrace ends with str(error), which may
        # quote a payload. The frames are kept; the message is the safe one.
        message = safe_message(error)
        stacktrace = "".join(traceback.format_tb(error.__traceback__))
        span.add_event(
            "exception",
            {
                "exception.type": kind,
                "exception.message": message,
                "exception.stacktrace": f"Traceback (most recent call last):\n{stacktrace}{kind}: {message}",
                "exception.escaped": "False",
            },
        )
        span.set_status(Status(StatusCode.ERROR, kind))
