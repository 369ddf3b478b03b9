"""The live check: a real Prometheus scrapes a short ``guarded demo`` run with the alert rules loaded.

Everything is asked while the demo still serves ``/metrics`` (once a target is gone its series
go stale and instant queries answer nothing). The module fixture runs the demo in-process on an
embedded PostgreSQL with Prometheus scraping it every second, and meanwhile

* lets the fault schedule run: it first locks ``planner_pauses`` so pause saves miss their
  deadline (no fault before that window can make a pause save fail), then kills connections,
  locks every table and sends bad payloads;
* once every fault has ended, looks for the firing ``GuardedPlannerPauseSaveFailed``, runs every
  panel query of every dashboard until each has returned a finite value, and reads every rule's
  health and every annotation query's answer.

Beside it a guarded Redis store (tests/live/redis_workload.py) saves and resumes pauses and
writes memory on a real ``redis-server``, served on a second ``/metrics`` target, so the Redis
dashboard's panels have series too.

The tests judge what it saw: every panel returned data, every rule evaluated without error, the
pause-save alert fired (and only after the pause saves were made to fail), and every annotation
query is valid PromQL, the pause-save one showing the firing alert.
"""

from __future__ import annotations

import asyncio
import io
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.build import all_dashboards, annotation_queries, panel_queries
from guarded.demo import DemoOptions, DemoResult, parse_schedule, run_demo
from guarded.demo.runner import STORE_NAME
from guarded.observability import telemetry_names as names
from guarded.testing.postgres import EmbeddedPostgres
from guarded.testing.redis import RedisServer

from .prometheus_server import PrometheusError, PrometheusServer, free_port, prometheus_server
from .redis_workload import redis_workload

RULE_FILE = Path(__file__).resolve().parents[2] / "grafana" / "alerts" / "guarded-rules.yml"
DURATION = 28.0
SCHEDULE = "pause-fail@4:3,kill@12:1,slow@14:1.5,bad@17"
"""The pause-fail window comes first and alone: its failed saves (about 2 s into it) are alerted on
before the next fault starts. The other faults give the error panels something to show."""
RATE_INTERVAL = "1m"
"""``$__rate_interval``: longer than the whole run, so each window holds every one-second scrape
since the demo started and rare events (a failed task, a fault's effect) stay in view."""
ALERT_BUDGET = 5.0
"""Seconds to wait for the pause-save alert once every fault has ended, long after the pause-fail
window (without a ``for``, the alert fires at the first evaluation that sees a failed save)."""
PANEL_BUDGET = 5.0
"""Seconds the fixture keeps re-running panel queries that have not returned data yet."""
PAUSE_SAVE_ALERT = names.ALERT_PAUSE_SAVE_FAILED
FAULT_STARTED = re.compile(r"fault: ([a-z-]+) started")
FAULT_OVER = " over: "
"""In the line the demo prints when a fault has ended (``[ 10.9s] fault: kill over: ...``)."""

Answer = list[dict[str, Any]] | str
"""An instant query's samples, or the error Prometheus gave."""


@dataclass(frozen=True)
class Query:
    dashboard: str
    title: str
    expr: str

    def describe(self) -> str:
        return f"{self.dashboard} / {self.title!r}: {self.expr}"


def _queries(kind: Callable[..., list[tuple[str, str]]]) -> list[Query]:
    return [
        Query(dashboard["title"], title, expr)
        for dashboard in all_dashboards()
        for title, expr in kind(dashboard, rate_interval=RATE_INTERVAL)
    ]


PANELS = _queries(panel_queries)
ANNOTATIONS = _queries(annotation_queries)


@dataclass
class Observed:
    """What the live Prometheus answered while the demo ran."""

    panels: dict[Query, Answer] = field(default_factory=dict)
    """Each panel query's first answer with a finite value, else its last answer."""
    annotations: dict[Query, Answer] = field(default_factory=dict)
    rule_groups: list[dict[str, Any]] = field(default_factory=list)
    pause_alert_series: list[dict[str, Any]] = field(default_factory=list)
    """``ALERTS{alertname=<pause save>, alertstate="firing"}`` when it first answered."""
    pause_alert: list[dict[str, Any]] = field(default_factory=list)
    """The pause-save alert as ``/api/v1/alerts`` listed it then."""
    serving_at_end: bool = False
    """Whether the demo's target was still up once the last query had been answered."""


