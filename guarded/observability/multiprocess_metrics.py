"""prometheus-client's multiprocess mode for the metrics guarded computes at scrape time.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``uvicorn --workers N``, gunicorn), prometheus-client's own
instruments write each change to files of their process in that directory, and a
``MultiProcessCollector`` adds up the files of every process when one of them is scraped. Most of
guarded's metrics are not such instruments: the hot path bumps plain integers and a collector
turns them into samples when it is scraped (the calls, their latency and retries, the bulkhead,
the dead-letter buffer, the batchers, the breaker's state). Every such collector is registered
through :func:`register_scrape_time`; in multiprocess mode a thread of each process writes their
samples into its files every :data:`WRITE_INTERVAL` seconds and once more when the process
exits, in the form prometheus-client writes its own (a counter's total, a histogram's buckets
one by one and its sum, a gauge under the mode
:func:`~guarded.observability.telemetry_names.gauge_multiprocess_mode` names), so the scrape adds
them up with everything else. Outside multiprocess mode nothing here runs.

What the mode cannot carry: exemplars (prometheus-client keeps none in its files), and a scrape
sees each process as of its last write (at most :data:`WRITE_INTERVAL` old).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, values
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.registry import Collector

from .rate_limited_log import RateLimitedLog
from .telemetry_names import gauge_multiprocess_mode

WRITE_INTERVAL = 1.0
"""Seconds between two writes of a process's scrape-time metrics into the multiprocess directory."""

FAILURE_LOG_INTERVAL = 300.0
"""Seconds between two warnings of the same failure to collect or write (the first is logged at once)."""

logger = logging.getLogger(__name__)

_MOST_RECENT = ("mostrecent", "livemostrecent")
_MAX = ("max", "livemax")
_MIN = ("min", "livemin")


def multiprocess_mode() -> bool:
    """Whether prometheus-client runs in multiprocess mode in this process (it decides when it is
    first imported, from ``PROMETHEUS_MULTIPROC_DIR``)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def register_scrape_time(registry: CollectorRegistry, collector: Collector) -> None:
    """Register ``collector`` (one that computes its samples when collected) with ``registry``,
    and in multiprocess mode have its samples written to this process's files as well."""
    registry.register(collector)
    if multiprocess_mode():
        _writer.watch(collector)


def forget_series(metric: MetricWrapperBase, *label_values: str) -> None:
    """Stop exporting one series of a prometheus-client counter or histogram (a closed store's, a
    node's that left). In multiprocess mode its counts stay in the process's files as counts of
    an exited process do (prometheus-client cannot remove them and warns), so it is left as it is."""
    if multiprocess_mode():
        return
    with contextlib.suppress(KeyError):
        metric.remove(*label_values)


def write_scrape_time_metrics() -> None:
    """Write this process's scrape-time metrics into the multiprocess directory now (the thread
    does it every :data:`WRITE_INTERVAL` seconds and at exit); nothing outside multiprocess mode."""
    if multiprocess_mode():
        _writer.write()


@dataclass(frozen=True, slots=True)
class _SampleKey:
    """Where one sample goes: prometheus-client's file key, and the file (type and gauge mode)."""

    kind: str
    metric: str
    sample: str
    label_names: tuple[str, ...]
    label_values: tuple[str, ...]
    documentation: str
    mode: str


