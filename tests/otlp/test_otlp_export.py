"""``configure_otlp_from_env``: real OTLP/HTTP export of guard spans and metrics to a local receiver.

The receiver is a real HTTP server (tests/otlp/receiver.py); bodies are decoded with
``opentelemetry.proto``. Tests in this process use ``set_global=False`` (the OpenTelemetry globals
can be set once per process and other test modules rely on them being unset); the global
installation and the "application provider is kept" rule run in a subprocess each.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard
from guarded.models import StoredEvent
from guarded.observability import telemetry_names as names
from guarded.otlp import OtlpConfigError, OtlpExporterMissingError, OtlpSetup, configure_otlp_from_env

from .receiver import OtlpReceiver, attributes

PAYLOAD_MARKER = "PAYLOAD-4f2a-never-in-telemetry"
TOKEN = "s3cr3t-token-9c1d"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def configured(environ: dict[str, str], **kwargs: Any) -> OtlpSetup:
    setup = configure_otlp_from_env(environ, set_global=False, **kwargs)
    assert setup.exporting
    return setup


def assert_off(setup: OtlpSetup, why: str) -> None:
    """``setup`` exports nothing, says why, and its ``shutdown()`` is harmless (the README's code
    calls it whether or not an endpoint is set)."""
    assert not setup.exporting
    assert setup.tracer_provider is None
    assert setup.meter_provider is None
    assert setup.traces_endpoint is None
    assert setup.metrics_endpoint is None
    assert why in " ".join(setup.notes), setup.notes
    assert setup.force_flush()
    setup.shutdown()
    setup.shutdown()


@pytest.mark.asyncio
async def test_guard_spans_reach_the_otlp_receiver_without_payloads_or_logged_secrets(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    setup = configured(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN},x-tenant=acme",
            "OTEL_SERVICE_NAME": "support-agent",
            "OTEL_METRICS_EXPORTER": "none",
        }
    )
    assert setup.traces_endpoint == f"{receiver.url}/v1/traces"
    assert setup.meter_provider is None
    store = guard(
        InMemoryStateStore(),
        name="otlp-test",
        registry=CollectorRegistry(),
        tracer_provider=setup.tracer_provider,
    )
    try:
        await store.save_memory_state("user:1:session:2", {"note": PAYLOAD_MARKER})
        assert await store.load_memory_state("user:1:session:2") == {"note": PAYLOAD_MARKER}
        await store.save_event(StoredEvent("trace-77", 1.0, "node_end", "n", "n0", {"text": PAYLOAD_MARKER}))
        assert len(await store.load_history("trace-77")) == 1
    finally:
        await controller(store).aclose()
    await setup.aclose()

    (request,) = receiver.to("/v1/traces")
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["x-tenant"] == "acme"
    assert request.headers["content-type"] == "application/x-protobuf"
    assert PAYLOAD_MARKER.encode() not in request.body

    received = receiver.spans()
    by_name = {span.name: (resource, scope, span) for resource, scope, span in received}
    assert set(by_name) == {"save_memory_state", "load_memory_state", "save_event", "load_history"}
    for name, (resource, scope, span) in by_name.items():
        assert resource["service.name"] == "support-agent"
        assert scope == names.TRACER_NAME
        assert span.kind == Span.SPAN_KIND_CLIENT
        span_attributes = attributes(span.attributes)
        assert span_attributes["db.operation.name"] == name
        assert span_attributes[names.SPAN_ATTR_STORE] == "otlp-test"
        assert span_attributes[names.SPAN_ATTR_OUTCOME] == "ok"
    assert attributes(by_name["load_history"][2].attributes)["penguiflow.trace_id"] == "trace-77"

    assert TOKEN not in caplog.text
    assert any(f"OTLP traces export to {receiver.url}/v1/traces" in r.getMessage() for r in caplog.records)


def test_metrics_reach_the_receiver_with_trace_exemplars(receiver: OtlpReceiver) -> None:
    setup = configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url + "/", "OTEL_SERVICE_NAME": "support-agent"}
    )
    assert setup.tracer_provider is not None
    assert setup.meter_provider is not None
    assert setup.metrics_endpoint == f"{receiver.url}/v1/metrics"
    meter = setup.meter_provider.get_meter(names.OTEL_METER_NAME)
    duration = meter.create_histogram(names.OTEL_TASK_DURATION, unit="s")
    events = meter.create_counter(names.OTEL_TASK_EVENTS)
    labels = {"event_type": "completed", "outcome": "ok", "task_type": "background", "mode": "async"}
    with setup.tracer_provider.get_tracer("test").start_as_current_span("task") as span:
        duration.record(2.5, labels)
        events.add(1, labels)
    setup.shutdown()

    received = {metric.name: (resource, scope, metric) for resource, scope, metric in receiver.metrics()}
    resource, scope, histogram = received[names.OTEL_TASK_DURATION]
    assert resource["service.name"] == "support-agent"
    assert scope == names.OTEL_METER_NAME
    assert histogram.unit == "s"
    (point,) = histogram.histogram.data_points
    assert (point.count, point.sum) == (1, 2.5)
    assert attributes(point.attributes) == labels
    (exemplar,) = [e for e in point.exemplars if e.as_double == 2.5]
    assert exemplar.trace_id == span.get_span_context().trace_id.to_bytes(16, "big")
    (counted,) = received[names.OTEL_TASK_EVENTS][2].sum.data_points
    assert counted.as_int == 1
    assert receiver.spans()[0][2].name == "task"


def test_signal_endpoints_are_used_as_given_with_their_own_headers_and_gzip(receiver: OtlpReceiver) -> None:
    setup = configured(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url + "/custom/traces",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url + "/custom/metrics",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-generic=1",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-traces=2",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        }
    )
    assert setup.tracer_provider is not None
    assert setup.meter_provider is not None
    setup.tracer_provider.get_tracer("test").start_span("one").end()
    setup.meter_provider.get_meter("test").create_counter("things").add(3)
    assert setup.force_flush()
    assert len(receiver.to("/custom/traces")) == len(receiver.to("/custom/metrics")) == 1
    setup.shutdown()
    setup.shutdown()  # idempotent

    (traces,) = receiver.to("/custom/traces")
    metrics_request = receiver.to("/custom/metrics")[0]  # shutdown() sent a last collection too
    assert traces.headers["content-encoding"] == "gzip"
    assert traces.raw_body != traces.body
    assert traces.headers["x-traces"] == "2"
    assert "x-generic" not in traces.headers  # the signal's own variable replaces the generic one
    assert metrics_request.headers["x-generic"] == "1"
    assert [span.name for _, _, span in receiver.spans("/custom/traces")] == ["one"]
    assert {metric.name for _, _, metric in receiver.metrics("/custom/metrics")} == {"things"}


def test_service_name_argument_is_a_default_the_environment_overrides(receiver: OtlpReceiver) -> None:
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_METRICS_EXPORTER": "none"}
    cases = [
        ({}, "from-code"),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes,deployment.environment=prod"},
            "from-attributes",
        ),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes", "OTEL_SERVICE_NAME": "from-env"},
            "from-env",
        ),
    ]
    for extra, expected in cases:
        setup = configured(base | extra, service_name="from-code")
        assert setup.tracer_provider is not None
        assert setup.tracer_provider.resource.attributes["service.name"] == expected
        setup.shutdown()


def test_unset_endpoint_configures_nothing_and_says_otlp_is_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="guarded.otlp")
    tracer_provider, meter_provider = trace.get_tracer_provider(), metrics.get_meter_provider()
    for environ in (
        {},
        {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "},
    ):
        assert_off(configure_otlp_from_env(environ), "no OTLP endpoint is set")
    assert trace.get_tracer_provider() is tracer_provider
    assert metrics.get_meter_provider() is meter_provider
    assert "OTLP export is off: no OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT" in caplog.text


def test_sdk_disabled_configures_nothing() -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318", "OTEL_SDK_DISABLED": "TRUE"}
    assert_off(configure_otlp_from_env(environ), "OTEL_SDK_DISABLED is true")


def test_sdk_disabled_other_than_true_is_false_with_a_warning(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    setup = configured({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SDK_DISABLED": "1"})
    assert setup.tracer_provider is not None
    setup.shutdown()
    assert "OTEL_SDK_DISABLED='1' is neither true nor false; read as false" in caplog.text


def test_exporter_none_turns_a_signal_off(receiver: OtlpReceiver) -> None:
    setup = configured({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_TRACES_EXPORTER": "none"})
    assert setup.tracer_provider is None
    assert setup.traces_endpoint is None
    assert setup.meter_provider is not None
    setup.shutdown()
    assert receiver.to("/v1/traces") == []
    both_off = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": " None ",
    }
    assert_off(
        configure_otlp_from_env(both_off),
        "traces: OTEL_TRACES_EXPORTER does not select otlp; "
        "metrics: OTEL_METRICS_EXPORTER does not select otlp",
    )


def test_exporters_guarded_does_not_set_up_are_noted_not_refused(receiver: OtlpReceiver) -> None:
    setup = configured(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_TRACES_EXPORTER": "otlp,console",
            "OTEL_METRICS_EXPORTER": "prometheus",
        }
    )
    assert setup.tracer_provider is not None
    assert setup.meter_provider is None
    assert setup.notes == (
        "traces: OTEL_TRACES_EXPORTER names console, which guarded does not set up",
        "metrics: OTEL_METRICS_EXPORTER names prometheus, which guarded does not set up",
    )
    setup.shutdown()


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("localhost:4318", "http:// or https:// URL"),
        ("otel-collector", "http:// or https:// URL"),
        ("ftp://collector:4318", "http:// or https:// URL"),
        ("http://", "http:// or https:// URL"),
        ("http://collector:43x8", "not a valid URL"),
    ],
)
def test_bad_endpoint_is_a_clear_error_naming_the_variable(endpoint: str, expected: str) -> None:
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        with pytest.raises(OtlpConfigError, match=expected) as caught:
            configure_otlp_from_env({variable: endpoint})
        assert str(caught.value).startswith(variable + "=")


def test_endpoint_credentials_are_never_shown() -> None:
    with pytest.raises(OtlpConfigError) as caught:
        configure_otlp_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"ftp://user:{TOKEN}@collector/?key={TOKEN}"})
    assert TOKEN not in str(caught.value)
    assert "ftp://collector/" in str(caught.value)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "does not send JSON; use http/protobuf"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"},
            "TRACES_PROTOCOL='thrift': expected http/protobuf or grpc",
        ),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"}, "TIMEOUT='ten': expected a positive number of milliseconds"),
        ({"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "0"}, "expected a positive number of milliseconds"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}, "expected gzip or none"),
        (
            {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
            "CERTIFICATE='/nonexistent/ca.pem': no such file",
        ),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name"}, "OTEL_RESOURCE_ATTRIBUTES: entry 1 is not key=value"),
    ],
)
def test_bad_settings_are_clear_errors(variables: dict[str, str], expected: str) -> None:
    with pytest.raises(OtlpConfigError, match=expected):
        configure_otlp_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"} | variables)


@pytest.mark.parametrize(
    "headers",
    [f"Authorization Bearer {TOKEN}", f"x-ok=1,Bearer {TOKEN}=x", f"a=1,Authorization=Bearer%0A{TOKEN}"],
)
def test_malformed_headers_are_refused_without_showing_their_values(
    headers: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(OtlpConfigError, match="OTEL_EXPORTER_OTLP_HEADERS") as caught:
        configure_otlp_from_env(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318", "OTEL_EXPORTER_OTLP_HEADERS": headers}
        )
    assert TOKEN not in str(caught.value)
    assert TOKEN not in caplog.text


def test_grpc_without_the_grpc_exporter_says_what_to_install() -> None:
    with pytest.raises(OtlpExporterMissingError) as caught:
        configure_otlp_from_env(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        )
    assert isinstance(caught.value, ImportError)
    assert "opentelemetry-exporter-otlp-proto-grpc" in str(caught.value)
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in str(caught.value)


def test_missing_exporter_package_says_to_install_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ImportError, match=r"pip install 'guarded\[otlp\]'") as caught:
        configure_otlp_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"}, set_global=False)
    assert isinstance(caught.value, OtlpExporterMissingError)


# --- the global providers, each in a fresh interpreter ------------------------------------------------

GLOBAL_INSTALL = """
import asyncio, json
from opentelemetry import metrics, trace
from prometheus_client import CollectorRegistry
from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard
from guarded.otlp import configure_otlp_from_env

