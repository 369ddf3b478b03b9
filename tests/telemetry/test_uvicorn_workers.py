"""``uvicorn --workers 2`` with ``PROMETHEUS_MULTIPROC_DIR`` set: whichever worker answers the
scrape, ``/metrics`` counts the guarded calls of both (:mod:`tests.telemetry.uvicorn_app`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.killed_process import REPO

WAIT = 60.0
"""Seconds uvicorn has to start, and the workers' writes to reach the scrape, on a loaded machine."""

REQUESTS = 40
UVICORN = (sys.executable, "-m", "uvicorn", "tests.telemetry.uvicorn_app:app", "--workers", "2")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ok_saves(text: str) -> float:
    """``guarded_store_calls_total`` of ``save_memory_state`` answered ``ok`` on the store ``web``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "guarded_store_calls"
        for sample in family.samples
        if sample.labels == {"store": "web", "method": "save_memory_state", "outcome": "ok"}
    )


def test_one_scrape_counts_the_calls_of_every_uvicorn_worker(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "uvicorn.log").open("w") as log:
        server = subprocess.Popen(
            [*UVICORN, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert server.poll() is None, (tmp_path / "uvicorn.log").read_text()
            try:
                httpx.get(f"{base}/metrics/", timeout=5.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "uvicorn answers within the deadline"
                time.sleep(0.2)
        workers = set()
        for _ in range(REQUESTS):
            with httpx.Client() as client:  # a new connection each time: either worker may take it
                answer = client.get(f"{base}/save", timeout=10.0)
                assert answer.status_code == 200
                workers.add(answer.text)
        counted = 0.0
        while counted != REQUESTS and time.monotonic() < deadline + WAIT:
            counted = ok_saves(httpx.get(f"{base}/metrics/", timeout=10.0).text)
            time.sleep(0.2)
        assert counted == REQUESTS, f"{REQUESTS} calls through {len(workers)} worker(s), {counted} counted"
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(WAIT)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