class ScrapeTimeWriter:
    """Writes the samples of the watched collectors into this process's multiprocess files."""

    def __init__(self, interval: float = WRITE_INTERVAL) -> None:
        self._interval = interval
        self._collectors: weakref.WeakSet[Collector] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._values: dict[_SampleKey, object] = {}
        self._written: dict[_SampleKey, float | None] = {}
        """What was last written of each sample (``None``: that it is gone); a sample that has not
        changed since is not written again."""
        self._gauges_written: set[_SampleKey] = set()
        self._baseline: dict[_SampleKey, float] = {}
        """Counts inherited from a parent process at ``fork`` (the parent wrote them already)."""
        self._thread: threading.Thread | None = None
        self._exit_hooked = False
        self._failures = RateLimitedLog(FAILURE_LOG_INTERVAL, log=logger)

    def watch(self, collector: Collector) -> None:
        """Write ``collector``'s samples from now on, for as long as it is alive."""
        with self._lock:
            self._collectors.add(collector)
            self._start()

    def write(self) -> None:
        """Write every watched collector's current samples."""
        with self._lock:
            samples = self._collect()
            gone = self._gauges_written - samples.keys()
            for key in gone:
                # A series that is gone must not count in the combined gauge (its last value would
                # linger): 0 adds nothing to a sum nor to the maximum of guarded's gauges (none is
                # negative), +inf nothing to a minimum, and a most recent sample dated 0 is never
                # the most recent.
                samples[key] = math.inf if key.mode in _MIN else 0.0
            now = time.time()
            for key, value in samples.items():
                value -= self._baseline.get(key, 0.0)
                written: float | None = None if key in gone else value
                if key in self._written and self._written[key] == written:
                    continue  # unchanged since its last write
                self._written[key] = written
                found = self._values.get(key)
                if found is None:
                    found = self._values[key] = values.ValueClass(
                        key.kind,
                        key.metric,
                        key.sample,
                        key.label_names,
                        key.label_values,
                        key.documentation,
                        multiprocess_mode=key.mode,
                    )
                if key.mode in _MOST_RECENT:
                    found.set(value, 0.0 if key in gone else now)  # type: ignore[attr-defined]
                else:
                    found.set(value, None)  # type: ignore[attr-defined]
            self._gauges_written = {key for key in samples if key.kind == "gauge"}

    def before_fork(self) -> None:
        """Before ``fork()``: wait for a write under way to end, and hold off the next one until
        the fork is done, so that no child starts with prometheus-client's lock (or this writer's)
        held by a thread it does not have (its first metric write would wait for ever)."""
        self._lock.acquire()

    def after_fork_in_parent(self) -> None:
        """After ``fork()``, in the parent: writes go on."""
        self._lock.release()

    def after_fork(self) -> None:
        """In a forked child: the parent's counts are the parent's (it writes them), so this
        process writes only what it adds from here; the parent's thread did not come along."""
        self._lock = threading.Lock()
        self._values.clear()
        self._written.clear()
        self._gauges_written.clear()
        self._thread = None
        if self._collectors:
            self._baseline = {key: value for key, value in self._collect().items() if key.kind != "gauge"}
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="guarded-multiprocess-metrics", daemon=True
            )
            self._thread.start()
        if not self._exit_hooked:
            self._exit_hooked = True
            atexit.register(self._at_exit)

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            self._write_logging_failures()

    def _at_exit(self) -> None:
        self._write_logging_failures()
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory:
            with contextlib.suppress(OSError):  # its live gauges go with it
                mark_process_dead(os.getpid(), directory)  # type: ignore[no-untyped-call]

    def _write_logging_failures(self) -> None:
        try:
            self.write()
        except Exception as exc:
            self._failures.log(
                ("write", type(exc).__name__),
                logging.WARNING,
                "could not write guarded's metrics to the multiprocess directory: %s",
                type(exc).__name__,
                extra={"event": "multiprocess_metrics_not_written", "error_type": type(exc).__name__},
            )

    def _collect(self) -> dict[_SampleKey, float]:
        samples: dict[_SampleKey, float] = {}
        for collector in list(self._collectors):
            try:
                families = list(collector.collect())
            except Exception as exc:  # one collector's failure leaves the others' samples
                self._failures.log(
                    ("collect", type(collector).__name__, type(exc).__name__),
                    logging.WARNING,
                    "could not collect %s for the multiprocess directory: %s",
                    type(collector).__name__,
                    type(exc).__name__,
                    extra={"event": "multiprocess_metrics_not_collected", "error_type": type(exc).__name__},
                )
                continue
            for family in families:
                for key, value in _family_samples(family):
                    samples[key] = _combined(key, samples.get(key), value)
        return samples


def _family_samples(family: object) -> Iterator[tuple[_SampleKey, float]]:
    """The samples of one collected family as prometheus-client's multiprocess files hold them."""
    kind: str = family.type  # type: ignore[attr-defined]
    name: str = family.name  # type: ignore[attr-defined]
    documentation: str = family.documentation  # type: ignore[attr-defined]
    mode = gauge_multiprocess_mode(name) if kind == "gauge" else ""
    previous_bucket: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in family.samples:  # type: ignore[attr-defined]
        labels = dict(sample.labels)
        if kind == "counter" and not sample.name.endswith("_total"):
            continue  # ``_created``: the files have none
        if kind == "histogram":
            if sample.name.endswith("_bucket"):
                bound = labels.pop("le")
                series = tuple(sorted(labels.items()))
                cumulative = float(sample.value)
                below = previous_bucket.get(series, 0.0)
                previous_bucket[series] = cumulative
                label_names = (*labels, "le")
                label_values = (*labels.values(), bound)
                value = cumulative - below  # the files hold each bucket's own count
                yield (
                    _SampleKey(kind, name, sample.name, label_names, label_values, documentation, mode),
                    value,
                )
                continue
            if not sample.name.endswith("_sum"):
                continue  # ``_count`` is the buckets' total, ``_created`` is not kept
        elif kind not in ("counter", "gauge"):
            continue
        key = _SampleKey(kind, name, sample.name, tuple(labels), tuple(labels.values()), documentation, mode)
        yield key, float(sample.value)


def _combined(key: _SampleKey, earlier: float | None, value: float) -> float:
    """Two samples of one series from two collectors of this process (two registries)."""
    if earlier is None:
        return value
    if key.mode in _MAX:
        return max(earlier, value)
    if key.mode in _MIN:
        return min(earlier, value)
    if key.mode in _MOST_RECENT:
        return value
    return earlier + value


_writer = ScrapeTimeWriter()
os.register_at_fork(
    before=_writer.before_fork,
    after_in_parent=_writer.after_fork_in_parent,
    after_in_child=_writer.after_fork,
)

__all__ = [
    "WRITE_INTERVAL",
    "ScrapeTimeWriter",
    "forget_series",
    "multiprocess_mode",
    "register_scrape_time",
    "write_scrape_time_metrics",
]
