"""Run `guarded demo`, scrape its /metrics once a second, and plot what an operator would watch.

    .venv/bin/python -m pip install matplotlib   # not a dependency of the project
    .venv/bin/python scripts/plot_demo_metrics.py docs/images/demo-metrics.png

Three panels over the run: guarded calls per second by outcome, writes held in the dead-letter
buffer, and the circuit breaker's state. It prints the demo's wall time and verdict line.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

OUTCOMES = ("ok", "dead_lettered", "stale", "timeout", "circuit_open", "fallback", "rejected")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=2) as response:
        text = response.read().decode()
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return found


def main(out: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    started = time.monotonic()
    demo = subprocess.Popen(
        [sys.executable, "-m", "guarded", "demo", "--no-live", "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    times: list[float] = []
    calls: list[dict[str, float]] = []
    depth: list[float] = []
    circuit: list[float] = []
    while demo.poll() is None:
        try:
            sample = scrape(url)
        except OSError:
            time.sleep(0.5)
            continue
        times.append(time.monotonic() - started)
        by_outcome: dict[str, float] = defaultdict(float)
        for labels, value in sample.get("guarded_store_calls_total", {}).items():
            by_outcome[dict(labels).get("outcome", "")] += value
        calls.append(by_outcome)
        depth.append(sum(sample.get("guarded_deadletter_depth", {}).values()))
        states = sample.get("guarded_circuit_state", {})
        opened = (value for labels, value in states.items() if dict(labels).get("state") == "open")
        circuit.append(max(opened, default=0.0))
        time.sleep(1.0)
    output = demo.stdout.read() if demo.stdout else ""
    print(f"demo wall time: {time.monotonic() - started:.1f} s, exit {demo.returncode}")
    print(next((line for line in output.splitlines() if line.startswith("verdict")), "no verdict line"))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rates, held, breaker) = plt.subplots(
        3, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.5, 1]}
    )
    for outcome in OUTCOMES:
        series = [
            max(0.0, (calls[i][outcome] - calls[i - 1][outcome]) / (times[i] - times[i - 1]))
            for i in range(1, len(times))
        ]
        if any(series):
            rates.plot(times[1:], series, label=outcome)
    rates.set_ylabel("calls/s")
    rates.set_yscale("symlog")
    rates.legend(loc="upper left", ncol=4, fontsize=8)
    rates.set_title("guarded demo: guarded_store_calls_total by outcome (rate), scraped every second")
    held.plot(times, depth, color="tab:red")
    held.set_ylabel("held writes")
    held.set_title("guarded_deadletter_depth", fontsize=9)
    breaker.step(times, circuit, where="post", color="tab:purple")
    breaker.set_ylabel("open")
    breaker.set_title('guarded_circuit_state{state="open"}', fontsize=9)
    breaker.set_xlabel("seconds since the demo started")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/demo-metrics.png"))
