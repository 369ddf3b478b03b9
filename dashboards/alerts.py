"""Prometheus alert and recording rules for guarded, as code.

Every metric name comes from :mod:`guarded.observability.telemetry_names`, every alert name from its
``ALERT_*`` constants, and every label value the rules select on (outcomes, breaker states,
memory health, task event types) from the enum or tuple that defines it, so a rename can never
leave a rule silently matching nothing. ``python -m dashboards.alerts`` writes the rule file to
``grafana/`` + :data:`RULE_FILE_PATH`; tests/alerts/ checks it with ``promtool check rules``,
proves every alert with ``promtool test rules`` and fails when the committed file differs from
:func:`rule_file`. The runbook of each alert is a section of docs/alerts.md.

What counts as an error, a failed pause save or load and an ended task is decided once, in
:mod:`dashboards.semantics`, so an alert and the panel showing the same thing agree (the
reasoning is in docs/alerts.md):

* A call fails when its outcome is in ``ERROR_OUTCOMES``; ``not_found`` is an answer ("pause
  token expired"), not a failure, and ``cancelled`` is the caller's decision, counted neither way.
* A dead-lettered ``save_planner_state`` is a failed pause save: the write is acknowledged and
  kept on this host, but the pause is not in the database, so a resume handled by another
  worker does not find it (spec 002, "Planner pause/resume" across workers).
* A page (``critical``) must not fire on a database failover (tens of seconds): pause saves page
  only when they keep failing for minutes, once per (job, store); a single failed save or load is
  a ``warning`` ticket at once. Every alert's promtool tests run a 30 s failover to prove it.
* Counters appear on their first event (a failure series does not exist before the first
  failure), so "any failure in the window" counts the whole value of a series born in the window
  as well as the increase of older ones; otherwise the first failure of a process would never
  alert.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from guarded.deadletter.telemetry import LABEL_REASON
from guarded.layers.breaker import BreakerState
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome

from .promql import bucket, counter, eq, one_of
from .semantics import (
    ERROR_OUTCOMES,
    LOAD_PAUSE_METHOD,
    NEUTRAL_OUTCOMES,
    PARTITION_HORIZON_ALERT_SECONDS,
    PAUSE_LOAD_FAILURE_OUTCOMES,
    PAUSE_SAVE_FAILURE_OUTCOMES,
    REDIS_MEMORY_ALERT_RATIO,
    SAVE_PAUSE_METHOD,
    TASK_FAILED,
    TASK_TERMINAL_EVENTS,
)

RULE_FILE_PATH = "alerts/guarded-rules.yml"
"""Where the rule file is written, relative to ``grafana/``."""
RUNBOOK_DOC = "docs/alerts.md"
"""The runbooks, in this repository: an alert's runbook is this file's section of its name."""
PROJECT_URL = "https://github.com/guarded-dev/guarded"
"""Where the project is published (its documentation is the repository's ``docs/``)."""
DEFAULT_RUNBOOK_BASE = f"{PROJECT_URL}/blob/main/{RUNBOOK_DOC}"
"""The published runbooks every ``runbook_url`` starts with unless told otherwise: an absolute URL,
so the link in a page or a ticket opens from a phone. Override it with ``--runbook-base`` (or the
:data:`RUNBOOK_BASE_ENV` environment variable) to link your own copy, e.g. a wiki page or a
release tag's docs."""
RUNBOOK_BASE_ENV = "GUARDED_RUNBOOK_BASE"
"""Environment variable read by ``python -m dashboards.alerts`` for the runbook base URL."""

CRITICAL = "critical"
"""Severity that pages: data is being lost or users' flows are broken now."""
WARNING = "warning"
"""Severity for a ticket: degradation to look at within working hours."""

# --- label names ---------------------------------------------------------------------------------

LABEL_JOB = "job"
LABEL_INSTANCE = "instance"
LABEL_LE = "le"

PROCESS_LABELS: tuple[str, ...] = (LABEL_JOB, LABEL_INSTANCE, names.LABEL_STORE)
"""One guarded store in one process: breaker, dead-letter buffer and memory health are per process."""
METHOD_LABELS: tuple[str, ...] = (LABEL_JOB, names.LABEL_STORE, names.LABEL_METHOD)
"""One store method across the instances of a job: what the SLO is about."""

# --- planner pause ------------------------------------------------------------------------------

PAUSE_FAILURE_WINDOW = "5m"
"""A failed pause save or load raises a ticket at once and keeps it open this long."""
PAUSE_PAGE_WINDOW = "2m"
PAUSE_PAGE_FOR = "6m"
"""The page: pause saves failed within every ``PAUSE_PAGE_WINDOW`` for ``PAUSE_PAGE_FOR``, so
failures that go on for four minutes or more (or keep coming back within two minutes) page six
minutes after the first one. A database failover fails saves for seconds: its failures leave the
window long before the ``for`` is over, a ticket and no page. The window needs a scrape interval
of at most a minute."""
STORE_LABELS: tuple[str, ...] = (LABEL_JOB, names.LABEL_STORE)
"""One store across the instances of a job: an incident of its database pages once, not once per
instance or per outcome."""

# --- circuit breaker -----------------------------------------------------------------------------

NOT_CLOSED_STATES: tuple[BreakerState, ...] = (BreakerState.OPEN, BreakerState.HALF_OPEN)
"""During an outage the breaker cycles open -> half_open (probe fails) -> open, never closing;
counting only ``open`` would restart the alert's ``for`` at every probe."""
CIRCUIT_OPEN_FOR = "2m"
CIRCUIT_TRAFFIC_WINDOW = "5m"
"""The alert needs calls in this window: an idle breaker has nothing to protect, and with no
calls it can neither probe nor close, so its gauge may keep reading open."""
CIRCUIT_FORCED_OPEN_FOR = "15m"
"""``forced_open`` is an operator's choice: a reminder after this long, not a page."""

# --- dead-letter buffer --------------------------------------------------------------------------

DEADLETTER_DROP_WINDOW = "5m"
DEADLETTER_AGE_WARNING_SECONDS = 15 * 60
DEADLETTER_AGE_CRITICAL_SECONDS = 60 * 60
"""A write held an hour: the backend has been unreachable that long, or replay is stuck, and the
write exists only on this host."""

DEADLETTER_PARKED_WINDOW = "15m"
"""A parked write raises a ticket at once and keeps it open this long."""
REPLAY_STALLED_WINDOW = "5m"
REPLAY_STALLED_FOR = "10m"
"""Writes waiting while the breaker is closed and nothing was replayed in ``REPLAY_STALLED_WINDOW``,
for ``REPLAY_STALLED_FOR``: the backend answers, yet the held writes do not go back to it."""
REPLAY_STALLED_QUIET_SECONDS = 15 * 60
"""``REPLAY_STALLED_WINDOW`` plus ``REPLAY_STALLED_FOR``: how long nothing was replayed when it fires."""

# --- capacity: bulkhead, connection pool, batch queue --------------------------------------------

POOL_SATURATED_FOR = "10m"
"""Every call slot (bulkhead permits, or pool connections) busy at every scrape for this long. A
failover fills the pool for its few seconds, then it drains."""
BATCH_QUEUE_FULL_FOR = "5m"
"""The batcher's queue at capacity this long: new writes wait for space and are dead-lettered when
their deadline passes; write-behind writes already acknowledged are at risk if the process dies."""
BATCH_FAILURE_WINDOW = "15m"

# --- PostgreSQL read replicas --------------------------------------------------------------------

REPLICA_SKIPPED_WINDOW = "5m"
REPLICA_SKIPPED_FOR = "10m"
"""A replica left out at some check of every ``REPLICA_SKIPPED_WINDOW`` for ``REPLICA_SKIPPED_FOR``:
longer than a failover or a restart of the replica, which its checks get over within seconds."""
REPLICA_LABELS: tuple[str, ...] = (*PROCESS_LABELS, names.LABEL_SCHEMA)
"""One store's replicas in one process (which replica: the dashboard's "Replicas left out")."""

# --- PostgreSQL schema ---------------------------------------------------------------------------

SCHEMA_LABELS: tuple[str, ...] = (LABEL_JOB, names.LABEL_SCHEMA)
"""One PostgreSQL schema (tenant) as the processes of one job see it."""
SCHEMA_SKEW_FOR = "15m"
"""Longer than a rolling deployment: for a few minutes old and new code run side by side."""
PARTITION_TABLE_LABELS: tuple[str, ...] = (*SCHEMA_LABELS, names.LABEL_TABLE)
"""One partitioned table of one schema (the table label is a fixed set of four names)."""
PARTITION_HORIZON_MIN_SECONDS = PARTITION_HORIZON_ALERT_SECONDS
"""Maintenance keeps partitions a week ahead (hourly): a horizon closer than this means it has not
run for four days, with three left before rows would go to the default partition."""
PARTITION_HORIZON_FOR = "30m"

# --- a connection pooler in front of PostgreSQL ------------------------------------------------------

POOLER_ERRORS_WINDOW = "5m"
POOLER_ERRORS_FOR = "10m"
"""Pooler errors within every ``POOLER_ERRORS_WINDOW`` for ``POOLER_ERRORS_FOR``: a mismatch of the
store's ``pooler`` setting fails operations again and again; a single error (a pooler restarted
with other settings, then fixed) stays quiet."""
POOLER_LABELS: tuple[str, ...] = (*PROCESS_LABELS, names.LABEL_SCHEMA, names.LABEL_POOLER_ERROR_KIND)
"""One store's schema in one process, and the kind of mismatch (a fixed set)."""

# --- Redis nodes ----------------------------------------------------------------------------------

REDIS_NODE_LABELS: tuple[str, ...] = (LABEL_JOB, names.LABEL_STORE, names.LABEL_NODE)
"""One Redis node of one store as the processes of a job see it: every process samples the same
nodes, so a node incident alerts once, not once per process."""
REDIS_NODE_DOWN_FOR = "2m"
"""No process reached the node for this long: longer than a cluster failover (the failed master
leaves the topology once its replica is promoted) or a restart with an append-only file to load."""
REDIS_ERRORS_WINDOW = "5m"
REDIS_ERRORS_FOR = "10m"
"""Errors on a node within every ``REDIS_ERRORS_WINDOW`` for ``REDIS_ERRORS_FOR``: a failover's
READONLY and connection errors are over within a window; OOM or BUSY that keep coming are not."""
REDIS_MEMORY_FOR = "15m"
"""Memory above :data:`REDIS_MEMORY_ALERT_RATIO` of maxmemory this long: not a burst being expired."""
REDIS_EVICTION_WINDOW = "10m"
"""Any eviction in this window alerts at once, and the alert stays this long after the last one."""

# --- SLO and burn rates --------------------------------------------------------------------------

SLO_TARGET = 0.999
"""99.9% of the calls of each (store, method) succeed, over 30 days."""
ERROR_BUDGET = 0.001
"""``1 - SLO_TARGET``, written out so the rule file shows 0.001 rather than float noise."""
SLO_PERIOD_DAYS = 30


@dataclass(frozen=True, slots=True)
class BurnRateTier:
    """One multi-window burn-rate alert (Google SRE workbook, "Alerting on SLOs", table 5-8).

    Fires while both windows burn the error budget ``factor`` times faster than the SLO allows;
    the short window lets it resolve soon after the errors stop.
    """

    long_window: str
    short_window: str
    factor: float
    severity: str
    budget_spent: str
    """The share of the 30-day budget one long window at this rate spends (for the description)."""


BURN_RATE_TIERS: tuple[BurnRateTier, ...] = (
    BurnRateTier("1h", "5m", 14.4, CRITICAL, "2%"),
    BurnRateTier("6h", "30m", 6.0, WARNING, "5%"),
)
ERROR_RATIO_WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "6h")
"""Windows of the recorded error ratios (every window a tier uses)."""