@dataclass
class LiveRun:
    observed: Observed
    result: DemoResult
    output: str
    started: dict[str, float]
    """Wall time at which each kind of fault first started."""


class DemoOutput(io.StringIO):
    """The demo's progress lines; notes the wall time each kind of fault first started (the line is
    printed within 0.2 s) and counts the faults that ended."""

    def __init__(self) -> None:
        super().__init__()
        self.started: dict[str, float] = {}
        self.faults_over = 0

    def write(self, text: str) -> int:
        for kind in FAULT_STARTED.findall(text):
            self.started.setdefault(kind, time.time())
        self.faults_over += text.count(FAULT_OVER)
        return super().write(text)


def finite(answer: Answer) -> bool:
    """Whether an answer holds at least one sample with a finite value (not NaN, not ±Inf)."""
    return not isinstance(answer, str) and any(math.isfinite(float(s["value"][1])) for s in answer)


def _answer(prometheus: PrometheusServer, expr: str) -> Answer:
    try:
        return prometheus.query(expr)
    except PrometheusError as exc:
        return f"error: {exc}"


def _poll(check: Callable[[], Any], *, timeout: float, stop: threading.Event) -> Any:
    """``check()``'s first truthy result, polled every 0.5 s; ``None`` after ``timeout`` or ``stop``."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    return None


def observe(
    prometheus: PrometheusServer, target: str, demo_over: threading.Event, faults_over: Callable[[], bool]
) -> Observed:
    """Everything the tests judge, asked while the demo serves ``target`` (an unanswered wait is
    recorded as it stands, for the tests to report)."""
    seen = Observed()

    def serving() -> bool:
        return not demo_over.is_set() and any(target in url for url in prometheus.targets_up())

    _poll(serving, timeout=30, stop=demo_over)
    if _poll(faults_over, timeout=DURATION, stop=demo_over):
        time.sleep(2)  # two more scrapes, so the panels see what the last fault did
    firing = f'ALERTS{{alertname="{PAUSE_SAVE_ALERT}", alertstate="firing"}}'
    seen.pause_alert_series = (
        _poll(lambda: prometheus.query(firing), timeout=ALERT_BUDGET, stop=demo_over) or []
    )
    seen.pause_alert = [
        alert for alert in prometheus.alerts() if alert["labels"]["alertname"] == PAUSE_SAVE_ALERT
    ]
    pending = list(PANELS)
    deadline = time.monotonic() + PANEL_BUDGET
    while pending and not demo_over.is_set():
        for query in list(pending):
            seen.panels[query] = _answer(prometheus, query.expr)
            if finite(seen.panels[query]):
                pending.remove(query)
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    seen.rule_groups = prometheus.rule_groups()
    seen.annotations = {query: _answer(prometheus, query.expr) for query in ANNOTATIONS}
    seen.serving_at_end = serving()
    return seen


@pytest.fixture(scope="module")
def live_run() -> Iterator[LiveRun]:
    faults = parse_schedule(SCHEDULE, DURATION)
    server = EmbeddedPostgres(settings={"synchronous_commit": "on"})
    server.start()
    redis = RedisServer()
    redis.start()
    try:
        port, redis_port = free_port(), free_port()
        target = f"127.0.0.1:{port}"
        options = DemoOptions(
            duration=DURATION, concurrency=8, faults=SCHEDULE, metrics_port=port, live=False, seed=3
        )
        out = DemoOutput()
        with prometheus_server([target, f"127.0.0.1:{redis_port}"], [RULE_FILE]) as prometheus:

            async def run_and_observe() -> tuple[DemoResult, Observed]:
                demo_over = threading.Event()
                async with redis_workload(redis, redis_port):  # the Redis dashboard's series
                    demo = asyncio.create_task(run_demo(options, server=server, out=out))
                    demo.add_done_callback(lambda _: demo_over.set())
                    try:
                        observed = await asyncio.to_thread(
                            observe, prometheus, target, demo_over, lambda: out.faults_over >= len(faults)
                        )
                    finally:
                        result = await demo
                return result, observed

            result, observed = asyncio.run(run_and_observe())
        yield LiveRun(observed, result, out.getvalue(), out.started)
    finally:
        redis.stop()
        server.destroy()


def test_the_demo_served_metrics_until_the_checks_ended(live_run: LiveRun) -> None:
    assert live_run.observed.serving_at_end, (
        "the demo stopped serving /metrics before the checks ended: lengthen DURATION\n" + live_run.output
    )
    assert live_run.result.verdict.passed, live_run.result.verdict.to_dict()


@pytest.mark.parametrize("query", PANELS, ids=lambda query: f"{query.dashboard}/{query.title}")
def test_every_panel_query_returns_data(live_run: LiveRun, query: Query) -> None:
    answer = live_run.observed.panels.get(query, "never asked: the demo ended first")
    assert finite(answer), f"panel {query.describe()}\nreturned no finite value: {answer}"


def test_every_rule_evaluates_without_error(live_run: LiveRun) -> None:
    rules = [(group["name"], rule) for group in live_run.observed.rule_groups for rule in group["rules"]]
    assert {rule["name"] for _, rule in rules if rule["type"] == "alerting"} == set(names.ALERT_NAMES)
    broken = [
        f"{group} / {rule['name']}: health {rule['health']!r}, lastError {rule.get('lastError')!r}\n"
        f"  {rule['query']}"
        for group, rule in rules
        if rule["health"] != "ok" or rule.get("lastError")
    ]
    assert not broken, "rules that did not evaluate cleanly:\n" + "\n".join(broken)


def test_the_pause_save_alert_has_no_pending_period() -> None:
    rules = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))
    [rule] = [
        rule for group in rules["groups"] for rule in group["rules"] if rule.get("alert") == PAUSE_SAVE_ALERT
    ]
    assert rule.get("for") in (None, "0s"), f"{PAUSE_SAVE_ALERT} waits {rule['for']} before firing"
    assert rule["labels"]["severity"] == "warning"  # the ticket; GuardedPlannerPauseSavesFailing pages


def test_the_pause_save_alert_fires_when_pause_saves_fail(live_run: LiveRun) -> None:
    observed = live_run.observed
    assert observed.pause_alert_series, (
        f'ALERTS{{alertname="{PAUSE_SAVE_ALERT}", alertstate="firing"}} returned nothing '
        f"{ALERT_BUDGET}s after the last fault although pause saves failed ({_pause_fail_effect(live_run)})\n"
        f"alerts: {observed.pause_alert}"
    )
    labels = [series["metric"] for series in observed.pause_alert_series]
    assert {label["store"] for label in labels} == {STORE_NAME}, labels
    assert {label["severity"] for label in labels} == {"warning"}, labels
    assert all("outcome" not in label for label in labels), labels  # every failing outcome together
    held = [alert for alert in observed.pause_alert if alert["state"] == "firing"]
    assert len(held) == 1, f"expected one firing alert for the failed pause saves: {observed.pause_alert}"
    dead_lettered = held[0]
    began, next_fault = live_run.started["pause-fail"], live_run.started["kill"]
    active = _unix(dead_lettered["activeAt"])
    assert began <= active < next_fault, (
        f"{PAUSE_SAVE_ALERT} became active at {dead_lettered['activeAt']}: not between the "
        f"start of the pause-fail window ({_iso(began)}) and the next fault ({_iso(next_fault)})"
    )


def test_the_pause_fail_window_made_pause_saves_fail(live_run: LiveRun) -> None:
    effect = _pause_fail_effect(live_run)
    failed = int(effect.split("; ")[-1].split()[0])
    assert failed > 0, effect


def _pause_fail_effect(live_run: LiveRun) -> str:
    [effect] = [record.effect for record in live_run.result.verdict.faults if record.kind == "pause-fail"]
    return effect


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()


def _unix(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time from Prometheus' API (nanoseconds dropped)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("query", ANNOTATIONS, ids=lambda query: f"{query.dashboard}/{query.title}")
def test_every_annotation_query_evaluates(live_run: LiveRun, query: Query) -> None:
    answer = live_run.observed.annotations[query]
    assert not isinstance(answer, str), f"annotation {query.describe()}\nfailed: {answer}"
    if PAUSE_SAVE_ALERT in query.expr:
        shown = {series["metric"]["alertname"] for series in answer}
        assert PAUSE_SAVE_ALERT in shown, f"annotation {query.describe()}\ndoes not show the firing alert"
