"""A real OTLP/HTTP receiver for the tests: a stdlib HTTP server on a free local port.

It answers ``POST /v1/traces`` and ``POST /v1/metrics`` (and any other path) the way an
OpenTelemetry Collector does, with an empty protobuf export response, and keeps every request
(path, headers, decompressed body) for the test to decode with ``opentelemetry.proto``.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

_RESPONSES = {
    "/v1/traces": ExportTraceServiceResponse().SerializeToString(),
    "/v1/metrics": ExportMetricsServiceResponse().SerializeToString(),
}


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    """The request body, gunzipped when it came with ``Content-Encoding: gzip``."""
    raw_body: bytes


class OtlpReceiver:
    """``with OtlpReceiver() as receiver: ... receiver.url ... receiver.requests``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[Received] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                headers = {name.lower(): value for name, value in self.headers.items()}
                with receiver._lock:
                    receiver._requests.append(Received(self.path, headers, body, raw))
                response = _RESPONSES.get(self.path, b"")
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(response)))
                self.end_headers()
                self.wfile.write(response)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output quiet

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="otlp-receiver", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._requests)

    def to(self, path: str) -> list[Received]:
        return [request for request in self.requests if request.path == path]

    def spans(self, path: str = "/v1/traces") -> list[tuple[dict[str, Any], str, Span]]:
        """Every span received, as (resource attributes, scope name, span)."""
        found = []
        for request in self.to(path):
            message = ExportTraceServiceRequest.FromString(request.body)
            for resource_spans in message.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    found += [(resource, scope_spans.scope.name, span) for span in scope_spans.spans]
        return found

    def metrics(self, path: str = "/v1/metrics") -> list[tuple[dict[str, Any], str, Metric]]:
        """Every metric received, as (resource attributes, scope name, metric)."""
        found = []
        for request in self.to(path):
            message = ExportMetricsServiceRequest.FromString(request.body)
            for resource_metrics in message.resource_metrics:
                resource = attributes(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    found += [
                        (resource, scope_metrics.scope.name, metric) for metric in scope_metrics.metrics
                    ]
        return found

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    """OTLP key/values as a plain dict."""
    return {pair.key: value_of(pair.value) for pair in pairs}


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
