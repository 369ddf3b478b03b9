"""OTLP export of traces and metrics, configured from the standard ``OTEL_*`` environment variables.

``configure_otlp_from_env()`` is the one call a guarded process needs to send its spans (one
CLIENT span per store call, see :mod:`guarded.layers.tracing`) and its OpenTelemetry metrics to an
OpenTelemetry Collector (``otel-collector.yaml``) or any OTLP backend::

    setup = configure_otlp_from_env(service_name="support-agent")
    try:
        ...  # guard(store) picks the global tracer provider up, even one set after guard()
    finally:
        setup.shutdown()  # flushes what is still queued

It installs nothing unless an OTLP endpoint is set (the setup it returns then exports nothing,
says why in ``notes`` and its ``shutdown()`` does nothing), and it never replaces a provider the
application already installed. Export is OTLP over HTTP with protobuf bodies (the
``opentelemetry-exporter-otlp-proto-http`` package, the ``guarded[otlp]`` extra). Header values
(tokens, API keys) are passed to the exporter and never logged, shown in an error or kept on the
returned object. The variables and their meaning follow the OpenTelemetry specification
("OTLP Exporter Configuration", "Environment Variable Specification"); docs/opentelemetry.md
lists them.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import unquote, urlsplit

from opentelemetry import metrics, trace
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import ProxyTracerProvider

from .errors import GuardedError
from .otlp_setup import OtlpSetup

__all__ = [
    "OtlpConfigError",
    "OtlpExporterMissingError",
    "OtlpSetup",
    "configure_otlp_from_env",
]

_log = logging.getLogger(__name__)

Signal = Literal["traces", "metrics"]

HTTP_PROTOBUF: Final = "http/protobuf"
GRPC: Final = "grpc"
_DEFAULT_TIMEOUT_MS: Final = 10_000.0
_SIGNAL_PATHS: Final[Mapping[Signal, str]] = {"traces": "v1/traces", "metrics": "v1/metrics"}
_EXPORTER_VARIABLES: Final[Mapping[Signal, str]] = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
}
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token (RFC 9110)
_HTTP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
_GRPC_PACKAGE = "opentelemetry-exporter-otlp-proto-grpc"


class OtlpConfigError(GuardedError, ValueError):
    """An ``OTEL_*`` variable holds a value guarded cannot use; the message names the variable.

    Header values and endpoint credentials are never part of the message.
    """


class OtlpExporterMissingError(GuardedError, ImportError):
    """The OTLP exporter package the configuration asks for is not installed."""


@dataclass(frozen=True, slots=True)
class _ExportSettings:
    """Where and how one signal is exported, resolved from the environment."""

    signal: Signal
    endpoint: str
    shown_endpoint: str
    protocol: str
    headers: Mapping[str, str] = field(repr=False)
    timeout_seconds: float
    compression: str
    certificate: str | None
    client_key: str | None
    client_certificate: str | None


def configure_otlp_from_env(
    environ: Mapping[str, str] = os.environ,
    *,
    service_name: str | None = None,
    set_global: bool = True,
) -> OtlpSetup:
    """Export traces and metrics over OTLP when the standard environment variables ask for it.

    A signal is exported when ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` (used as given) or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` or ``/v1/metrics`` appended) is set and
    ``OTEL_<SIGNAL>_EXPORTER`` is not ``none``. Traces go through a ``BatchSpanProcessor``;
    metrics through a ``PeriodicExportingMetricReader``. Also read from ``environ``:
    ``OTEL_EXPORTER_OTLP[_<SIGNAL>]_PROTOCOL``, ``_HEADERS``, ``_TIMEOUT`` (milliseconds, as the
    specification says), ``_COMPRESSION``, ``_CERTIFICATE``, ``_CLIENT_KEY``,
    ``_CLIENT_CERTIFICATE``, and ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_SDK_DISABLED``. The SDK reads its own tuning (``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``,
    ``OTEL_METRIC_EXPORT_INTERVAL``, temporality and exemplar settings) from the process
    environment.

    Args:
        environ: where the variables are read; the process environment by default.
        service_name: the ``service.name`` to use when neither ``OTEL_SERVICE_NAME`` nor
            ``OTEL_RESOURCE_ATTRIBUTES`` names one (the operator's setting wins).
        set_global: install the providers as the OpenTelemetry globals — only where the
            application has not installed its own, which is kept (the API allows one global
            provider per process, set once). With ``False`` nothing global is touched: pass
            ``setup.tracer_provider`` to ``guard(..., tracer_provider=...)`` to export guarded's
            spans over OTLP next to whatever the application set up.

    Returns:
        What was set up; call its ``shutdown()`` before the process exits to flush. When no
        signal is to be exported (no endpoint set, ``OTEL_SDK_DISABLED``, both exporters
        ``none``), nothing is created or installed: the setup's ``exporting`` is ``False``, its
        ``notes`` say why (also logged at INFO) and its ``shutdown()`` does nothing.

    Raises:
        OtlpConfigError: a variable holds an unusable value (the message names it).
        OtlpExporterMissingError: the exporter package for the protocol is not installed
            (``pip install 'guarded[otlp]'``; for ``grpc``, ``opentelemetry-exporter-otlp-proto-grpc``).
    """
    if _flag(environ, "OTEL_SDK_DISABLED"):
        return _off("OTEL_SDK_DISABLED is true", [], set_global)
    notes: list[str] = []
    signals: tuple[Signal, ...] = ("traces", "metrics")
    wanted = [settings for signal in signals if (settings := _export_settings(environ, signal, notes))]
    if not wanted:
        return _off(_off_reason(environ, signals), notes, set_global)
    resource = _resource(environ, service_name)
    classes = {settings.signal: _exporter_class(settings) for settings in wanted}  # fail before building
    by_signal = {settings.signal: settings for settings in wanted}
    tracer_provider = meter_provider = None
    if "traces" in by_signal:
        tracer_provider = _tracer_provider(
            by_signal["traces"], classes["traces"], resource, set_global, notes
        )
    if "metrics" in by_signal:
        meter_provider = _meter_provider(
            by_signal["metrics"], classes["metrics"], resource, set_global, notes
        )

    exported = {
        signal: settings
        for signal, settings in by_signal.items()
        if (tracer_provider if signal == "traces" else meter_provider) is not None
    }
    for settings in exported.values():
        _log.info(
            "OTLP %s export to %s (%s, %d header(s), service %s)",
            settings.signal,
            settings.shown_endpoint,
            settings.protocol,
            len(settings.headers),
            resource.attributes.get(SERVICE_NAME),
        )
    for note in notes:
        _log.info("OTLP %s", note)
    return OtlpSetup(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        traces_endpoint=exported["traces"].shown_endpoint if "traces" in exported else None,
        metrics_endpoint=exported["metrics"].shown_endpoint if "metrics" in exported else None,
        global_providers=set_global,
        notes=tuple(notes),
    )


def _off(reason: str, notes: list[str], set_global: bool) -> OtlpSetup:
    """The setup of a process that exports nothing over OTLP, saying why."""
    notes.append(f"export is off: {reason}")
    for note in notes:
        _log.info("OTLP %s", note)
    return OtlpSetup(
        tracer_provider=None,
        meter_provider=None,
        traces_endpoint=None,
        metrics_endpoint=None,
        global_providers=set_global,
        notes=tuple(notes),
    )


def _off_reason(environ: Mapping[str, str], signals: tuple[Signal, ...]) -> str:
    """Why none of ``signals`` is exported, when the SDK is not disabled."""
    with_endpoint = [signal for signal in signals if _value(environ, *_signal_variables(signal, "ENDPOINT"))]
    if not with_endpoint:
        return "no OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT, or a signal's own)"
    return "; ".join(
        f"{signal}: {_EXPORTER_VARIABLES[signal]} does not select otlp"
        if signal in with_endpoint
        else f"{signal}: no endpoint"
        for signal in signals
    )


def _tracer_provider(
    settings: _ExportSettings, exporter_class: Any, resource: Resource, set_global: bool, notes: list[str]
) -> TracerProvider | None:
    """A tracer provider batching spans to the OTLP exporter; ``None`` when the application's is kept."""
    if set_global and not isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        notes.append("traces: the application already set a tracer provider; it was kept")
        return None
    provider = TracerProvider(resource=resource)
    exporter: SpanExporter = exporter_class(**_exporter_arguments(settings))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:  # another thread won the one-time set
            provider.shutdown()
            notes.append("traces: another tracer provider was installed meanwhile; it was kept")
            return None
    return provider


def _meter_provider(
    settings: _ExportSettings, exporter_class: Any, resource: Resource, set_global: bool, notes: list[str]
) -> MeterProvider | None:
    """A meter provider exporting periodically over OTLP; ``None`` when the application's is kept."""
    if set_global and not isinstance(metrics.get_meter_provider(), _ProxyMeterProvider):
        notes.append("metrics: the application already set a meter provider; it was kept")
        return None
    exporter: MetricExporter = exporter_class(**_exporter_arguments(settings))
    provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(exporter)])
    if set_global:
        metrics.set_meter_provider(provider)
        if metrics.get_meter_provider() is not provider:
            provider.shutdown()
            notes.append("metrics: another meter provider was installed meanwhile; it was kept")
            return None
    return provider


