"""``/metrics`` for Prometheus: prometheus-client's own HTTP server on the demo's registry."""

from __future__ import annotations

from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


@dataclass
class MetricsServer:
    """A running exposition server; :meth:`close` stops it."""

    url: str
    port: int
    _server: WSGIServer
    _thread: Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` from a daemon thread (``port`` 0: a free
    port, see :attr:`MetricsServer.port`)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    bound = int(server.server_address[1])
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return MetricsServer(f"http://{shown}:{bound}/metrics", bound, server, thread)


__all__ = ["MetricsServer", "start_metrics_server"]
