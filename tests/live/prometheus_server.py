"""A real Prometheus server for the live dashboard and alert checks.

Starts the ``prometheus`` binary (Debian package ``prometheus``; ``make test`` installs it) on a
free loopback port with a one-second scrape and rule-evaluation interval, scraping the given
targets and loading the given rule files, and answers PromQL through its HTTP API.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

SCRAPE_INTERVAL = "1s"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrometheusError(RuntimeError):
    """The server did not start, or a query failed."""


class PrometheusServer:
    """A running server: :meth:`query` evaluates PromQL, :meth:`alerts` lists alert states."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def _get(self, path: str, **params: str) -> Any:
        address = f"{self.url}{path}"
        if params:
            address += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(address, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
            raise PrometheusError(f"{path} {params}: {body.get('error', body)}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant-vector (or scalar as one sample) result of ``expr`` now."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"{expr!r} returned a {data['resultType']}")

    def alerts(self) -> list[dict[str, Any]]:
        """Active (pending or firing) alerts."""
        return list(self._get("/api/v1/alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        """Every loaded rule group with each rule's health and last error."""
        return list(self._get("/api/v1/rules")["groups"])

    def targets_up(self) -> list[str]:
        """Scrape URLs whose last scrape succeeded."""
        active = self._get("/api/v1/targets")["activeTargets"]
        return [target["scrapeUrl"] for target in active if target["health"] == "up"]

    def wait_until(self, check: Any, *, timeout: float, what: str) -> Any:
        """Poll ``check()`` every 0.5 s until it returns something truthy; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise PrometheusError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.5)


@contextmanager
def prometheus_server(targets: Sequence[str], rule_files: Sequence[Path] = ()) -> Iterator[PrometheusServer]:
    """Run Prometheus scraping ``targets`` (``host:port``) with ``rule_files`` loaded."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError(
            "the prometheus binary is not on PATH: run `make tools` (installs the Debian package "
            "'prometheus' as root) or install it yourself"
        )
    with tempfile.TemporaryDirectory(prefix="guarded-prometheus-") as work:
        root = Path(work)
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": "guarded", "static_configs": [{"targets": list(targets)}]}],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        log = root / "prometheus.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-lifecycle",
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        server = PrometheusServer(f"http://127.0.0.1:{port}", process, log)
        try:
            _wait_ready(server)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(server: PrometheusServer) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise PrometheusError(f"prometheus exited: {server.log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    tail = server.log.read_text(errors="replace")[-2000:]
    raise PrometheusError(f"prometheus not ready after 30 s: {tail}")