# --- reading the environment ------------------------------------------------------------------------


def _value(environ: Mapping[str, str], *variables: str) -> tuple[str, str] | None:
    """The first of ``variables`` set to a non-blank value, as (variable, stripped value)."""
    for variable in variables:
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def _flag(environ: Mapping[str, str], variable: str) -> bool:
    """A boolean variable as the specification reads it: only ``true`` (any case) is true."""
    found = _value(environ, variable)
    if found is None:
        return False
    value = found[1].lower()
    if value not in ("true", "false"):
        _log.warning("%s=%r is neither true nor false; read as false", variable, found[1])
    return value == "true"


def _signal_variables(signal: Signal, suffix: str) -> tuple[str, str]:
    """The signal-specific variable, then the generic one (the specification's precedence)."""
    return f"OTEL_EXPORTER_OTLP_{signal.upper()}_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}"


def _export_settings(environ: Mapping[str, str], signal: Signal, notes: list[str]) -> _ExportSettings | None:
    specific, generic = _signal_variables(signal, "ENDPOINT")
    found = _value(environ, specific, generic)
    if found is None or not _otlp_selected(environ, signal, notes):
        return None
    variable, raw_endpoint = found

    protocol = _protocol(environ, signal)
    shown = _checked_endpoint(variable, raw_endpoint)
    endpoint = raw_endpoint
    if variable == generic and protocol == HTTP_PROTOBUF:
        endpoint = f"{raw_endpoint.removesuffix('/')}/{_SIGNAL_PATHS[signal]}"
        shown = f"{shown.removesuffix('/')}/{_SIGNAL_PATHS[signal]}"

    headers_found = _value(environ, *_signal_variables(signal, "HEADERS"))
    timeout_ms = _milliseconds(environ, _signal_variables(signal, "TIMEOUT"), _DEFAULT_TIMEOUT_MS)
    return _ExportSettings(
        signal=signal,
        endpoint=endpoint,
        shown_endpoint=shown,
        protocol=protocol,
        headers=_headers(*headers_found) if headers_found else {},
        timeout_seconds=timeout_ms / 1000.0,
        compression=_compression(environ, signal),
        certificate=_file(environ, _signal_variables(signal, "CERTIFICATE")),
        client_key=_file(environ, _signal_variables(signal, "CLIENT_KEY")),
        client_certificate=_file(environ, _signal_variables(signal, "CLIENT_CERTIFICATE")),
    )