# --- latency -------------------------------------------------------------------------------------

LATENCY_QUANTILE = 0.99
LATENCY_P99_THRESHOLD_SECONDS = 1.0
"""A store call is milliseconds when healthy; default deadlines are 5 s (15 s for pause saves)."""
LATENCY_WINDOW = "5m"
LATENCY_FOR = "10m"

# --- memory health -------------------------------------------------------------------------------

MEMORY_DEGRADED = "degraded"
"""Spec 003 ``MemoryHealth.DEGRADED``: summarization unavailable, memory truncated."""
MEMORY_DEGRADED_FOR = "10m"
"""The summarizer retries every 30 s while degraded; ten minutes is not a blip."""

# --- task failures -------------------------------------------------------------------------------

TASK_FAILURE_RATIO_THRESHOLD = 0.10
TASK_MIN_ENDED = 10
"""Fewer ended tasks than this in the window never alert: two failures out of five is noise."""
TASK_WINDOW = "15m"
TASK_FOR = "5m"
TASK_LABELS: tuple[str, ...] = (LABEL_JOB, names.LABEL_TASK_TYPE)

# --- series names --------------------------------------------------------------------------------

CALLS_TOTAL = counter(names.CALLS)
"""The calls counter as Prometheus exposes it (prometheus-client appends ``_total``)."""
CALL_DURATION_BUCKET = bucket(names.CALL_DURATION)


