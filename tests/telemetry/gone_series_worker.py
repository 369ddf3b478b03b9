"""A worker of the gone-series test (run with ``PROMETHEUS_MULTIPROC_DIR`` set).

``python -m tests.telemetry.gone_series_worker live|gone``: exports a ``livemin`` and a
``livemostrecent`` scrape-time gauge of store ``agents`` (``live``: 1 and 7, ``gone``: 1 and 5)
and writes them; ``gone`` then stops exporting both series (its store went away) and writes
again. The writer's thread is kept out of the way, so the writes happen exactly when this says.
Prints ``ready`` and waits for a line on stdin before it exits.
"""

from __future__ import annotations

import sys

from prometheus_client import CollectorRegistry

from guarded.observability import multiprocess_metrics
from guarded.observability import telemetry_names as names
from guarded.observability.scrape_time_gauges import scrape_time_gauge

multiprocess_metrics._writer._interval = 3600.0  # no timer write during the test

registry = CollectorRegistry()
spill = scrape_time_gauge(registry, names.DLQ_SPILL_AVAILABLE, "Spill usable.", [names.LABEL_STORE])
rows = scrape_time_gauge(registry, names.GUARDED_PG_TABLE_ROWS, "Rows.", [names.LABEL_STORE])
gone = sys.argv[1] == "gone"
spill.set_function(["agents"], lambda: 1.0)
rows.set_function(["agents"], lambda: 5.0 if gone else 7.0)
multiprocess_metrics.write_scrape_time_metrics()
if gone:
    spill.remove(["agents"])
    rows.remove(["agents"])
    multiprocess_metrics.write_scrape_time_metrics()
print("ready", flush=True)
sys.stdin.readline()