def _otlp_selected(environ: Mapping[str, str], signal: Signal, notes: list[str]) -> bool:
    """``OTEL_<SIGNAL>_EXPORTER``: unset or naming ``otlp`` exports; ``none`` or only others do not.

    Other exporters (``console``, ``zipkin``, ...) are valid OpenTelemetry choices guarded does
    not set up; they are noted and logged, not refused.
    """
    variable = _EXPORTER_VARIABLES[signal]
    found = _value(environ, variable)
    if found is None:
        return True
    chosen = {part.strip().lower() for part in found[1].split(",") if part.strip()}
    if chosen == {"none"}:
        return False
    others = sorted(chosen - {"otlp", "none"})
    if others:
        note = f"{signal}: {variable} names {', '.join(others)}, which guarded does not set up"
        notes.append(note)
        _log.warning("OTLP %s; configure it in the application or with opentelemetry-instrument", note)
    return "otlp" in chosen


def _protocol(environ: Mapping[str, str], signal: Signal) -> str:
    found = _value(environ, *_signal_variables(signal, "PROTOCOL"))
    if found is None:
        return HTTP_PROTOBUF
    variable, value = found
    protocol = value.lower()
    if protocol in (HTTP_PROTOBUF, GRPC):
        return protocol
    if protocol == "http/json":
        raise OtlpConfigError(
            f"{variable}=http/json: the Python OTLP exporter does not send JSON; use {HTTP_PROTOBUF}"
        )
    raise OtlpConfigError(f"{variable}={value!r}: expected {HTTP_PROTOBUF} or {GRPC}")


def _checked_endpoint(variable: str, endpoint: str) -> str:
    """Validate an endpoint URL; return it without credentials, query or fragment (for display)."""
    shown = _without_secrets(endpoint)
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError as exc:
        raise OtlpConfigError(f"{variable}={shown!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtlpConfigError(
            f"{variable}={shown!r}: an OTLP endpoint is an http:// or https:// URL with a host, "
            "e.g. http://otel-collector:4318"
        )
    return shown


def _without_secrets(url: str) -> str:
    """``url`` without user info, query and fragment, which may carry credentials."""
    url = url.split("#", 1)[0].split("?", 1)[0]
    scheme, separator, rest = url.rpartition("://")
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    return f"{scheme}{separator}{authority}{slash}{path}"