def error_ratio_record(window: str) -> str:
    """Name of the recorded error ratio of each (job, store, method) over ``window``."""
    return f"{'_'.join(METHOD_LABELS)}:{names.CALLS}:error_ratio_rate{window}"


LATENCY_P99_RECORD = f"{'_'.join(METHOD_LABELS)}:{names.CALL_DURATION}:p99_rate{LATENCY_WINDOW}"
"""Name of the recorded p99 call latency of each (job, store, method)."""


def runbook_url(alert: str, base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """The runbook of ``alert``: its section of docs/alerts.md (GitHub heading anchor) under ``base``."""
    return f"{base}#{alert.lower()}"


# --- PromQL --------------------------------------------------------------------------------------


def _selector(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def _by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})"


def _indent(expr: str) -> str:
    return "\n".join("  " + line for line in expr.splitlines())


def _sum_by(labels: Sequence[str], expr: str) -> str:
    if "\n" not in expr:
        return f"sum {_by(labels)} ({expr})"
    return f"sum {_by(labels)} (\n{_indent(expr)}\n)"


def _values(outcomes: Iterable[Outcome]) -> list[str]:
    return [outcome.value for outcome in outcomes]


_UNITS = {"s": (1, "second"), "m": (60, "minute"), "h": (3600, "hour")}


def in_words(duration: str | int) -> str:
    """A PromQL duration (``"5m"``) or a number of seconds in words (``"5 minutes"``), for the
    annotations, so they always say what the rule does."""
    seconds = duration if isinstance(duration, int) else int(duration[:-1]) * _UNITS[duration[-1]][0]
    for size, word in sorted(_UNITS.values(), reverse=True):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {word}{'' if count == 1 else 's'}"
    raise AssertionError("unreachable: every whole number of seconds is a number of seconds")


ALIVE = names.CIRCUIT_STATE
"""A series every guard exports from the moment it is built (one per breaker state, per store):
its presence says the process was up and scraped at that time."""


def events_in_window(selector: str, window: str, labels: Sequence[str]) -> str:
    """Events counted by ``selector`` in the last ``window``, summed ``by labels``.

    ``increase`` of the series that existed before the window, plus the whole value of series
    born inside it: a counter series appears on its first event, and ``increase`` of a series
    with a single distinct value is 0. A series is born when it was missing ``window`` ago while
    its process was up and scraped (:data:`ALIVE` present), or, in a process scraped for less
    than ``window``, when it has fewer samples in the window than its process's :data:`ALIVE`
    series (it appeared after the process's first scrape). A failed scrape or a Prometheus outage
    removes every series of the target alike, so it never makes an old failure series look new,
    while a restarted or newly started process creating the series on its first failure counts.
    A born series counts with its whole value (every event of it happened in the window), before
    ``or`` so that its ``increase``, which misses the value it was born with, does not replace it.
    """
    process = ", ".join(PROCESS_LABELS)
    missing_window_ago = (
        f"(\n  (\n    {selector}\n    unless\n    {selector} offset {window}\n  )\n"
        f"  and on ({process})\n  {ALIVE} offset {window}\n)"
    )
    fewer_samples_than_process = (
        f"(\n  {selector}\n  and\n  count_over_time({selector}[{window}])\n"
        f"  < on ({process}) group_left\n  min by ({process}) (count_over_time({ALIVE}[{window}]))\n)"
    )
    born = f"(\n{_indent(missing_window_ago)}\n  or\n{_indent(fewer_samples_than_process)}\n)"
    return _sum_by(labels, f"{born}\nor\nincrease({selector}[{window}]) > 0")


def error_ratio(window: str) -> str:
    """Failed calls / calls that were not neutral (cancelled), per (job, store, method); 0 without
    failures."""
    failed = _sum_by(
        METHOD_LABELS,
        f"rate({_selector(CALLS_TOTAL, one_of(names.LABEL_OUTCOME, _values(ERROR_OUTCOMES)))}[{window}])",
    )
    neutral = "|".join(sorted(_values(NEUTRAL_OUTCOMES)))
    counted = _selector(CALLS_TOTAL, f'{names.LABEL_OUTCOME}!~"{neutral}"')
    total = _sum_by(METHOD_LABELS, f"rate({counted}[{window}])")
    return f"(\n{_indent(failed)}\n  or\n  0 * {total}\n)\n/\n{total}"


# --- rules ---------------------------------------------------------------------------------------


def _alert(
    name: str,
    expr: str,
    *,
    severity: str,
    summary: str,
    description: str,
    for_: str | None = None,
    runbook_base: str = DEFAULT_RUNBOOK_BASE,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_ is not None:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": runbook_url(name, runbook_base),
    }
    return rule


def recording_rules() -> list[dict[str, Any]]:
    """Error ratios over every burn-rate window and the p99 latency, per (job, store, method)."""
    rules: list[dict[str, Any]] = [
        {"record": error_ratio_record(window), "expr": error_ratio(window)} for window in ERROR_RATIO_WINDOWS
    ]
    buckets = _sum_by([*METHOD_LABELS, LABEL_LE], f"rate({CALL_DURATION_BUCKET}[{LATENCY_WINDOW}])")
    rules.append(
        {
            "record": LATENCY_P99_RECORD,
            "expr": f"histogram_quantile(\n  {LATENCY_QUANTILE},\n{_indent(buckets)}\n)",
        }
    )
    return rules