async def main():
    # guard() before configure: the tracing layer follows the global provider set later.
    async with guard(InMemoryStateStore(), name="global", registry=CollectorRegistry()) as store:
        setup = configure_otlp_from_env()
        await store.save_memory_state("k", {"v": 1})
    setup.shutdown()
    print(json.dumps({
        "tracer_is_global": trace.get_tracer_provider() is setup.tracer_provider,
        "meter_is_global": metrics.get_meter_provider() is setup.meter_provider,
        "notes": setup.notes,
    }))

asyncio.run(main())
"""

APPLICATION_PROVIDER = """
import asyncio, json
from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard
from guarded.otlp import configure_otlp_from_env

exporter = InMemorySpanExporter()
application = TracerProvider()
application.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(application)

async def main():
    setup = configure_otlp_from_env()
    async with guard(InMemoryStateStore(), name="app", registry=CollectorRegistry()) as store:
        await store.save_memory_state("k", {"v": 1})
    metrics.get_meter("test").create_counter("app_things").add(1)
    setup.shutdown()
    print(json.dumps({
        "setup_tracer_provider": repr(setup.tracer_provider),
        "application_kept": trace.get_tracer_provider() is application,
        "application_spans": [span.name for span in exporter.get_finished_spans()],
        "meter_is_ours": metrics.get_meter_provider() is setup.meter_provider,
        "notes": setup.notes,
    }))

asyncio.run(main())
"""


def run_script(source: str, receiver: OtlpReceiver) -> dict[str, Any]:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "subprocess",
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_providers_are_installed_globally_when_the_application_has_none(receiver: OtlpReceiver) -> None:
    result = run_script(GLOBAL_INSTALL, receiver)
    assert result == {"tracer_is_global": True, "meter_is_global": True, "notes": []}
    ((resource, _, span),) = receiver.spans()
    assert span.name == "save_memory_state"
    assert resource["service.name"] == "subprocess"


def test_an_application_tracer_provider_is_kept(receiver: OtlpReceiver) -> None:
    result = run_script(APPLICATION_PROVIDER, receiver)
    assert result == {
        "setup_tracer_provider": "None",
        "application_kept": True,
        "application_spans": ["save_memory_state"],
        "meter_is_ours": True,
        "notes": ["traces: the application already set a tracer provider; it was kept"],
    }
    assert receiver.to("/v1/traces") == []
    assert [metric.name for _, _, metric in receiver.metrics()] == ["app_things"]