def _headers(variable: str, raw: str) -> dict[str, str]:
    """Parse ``name=value,name2=value2`` (W3C baggage format, values URL-encoded).

    An error names the variable and the entry's position, never its text: the entry may be a
    token.
    """
    headers: dict[str, str] = {}
    for position, entry in enumerate(raw.split(","), start=1):
        if not entry.strip():
            continue
        name, separator, value = entry.partition("=")
        name = name.strip()
        if not separator or not _HEADER_NAME.fullmatch(name):
            raise OtlpConfigError(
                f"{variable}: entry {position} is not name=value with a valid header name "
                "(values are not shown)"
            )
        decoded = unquote(value.strip())
        if any(character in decoded for character in "\r\n\0"):
            raise OtlpConfigError(f"{variable}: the value of header {name!r} contains a line break or NUL")
        headers[name.lower()] = decoded
    return headers


def _milliseconds(environ: Mapping[str, str], variables: tuple[str, ...], default: float) -> float:
    found = _value(environ, *variables)
    if found is None:
        return default
    variable, value = found
    try:
        milliseconds = float(value)
    except ValueError:
        milliseconds = -1.0
    if not milliseconds > 0 or milliseconds == float("inf"):
        raise OtlpConfigError(f"{variable}={value!r}: expected a positive number of milliseconds")
    return milliseconds


def _compression(environ: Mapping[str, str], signal: Signal) -> str:
    found = _value(environ, *_signal_variables(signal, "COMPRESSION"))
    if found is None:
        return "none"
    variable, value = found
    if value.lower() not in ("gzip", "none"):
        raise OtlpConfigError(f"{variable}={value!r}: expected gzip or none")
    return value.lower()


def _file(environ: Mapping[str, str], variables: tuple[str, ...]) -> str | None:
    found = _value(environ, *variables)
    if found is None:
        return None
    variable, path = found
    if not os.path.isfile(path):
        raise OtlpConfigError(f"{variable}={path!r}: no such file")
    return path


def _resource(environ: Mapping[str, str], service_name: str | None) -> Resource:
    """Resource attributes: ``service_name`` < ``OTEL_RESOURCE_ATTRIBUTES`` < ``OTEL_SERVICE_NAME``."""
    attributes: dict[str, str] = {}
    if service_name:
        attributes[SERVICE_NAME] = service_name
    found = _value(environ, "OTEL_RESOURCE_ATTRIBUTES")
    if found is not None:
        for position, entry in enumerate(found[1].split(","), start=1):
            if not entry.strip():
                continue
            key, separator, value = entry.partition("=")
            if not separator or not key.strip():
                raise OtlpConfigError(f"OTEL_RESOURCE_ATTRIBUTES: entry {position} is not key=value")
            attributes[key.strip()] = unquote(value.strip())
    named = _value(environ, "OTEL_SERVICE_NAME")
    if named is not None:
        attributes[SERVICE_NAME] = named[1]
    return Resource.create(attributes)


# --- building exporters -------------------------------------------------------------------------------


def _exporter_class(settings: _ExportSettings) -> Any:
    """The exporter class for the signal and protocol, or a clear error when it is not installed."""
    kind = "trace_exporter" if settings.signal == "traces" else "metric_exporter"
    name = "OTLPSpanExporter" if settings.signal == "traces" else "OTLPMetricExporter"
    if settings.protocol == GRPC:
        module_name = f"opentelemetry.exporter.otlp.proto.grpc.{kind}"
        hint = (
            f"OTLP over gRPC needs {_GRPC_PACKAGE}, which guarded does not ship; install it, or set "
            f"OTEL_EXPORTER_OTLP_PROTOCOL={HTTP_PROTOBUF} and use the collector's HTTP port (4318)"
        )
    else:
        module_name = f"opentelemetry.exporter.otlp.proto.http.{kind}"
        hint = f"OTLP export needs {_HTTP_PACKAGE}: pip install 'guarded[otlp]'"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OtlpExporterMissingError(f"{hint} ({exc})", name=module_name) from exc
    return getattr(module, name)


def _exporter_arguments(settings: _ExportSettings) -> dict[str, Any]:
    """Constructor arguments, everything explicit so the exporter does not re-read the environment."""
    if settings.protocol == GRPC:
        # The gRPC exporter takes metadata as pairs, and an http:// endpoint means no TLS.
        return {
            "endpoint": settings.endpoint,
            "insecure": settings.endpoint.startswith("http://"),
            "headers": tuple(settings.headers.items()),
            "timeout": settings.timeout_seconds,
        }
    from opentelemetry.exporter.otlp.proto.http import Compression  # the extra is installed: checked above

    return {
        "endpoint": settings.endpoint,
        "headers": dict(settings.headers),
        "timeout": settings.timeout_seconds,
        "compression": Compression(settings.compression),
        "certificate_file": settings.certificate,
        "client_key_file": settings.client_key,
        "client_certificate_file": settings.client_certificate,
    }