def _pause_failures(method: str, outcomes: Iterable[Outcome], window: str, labels: Sequence[str]) -> str:
    selector = _selector(
        CALLS_TOTAL, eq(names.LABEL_METHOD, method), one_of(names.LABEL_OUTCOME, _values(outcomes))
    )
    return f"{events_in_window(selector, window, labels)}\n> 0"


_PAUSE_SAVE_IMPACT = (
    "The paused run is not in the database: a resume (human approval, OAuth callback) handled by "
    "another worker will not find it."
)


def pause_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Planner pause saves and loads that failed (spec 002: they break HITL and OAuth flows).

    A single failed save is a ticket (every database failover fails a few); saves failing for
    minutes page, once per (job, store) whatever the outcomes and instances.
    """
    window = PAUSE_FAILURE_WINDOW
    return [
        _alert(
            names.ALERT_PAUSE_SAVES_FAILING,
            _pause_failures(SAVE_PAUSE_METHOD, PAUSE_SAVE_FAILURE_OUTCOMES, PAUSE_PAGE_WINDOW, STORE_LABELS),
            for_=PAUSE_PAGE_FOR,
            severity=CRITICAL,
            summary="Planner pauses of store {{ $labels.store }} keep failing to save",
            description=(
                "save_planner_state calls on store {{ $labels.store }} (job {{ $labels.job }}) have "
                f"failed within every {in_words(PAUSE_PAGE_WINDOW)} for {in_words(PAUSE_PAGE_FOR)} "
                f"({{{{ $value | humanize }}}} in the last {in_words(PAUSE_PAGE_WINDOW)}). "
                + _PAUSE_SAVE_IMPACT
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_PAUSE_SAVE_FAILED,
            _pause_failures(SAVE_PAUSE_METHOD, PAUSE_SAVE_FAILURE_OUTCOMES, window, PROCESS_LABELS),
            severity=WARNING,
            summary="A planner pause could not be saved to store {{ $labels.store }}",
            description=(
                "{{ $value | humanize }} save_planner_state call(s) on store {{ $labels.store }} "
                f"({{{{ $labels.instance }}}}) failed in the last {in_words(window)}. " + _PAUSE_SAVE_IMPACT
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_PAUSE_LOAD_FAILED,
            _pause_failures(
                LOAD_PAUSE_METHOD, PAUSE_LOAD_FAILURE_OUTCOMES, window, [*PROCESS_LABELS, names.LABEL_OUTCOME]
            ),
            severity=WARNING,
            summary="Planner pauses could not be loaded from store {{ $labels.store }}",
            description=(
                "{{ $value | humanize }} load_planner_state call(s) on store {{ $labels.store }} "
                "({{ $labels.instance }}) ended {{ $labels.outcome }} "
                f"in the last {in_words(window)}: the "
                "store failed, so those resumes were answered as if the pause did not exist."
            ),
            runbook_base=runbook_base,
        ),
    ]


def circuit_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A breaker open (or probing) for minutes while calls arrive; a breaker forced open for long."""
    state = names.CIRCUIT_STATE
    not_closed = _selector(state, one_of(names.LABEL_STATE, [s.value for s in NOT_CLOSED_STATES]))
    calls = _sum_by(PROCESS_LABELS, f"increase({CALLS_TOTAL}[{CIRCUIT_TRAFFIC_WINDOW}])")
    forced = _selector(state, eq(names.LABEL_STATE, BreakerState.FORCED_OPEN.value))
    return [
        _alert(
            names.ALERT_CIRCUIT_OPEN,
            f"(max {_by(PROCESS_LABELS)} ({not_closed}) == 1)\n"
            f"and on ({', '.join(PROCESS_LABELS)})\n({calls} > 0)",
            for_=CIRCUIT_OPEN_FOR,
            severity=CRITICAL,
            summary=(
                "The circuit breaker of store {{ $labels.store }} has been open for "
                f"{in_words(CIRCUIT_OPEN_FOR)}"
            ),
            description=(
                "The breaker of store {{ $labels.store }} on {{ $labels.instance }} has not closed for "
                f"more than {in_words(CIRCUIT_OPEN_FOR)} while calls kept arriving: reads get their "
                "fallback at once and "
                "writes are held in the dead-letter buffer."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_CIRCUIT_OPEN,
            f"max {_by(PROCESS_LABELS)} ({forced}) == 1",
            for_=CIRCUIT_FORCED_OPEN_FOR,
            severity=WARNING,
            summary=(
                "The circuit breaker of store {{ $labels.store }} has been forced open for "
                f"{in_words(CIRCUIT_FORCED_OPEN_FOR)}"
            ),
            description=(
                "An operator forced the breaker of store {{ $labels.store }} on {{ $labels.instance }} "
                f"open more than {in_words(CIRCUIT_FORCED_OPEN_FOR)} ago and it is still refusing every "
                "call; reset it when the "
                "maintenance is over."
            ),
            runbook_base=runbook_base,
        ),
    ]


def deadletter_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Writes dropped (data loss) or refused at the buffer's limits, and writes held too long."""
    dropped = events_in_window(
        names.DLQ_DROPPED, DEADLETTER_DROP_WINDOW, [*PROCESS_LABELS, names.LABEL_METHOD, LABEL_REASON]
    )
    refused = events_in_window(
        names.DLQ_REFUSED, DEADLETTER_DROP_WINDOW, [*PROCESS_LABELS, names.LABEL_METHOD, LABEL_REASON]
    )
    oldest = f"max {_by(PROCESS_LABELS)} ({names.DLQ_OLDEST_AGE})"
    age_description = (
        "The oldest write held by the dead-letter buffer of store {{ $labels.store }} on "
        "{{ $labels.instance }} has waited {{ $value | humanizeDuration }} for replay; until it is "
        "replayed it exists only on that host."
    )
    return [
        _alert(
            names.ALERT_DEADLETTER_DROPS,
            f"{dropped}\n> 0",
            severity=CRITICAL,
            summary="The dead-letter buffer of store {{ $labels.store }} dropped writes (data loss)",
            description=(
                "{{ $value | humanize }} {{ $labels.method }} write(s) of store {{ $labels.store }} on "
                f"{{{{ $labels.instance }}}} were dropped in the last {in_words(DEADLETTER_DROP_WINDOW)} "
                "({{ $labels.reason }}): they "
                "were acknowledged to the caller and are lost."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_DEADLETTER_REFUSED,
            f"{refused}\n> 0",
            severity=CRITICAL,
            summary="The dead-letter buffer of store {{ $labels.store }} refuses writes it has no room for",
            description=(
                "{{ $value | humanize }} {{ $labels.method }} write(s) of store {{ $labels.store }} on "
                f"{{{{ $labels.instance }}}} were refused in the last {in_words(DEADLETTER_DROP_WINDOW)} "
                "({{ $labels.reason }}): the backend did not take them and the dead-letter buffer could "
                "not keep them. Their callers were answered refused; nothing kept was evicted."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_DEADLETTER_OLD,
            f"{oldest} > {DEADLETTER_AGE_WARNING_SECONDS}",
            severity=WARNING,
            summary=(
                "Writes of store {{ $labels.store }} have waited over "
                f"{in_words(DEADLETTER_AGE_WARNING_SECONDS)} for replay"
            ),
            description=age_description,
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_DEADLETTER_OLD,
            f"{oldest} > {DEADLETTER_AGE_CRITICAL_SECONDS}",
            severity=CRITICAL,
            summary=(
                "Writes of store {{ $labels.store }} have waited over "
                f"{in_words(DEADLETTER_AGE_CRITICAL_SECONDS)} for replay"
            ),
            description=age_description,
            runbook_base=runbook_base,
        ),
    ]


def _burn_rate_alert(tier: BurnRateTier, runbook_base: str) -> dict[str, Any]:
    threshold = f"({tier.factor:g} * {ERROR_BUDGET:g})"
    days = SLO_PERIOD_DAYS / tier.factor
    return _alert(
        names.ALERT_ERROR_BUDGET_BURN,
        f"{error_ratio_record(tier.long_window)} > {threshold}\n"
        f"and\n{error_ratio_record(tier.short_window)} > {threshold}",
        severity=tier.severity,
        summary=(
            "Store {{ $labels.store }} is burning the error budget of {{ $labels.method }} "
            f"{tier.factor:g}x too fast"
        ),
        description=(
            "{{ $value | humanizePercentage }} of the {{ $labels.method }} calls on store "
            f"{{{{ $labels.store }}}} failed over the last {tier.long_window} (and over the last "
            f"{tier.short_window}), {tier.factor:g} times the {ERROR_BUDGET * 100:g}% error budget of "
            f"the {SLO_TARGET * 100:g}% SLO: this spends {tier.budget_spent} of the {SLO_PERIOD_DAYS}-day "
            f"budget per {tier.long_window}, all of it in {days:.1f} days."
        ),
        runbook_base=runbook_base,
    )


def store_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Error-budget burn and p99 latency per (job, store, method)."""
    rules = [_burn_rate_alert(tier, runbook_base) for tier in BURN_RATE_TIERS]
    rules.append(
        _alert(
            names.ALERT_LATENCY_P99,
            f"{LATENCY_P99_RECORD} > {LATENCY_P99_THRESHOLD_SECONDS:g}",
            for_=LATENCY_FOR,
            severity=WARNING,
            summary=(
                "p99 latency of {{ $labels.method }} on store {{ $labels.store }} is above "
                f"{LATENCY_P99_THRESHOLD_SECONDS:g}s"
            ),
            description=(
                "The 99th percentile of {{ $labels.method }} calls on store {{ $labels.store }} "
                "(all attempts and backoff included) has been above "
                f"{LATENCY_P99_THRESHOLD_SECONDS:g}s for {LATENCY_FOR}; it is now "
                "{{ $value | humanizeDuration }}."
            ),
            runbook_base=runbook_base,
        )
    )
    return rules


def memory_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Short-term memory keys stuck in the ``degraded`` health state (spec 003)."""
    degraded = _selector(names.MEMORY_HEALTH_KEYS, eq(names.LABEL_HEALTH, MEMORY_DEGRADED))
    return [
        _alert(
            names.ALERT_MEMORY_DEGRADED,
            f"sum {_by(PROCESS_LABELS)} ({degraded}) > 0",
            for_=MEMORY_DEGRADED_FOR,
            severity=WARNING,
            summary="Short-term memory of store {{ $labels.store }} is degraded",
            description=(
                "Memory keys of store {{ $labels.store }} on {{ $labels.instance }} have been degraded "
                f"for {in_words(MEMORY_DEGRADED_FOR)} ({{{{ $value | humanize }}}} now): summarization is "
                "unavailable and those "
                "conversations keep only their most recent turns."
            ),
            runbook_base=runbook_base,
        )
    ]


def task_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A high share of ended tasks failing, once enough tasks ended to judge."""
    events = names.TASK_EVENTS
    failed = _sum_by(
        TASK_LABELS,
        f"increase({_selector(events, eq(names.LABEL_EVENT_TYPE, TASK_FAILED))}[{TASK_WINDOW}])",
    )
    terminal = _selector(events, one_of(names.LABEL_EVENT_TYPE, TASK_TERMINAL_EVENTS))
    ended = _sum_by(TASK_LABELS, f"increase({terminal}[{TASK_WINDOW}])")
    return [
        _alert(
            names.ALERT_TASK_FAILURE_RATIO,
            f"(\n{_indent(failed)}\n  /\n{_indent(ended)}\n) > {TASK_FAILURE_RATIO_THRESHOLD:g}\n"
            f"and on ({', '.join(TASK_LABELS)})\n{ended} >= {TASK_MIN_ENDED}",
            for_=TASK_FOR,
            severity=WARNING,
            summary="Many {{ $labels.task_type }} tasks are failing",
            description=(
                "{{ $value | humanizePercentage }} of the {{ $labels.task_type }} tasks that ended in "
                f"the last {TASK_WINDOW} (job {{{{ $labels.job }}}}) failed, above "
                f"{TASK_FAILURE_RATIO_THRESHOLD:.0%} for {TASK_FOR}."
            ),
            runbook_base=runbook_base,
        )
    ]


def parked_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Spill-file rows quarantined as unreadable and writes parked as bad data (neither replayed
    automatically), and held writes that the backend takes no more although it answers."""
    window = DEADLETTER_PARKED_WINDOW
    parked = events_in_window(names.DLQ_PARKED, window, [*PROCESS_LABELS, names.LABEL_METHOD])
    process = ", ".join(PROCESS_LABELS)
    closed = _selector(names.CIRCUIT_STATE, eq(names.LABEL_STATE, BreakerState.CLOSED.value))
    replayed = _sum_by(PROCESS_LABELS, f"increase({names.DLQ_REPLAYED}[{REPLAY_STALLED_WINDOW}])")
    quarantined = events_in_window(names.DLQ_QUARANTINED, window, PROCESS_LABELS)
    return [
        _alert(
            names.ALERT_DEADLETTER_QUARANTINED,
            f"{quarantined}\n> 0",
            severity=WARNING,
            summary="The spill file of store {{ $labels.store }} has unreadable rows",
            description=(
                "{{ $value | humanize }} row(s) of the dead-letter spill file of store {{ $labels.store }} "
                f"on {{{{ $labels.instance }}}} could not be read in the last {in_words(window)} and "
                "were moved to its quarantine table: the file is damaged, and those writes are not "
                "replayed."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_DEADLETTER_PARKED,
            f"{parked}\n> 0",
            severity=WARNING,
            summary="Writes of store {{ $labels.store }} were parked as bad data",
            description=(
                "{{ $value | humanize }} {{ $labels.method }} write(s) of store {{ $labels.store }} on "
                f"{{{{ $labels.instance }}}} were parked in the last {in_words(window)}: the backend "
                "refused their data, so they are kept on that host and never replayed on their own."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_REPLAY_STALLED,
            f"max {_by(PROCESS_LABELS)} ({names.DLQ_DEPTH}) > 0\n"
            f"and on ({process})\n(max {_by(PROCESS_LABELS)} ({closed}) == 1)\n"
            f"unless on ({process})\n({replayed} > 0)",
            for_=REPLAY_STALLED_FOR,
            severity=WARNING,
            summary="Held writes of store {{ $labels.store }} are not being replayed",
            description=(
                "{{ $value | humanize }} write(s) wait in the dead-letter buffer of store "
                "{{ $labels.store }} on {{ $labels.instance }}, its breaker is closed (the backend "
                f"answers), and nothing was replayed for {in_words(REPLAY_STALLED_QUIET_SECONDS)}: "
                "the writes exist only on that host until replay resumes."
            ),
            runbook_base=runbook_base,
        ),
    ]


def capacity_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Pool saturation (bulkhead or PostgreSQL pool), a full batch queue, writes a batch lost."""
    process = ", ".join(PROCESS_LABELS)

    def total(metric: str) -> str:
        return f"sum {_by(PROCESS_LABELS)} ({metric})"

    bulkhead_full = (
        f"(\n  {total(names.BULKHEAD_IN_USE)}\n  >= on ({process})\n  {total(names.BULKHEAD_LIMIT)}\n)\n"
        f"and on ({process})\n{total(names.BULKHEAD_QUEUE_DEPTH)} > 0"
    )
    pool_full = (
        f"{total(names.GUARDED_PG_POOL_IN_USE)}\n>= on ({process})\n{total(names.GUARDED_PG_POOL_MAX_SIZE)}"
    )
    batch_full = f"{total(names.BATCH_PENDING)}\n>= on ({process})\n{total(names.BATCH_CAPACITY)}"
    batch_failed = events_in_window(
        names.BATCH_FAILED_WRITES, BATCH_FAILURE_WINDOW, [*PROCESS_LABELS, names.LABEL_METHOD]
    )
    return [
        _alert(
            names.ALERT_POOL_SATURATED,
            f"(\n{_indent(bulkhead_full)}\n)\nor\n(\n{_indent(pool_full)}\n)",
            for_=POOL_SATURATED_FOR,
            severity=WARNING,
            summary=(
                "Store {{ $labels.store }} has used every backend connection for "
                f"{in_words(POOL_SATURATED_FOR)}"
            ),
            description=(
                "Every call slot of store {{ $labels.store }} on {{ $labels.instance }} (bulkhead "
                "permits with calls waiting in line, or PostgreSQL pool connections) has been busy for "
                f"{in_words(POOL_SATURATED_FOR)} ({{{{ $value | humanize }}}} in use): calls queue "
                "before the database, their latency grows and those that wait past their deadline "
                "time out (reads fall back, writes are held)."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_BATCH_QUEUE_FULL,
            batch_full,
            for_=BATCH_QUEUE_FULL_FOR,
            severity=WARNING,
            summary="The batch queue of store {{ $labels.store }} is full",
            description=(
                "The batcher of store {{ $labels.store }} on {{ $labels.instance }} has held its "
                f"maximum of {{{{ $value | humanize }}}} writes for {in_words(BATCH_QUEUE_FULL_FOR)}: "
                "new writes wait for space and are dead-lettered when their deadline passes, and "
                "acknowledged write-behind writes are lost if the process dies now."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_BATCH_WRITES_FAILED,
            f"{batch_failed}\n> 0",
            severity=CRITICAL,
            summary="Batched writes of store {{ $labels.store }} were dropped (data loss)",
            description=(
                "{{ $value | humanize }} {{ $labels.method }} write(s) of store {{ $labels.store }} on "
                f"{{{{ $labels.instance }}}} were dropped in the last {in_words(BATCH_FAILURE_WINDOW)}: "
                "the batch writer raised, so they were neither written nor held for replay; "
                "write-behind writes among them had been acknowledged and are lost."
            ),
            runbook_base=runbook_base,
        ),
    ]


def replica_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A read replica a store keeps leaving out of its reads."""
    skipped = f"rate({names.GUARDED_PG_REPLICA_SKIPPED_TOTAL}[{REPLICA_SKIPPED_WINDOW}])"
    return [
        _alert(
            names.ALERT_REPLICA_SKIPPED,
            f"sum {_by(REPLICA_LABELS)} ({skipped})\n> 0",
            for_=REPLICA_SKIPPED_FOR,
            severity=WARNING,
            summary="Store {{ $labels.store }} keeps leaving a read replica out of its reads",
            description=(
                "Store {{ $labels.store }} on {{ $labels.instance }} (schema {{ $labels.schema }}) has "
                f"left a read replica out of its reads for {in_words(REPLICA_SKIPPED_FOR)}: it is "
                "unreachable, further behind than replica_max_lag, not a standby, or failing reads "
                '(which one and why: "Replicas left out" on the Postgres backend dashboard). Its '
                "reads go to the primary, which carries the whole read load."
            ),
            runbook_base=runbook_base,
        )
    ]


def schema_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A process running code older than the schema another process migrated (version skew)."""
    newest = f"max {_by(SCHEMA_LABELS)} ({names.GUARDED_PG_MIGRATION_VERSION})"
    known = f"max {_by([*PROCESS_LABELS, names.LABEL_SCHEMA])} ({names.GUARDED_PG_SCHEMA_EXPECTED_VERSION})"
    return [
        _alert(
            names.ALERT_SCHEMA_VERSION_SKEW,
            f"{newest}\n> on ({', '.join(SCHEMA_LABELS)}) group_right\n{known}",
            for_=SCHEMA_SKEW_FOR,
            severity=WARNING,
            summary="{{ $labels.instance }} runs code older than schema {{ $labels.schema }}",
            description=(
                "Schema {{ $labels.schema }} has been migrated to version {{ $value }}, but the code "
                "of store {{ $labels.store }} on {{ $labels.instance }} only knows older versions, "
                f"for {in_words(SCHEMA_SKEW_FOR)}: an old deployment is still serving a schema it "
                "does not know, and it will refuse to start again (SchemaTooNewError)."
            ),
            runbook_base=runbook_base,
        )
    ]


def pooler_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A store whose connection settings keep failing on the pooler in front of PostgreSQL."""
    errors = f"increase({names.GUARDED_PG_POOLER_ERRORS_TOTAL}[{POOLER_ERRORS_WINDOW}])"
    return [
        _alert(
            names.ALERT_POOLER_MISMATCH,
            f"sum {_by(POOLER_LABELS)} ({errors})\n> 0",
            for_=POOLER_ERRORS_FOR,
            severity=WARNING,
            summary="Store {{ $labels.store }} does not suit the connection pooler in front of PostgreSQL",
            description=(
                "Operations of store {{ $labels.store }} on {{ $labels.instance }} (schema "
                "{{ $labels.schema }}) have kept failing on the connection pooler for "
                f"{in_words(POOLER_ERRORS_FOR)} ({{{{ $labels.kind }}}}: {{{{ $value | humanize }}}} in the "
                f"last {in_words(POOLER_ERRORS_WINDOW)}): a pooler in transaction mode sits in front of "
                "the server and the store "
                'is not connected with pooler="transaction" (GUARDED_PG_POOLER=transaction). Its writes '
                "are held and its reads answer stale or their fallback until the setting is changed."
            ),
            runbook_base=runbook_base,
        )
    ]


def partition_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A partitioned table whose newest partition ends within :data:`PARTITION_HORIZON_MIN_SECONDS`
    (the latest horizon any process saw: one process whose maintenance fails is not the schema's)."""
    horizon = f"max {_by(PARTITION_TABLE_LABELS)} ({names.GUARDED_PG_PARTITION_HORIZON})"
    days = PARTITION_HORIZON_MIN_SECONDS // 86400
    return [
        _alert(
            names.ALERT_PARTITION_HORIZON_NEAR,
            f"{horizon}\n- time()\n< {PARTITION_HORIZON_MIN_SECONDS}",
            for_=PARTITION_HORIZON_FOR,
            severity=WARNING,
            summary="Partitions of {{ $labels.schema }}.{{ $labels.table }} end in less than "
            + f"{days} days",
            description=(
                "The newest partition of table {{ $labels.table }} in schema {{ $labels.schema }} ends in "
                "{{ $value | humanizeDuration }}: partition maintenance has not created partitions ahead "
                f"(it keeps a week) for {in_words(PARTITION_HORIZON_FOR)} and more. Past that time rows go "
                "to the default partition: writes go on, but retention cannot drop those rows with a "
                "partition and creating their partition later has to move them."
            ),
            runbook_base=runbook_base,
        )
    ]


def redis_rules(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A Redis node no process reaches, commands failing on one node, memory near maxmemory, and a
    node evicting keys (every key a store writes has a TTL, so any eviction policy but noeviction
    may evict pauses)."""
    by_node = _by(REDIS_NODE_LABELS)
    up = f"max {by_node} ({names.GUARDED_REDIS_NODE_UP})"
    errors = f"increase({names.GUARDED_REDIS_NODE_ERRORS_TOTAL}[{REDIS_ERRORS_WINDOW}])"
    used = f"max {by_node} ({names.GUARDED_REDIS_MEMORY_USED_BYTES})"
    maxmemory = f"max {by_node} ({names.GUARDED_REDIS_MAXMEMORY_BYTES}) > 0"
    evicted = f"increase({names.GUARDED_REDIS_EVICTED_KEYS_TOTAL}[{REDIS_EVICTION_WINDOW}])"
    return [
        _alert(
            names.ALERT_REDIS_NODE_DOWN,
            f"{up}\n== 0",
            for_=REDIS_NODE_DOWN_FOR,
            severity=CRITICAL,
            summary="Redis node {{ $labels.node }} of store {{ $labels.store }} does not answer",
            description=(
                "No process of job {{ $labels.job }} has reached Redis node {{ $labels.node }} of store "
                f"{{{{ $labels.store }}}} for {in_words(REDIS_NODE_DOWN_FOR)}: the calls it serves time "
                "out, reads answer stale or their fallback and writes are held on the processes' hosts "
                "until it is back (a single server), or until a replica takes over its slots (a cluster)."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_REDIS_NODE_ERRORS,
            f"sum {_by([*REDIS_NODE_LABELS, names.LABEL_REDIS_ERROR_KIND])} ({errors})\n> 0",
            for_=REDIS_ERRORS_FOR,
            severity=WARNING,
            summary="Commands keep failing on Redis node {{ $labels.node }} of store {{ $labels.store }}",
            description=(
                "Commands of store {{ $labels.store }} have kept failing on Redis node {{ $labels.node }} "
                f"for {in_words(REDIS_ERRORS_FOR)} ({{{{ $labels.kind }}}}: {{{{ $value | humanize }}}} in "
                f"the last {in_words(REDIS_ERRORS_WINDOW)}). Writes that fail so are held and replayed; "
                "oom means the node is at maxmemory under noeviction, busy a script over its time limit, "
                "readonly writes sent to a replica (a failover not yet seen), loading a restart that does "
                "not end."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_REDIS_MEMORY_NEAR_MAX,
            f"{used}\n/ on ({', '.join(REDIS_NODE_LABELS)})\n({maxmemory})\n> {REDIS_MEMORY_ALERT_RATIO}",
            for_=REDIS_MEMORY_FOR,
            severity=WARNING,
            summary="Redis node {{ $labels.node }} of store {{ $labels.store }} is near its maxmemory",
            description=(
                "Redis node {{ $labels.node }} of store {{ $labels.store }} has used "
                "{{ $value | humanizePercentage }} of its maxmemory for "
                f"{in_words(REDIS_MEMORY_FOR)}. At maxmemory it refuses writes (noeviction: they are "
                "held and replayed) or evicts keys, pauses among them."
            ),
            runbook_base=runbook_base,
        ),
        _alert(
            names.ALERT_REDIS_EVICTING,
            f"sum {by_node} ({evicted})\n> 0",
            severity=CRITICAL,
            summary="Redis node {{ $labels.node }} of store {{ $labels.store }} is evicting keys",
            description=(
                "Redis node {{ $labels.node }} of store {{ $labels.store }} evicted "
                f"{{{{ $value | humanize }}}} key(s) in the last {in_words(REDIS_EVICTION_WINDOW)}: it is "
                "at maxmemory under an evicting maxmemory-policy, and every key the store writes has a "
                "TTL, so planner pauses and memory states may be gone before their resume or read."
            ),
            runbook_base=runbook_base,
        ),
    ]


RECORDING_GROUP = "guarded.recording"
"""The group of the recording rules the burn-rate and latency alerts read."""


def rule_file(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> dict[str, Any]:
    """The Prometheus rule file (``groups: [...]``) of every guarded recording and alert rule.

    ``runbook_base`` is what each ``runbook_url`` starts with: :data:`DEFAULT_RUNBOOK_BASE` (the
    project's published docs/alerts.md) by default; pass your own copy's URL to link it instead.
    """
    return {
        "groups": [
            {"name": RECORDING_GROUP, "rules": recording_rules()},
            {"name": "guarded.pause", "rules": pause_rules(runbook_base)},
            {"name": "guarded.store", "rules": [*circuit_rules(runbook_base), *store_rules(runbook_base)]},
            {
                "name": "guarded.deadletter",
                "rules": [*deadletter_rules(runbook_base), *parked_rules(runbook_base)],
            },
            {"name": "guarded.capacity", "rules": capacity_rules(runbook_base)},
            {
                "name": "guarded.schema",
                "rules": [*schema_rules(runbook_base), *partition_rules(runbook_base)],
            },
            {"name": "guarded.replicas", "rules": replica_rules(runbook_base)},
            {"name": "guarded.memory", "rules": memory_rules(runbook_base)},
            {"name": "guarded.tasks", "rules": task_rules(runbook_base)},
            {"name": "guarded.pooler", "rules": pooler_rules(runbook_base)},
            {"name": "guarded.redis", "rules": redis_rules(runbook_base)},
        ]
    }


# --- rendering -----------------------------------------------------------------------------------

HEADER = (
    "# Generated by `python -m dashboards` (or `python -m dashboards.alerts`) from dashboards/alerts.py: "
    "do not edit.\n"
    "# Runbooks: docs/alerts.md. Tests: grafana/alerts/tests/ (promtool test rules).\n"
)


class _RuleDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (PromQL) as literal blocks, and never anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_RuleDumper.add_representer(str, _represent_str)


def render(document: dict[str, Any] | None = None) -> str:
    """The rule file as YAML text, byte-for-byte the same on every run."""
    body = yaml.dump(
        rule_file() if document is None else document,
        Dumper=_RuleDumper,
        sort_keys=False,
        width=1000,
        allow_unicode=True,
    )
    return HEADER + body


def default_path() -> Path:
    """``grafana/alerts/guarded-rules.yml`` of this checkout."""
    return Path(__file__).resolve().parent.parent / "grafana" / RULE_FILE_PATH


def write(path: Path | str | None = None, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> Path:
    """Write the rule file to ``path`` (default :func:`default_path`); returns the path."""
    target = default_path() if path is None else Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(rule_file(runbook_base)), encoding="utf-8")
    return target


def is_absolute_url(url: str) -> bool:
    """Whether ``url`` is an absolute ``http``/``https`` URL with a host."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dashboards.alerts [--runbook-base URL] [PATH]``: write the rule file."""
    parser = argparse.ArgumentParser(
        prog="python -m dashboards.alerts", description="Write the Prometheus rule file of guarded's alerts."
    )
    parser.add_argument("path", nargs="?", type=Path, help=f"output file (default: {default_path()})")
    parser.add_argument(
        "--runbook-base",
        default=os.environ.get(RUNBOOK_BASE_ENV) or DEFAULT_RUNBOOK_BASE,
        metavar="URL",
        help=(
            "absolute http(s) URL of the published runbooks (docs/alerts.md); each runbook_url is "
            f"URL#<alert in lower case> (default: ${RUNBOOK_BASE_ENV}, else {DEFAULT_RUNBOOK_BASE})"
        ),
    )
    args = parser.parse_args(argv)
    if not is_absolute_url(args.runbook_base):
        parser.error(
            f"--runbook-base must be an absolute http(s) URL, not {args.runbook_base!r} "
            "(a runbook link in a page must open from anywhere)"
        )
    print(write(args.path, args.runbook_base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
