"""The StateStore overview dashboard: what ``guard()`` sees of every call, and what it holds back.

Spec 002 ("Observability") asks operators to watch state store latency and error rates per
operation and, above all, pause save/load failures, which break human-in-the-loop and OAuth
flows. The rows follow the guard's layers: calls, breaker and retries, planner pauses, the
dead-letter buffer, batching, stale cache and memory health.
"""

from __future__ import annotations

from guarded.deadletter.telemetry import LABEL_LOCATION, LABEL_REASON
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome

from . import promql as q
from .model import (
    AlertAnnotation,
    Dashboard,
    Panel,
    Query,
    QueryVariable,
    Row,
    SeriesStyle,
    Threshold,
    ValueText,
)
from .provisioning import PROMETHEUS_NAME, PROMETHEUS_UID
from .semantics import (
    CIRCUIT_STATE_CODES,
    DEADLETTER_AGE_CRITICAL_SECONDS,
    DEADLETTER_AGE_WARNING_SECONDS,
    ERROR_OUTCOMES,
    LATENCY_P99_ALERT_SECONDS,
    LOAD_PAUSE_METHOD,
    MEMORY_HEALTH_COLORS,
    OUTCOME_COLORS,
    PAUSE_LOAD_FAILURE_OUTCOMES,
    PAUSE_METHODS,
    PAUSE_SAVE_FAILURE_OUTCOMES,
    SAVE_PAUSE_METHOD,
)

UID = "guarded-store-overview"
INSTANCE = "instance"
SCOPE = q.Scope((INSTANCE, names.LABEL_STORE))
STORE = (names.LABEL_STORE,)
STORE_METHOD = (names.LABEL_STORE, names.LABEL_METHOD)
INSTANCE_STORE = (INSTANCE, names.LABEL_STORE)

CALLS = q.counter(names.CALLS)
ERRORS = q.one_of(names.LABEL_OUTCOME, (outcome.value for outcome in ERROR_OUTCOMES))
PAUSES = q.one_of(names.LABEL_METHOD, PAUSE_METHODS)

PAUSE_ALERTS = (names.ALERT_PAUSE_SAVES_FAILING, names.ALERT_PAUSE_SAVE_FAILED, names.ALERT_PAUSE_LOAD_FAILED)
STORE_ALERTS = (
    names.ALERT_CIRCUIT_OPEN,
    names.ALERT_DEADLETTER_DROPS,
    names.ALERT_DEADLETTER_REFUSED,
    names.ALERT_DEADLETTER_OLD,
    names.ALERT_DEADLETTER_PARKED,
    names.ALERT_DEADLETTER_QUARANTINED,
    names.ALERT_REPLAY_STALLED,
    names.ALERT_ERROR_BUDGET_BURN,
    names.ALERT_LATENCY_P99,
    names.ALERT_MEMORY_DEGRADED,
    names.ALERT_POOL_SATURATED,
    names.ALERT_BATCH_QUEUE_FULL,
    names.ALERT_BATCH_WRITES_FAILED,
)


def _values(outcomes: tuple[Outcome, ...]) -> str:
    return ", ".join(outcome.value for outcome in outcomes)


def _calls_rate(*matchers: str) -> str:
    return q.rate(SCOPE.selector(CALLS, *matchers))


def _calls_panels() -> tuple[Panel, ...]:
    all_calls = q.sum_by(STORE_METHOD, _calls_rate())
    errors = q.or_zero(q.sum_by(STORE_METHOD, _calls_rate(ERRORS)), all_calls)
    error_list = _values(ERROR_OUTCOMES)
    latency = q.bucket(names.CALL_DURATION)
    quantile_help = (
        "Latency of logical calls: all attempts, backoff and waiting included, every outcome counted "
        "(calls refused by an open breaker are instant). Dots are exemplars: click one to open that "
        "call's trace in Tempo. Latency near the deadline (GuardConfig.timeout.deadline, 5 s by "
        "default, 15 s for save_planner_state) means calls are about to time out: check the Postgres "
        "dashboard's acquire wait and pool use."
    )
    return (
        Panel(
            title="Calls per second by method",
            description=(
                "Logical StateStore calls per second (a retried call counts once). A drop to zero while "
                "agents are running means calls no longer reach the guard; a burst of writes shows up in "
                "the Batching row as pending writes."
            ),
            queries=(Query(all_calls, "{{store}} {{method}}"),),
            unit="ops",
        ),
        Panel(
            title="Outcomes",
            description=(
                "Calls per second by how they ended. ok/retried/not_found were answered by the backend "
                "(not_found is an answer: key absent or pause token expired). "
                f"{error_list} are errors: the caller got a fallback, a stale value, a write parked for "
                "replay or a refusal of bad data. cancelled means the caller gave up."
            ),
            queries=(Query(q.sum_by((names.LABEL_OUTCOME,), _calls_rate()), "{{outcome}}"),),
            unit="ops",
            stacked=True,
            series=tuple(
                SeriesStyle(f"^{outcome.value}$", color=color) for outcome, color in OUTCOME_COLORS.items()
            ),
        ),
        Panel(
            title="Errors per second by method",
            description=(
                f"Calls per second that ended in an error outcome ({error_list}). Find the outcome in "
                "the Outcomes panel: timeout means the backend is slow, circuit_open that the breaker "
                "stopped calling it, dead_lettered that writes are parked for replay (Dead letters row), "
                "rejected that callers sent data the backend refuses (fix the caller)."
            ),
            queries=(Query(errors, "{{store}} {{method}}"),),
            unit="ops",
        ),
        Panel(
            title="Error ratio by method",
            description=(
                f"Share of calls that ended in an error outcome ({error_list}). The error-budget alert "
                "fires when this burns too fast. Above a few percent, open the Outcomes panel to see "
                "which failure it is and the Postgres dashboard to see whether the database is the cause."
            ),
            queries=(Query(q.ratio(errors, all_calls), "{{store}} {{method}}"),),
            unit="percentunit",
            maximum=1,
            thresholds=(Threshold("yellow", 0.01), Threshold("red", 0.05)),
        ),
        *(
            Panel(
                title=f"p{round(quantile * 100)} latency by method",
                description=quantile_help,
                queries=(
                    Query(
                        q.quantile(quantile, STORE_METHOD, SCOPE.selector(latency)),
                        "{{store}} {{method}}",
                        True,
                    ),
                ),
                unit="s",
                width=8,
                thresholds=(Threshold("red", LATENCY_P99_ALERT_SECONDS),) if quantile == 0.99 else (),
            )
            for quantile in (0.5, 0.95, 0.99)
        ),
    )


def _circuit_state_expr() -> str:
    states = " or ".join(
        f"({SCOPE.selector(names.CIRCUIT_STATE, q.eq(names.LABEL_STATE, state.value))} == 1) * {code}"
        for state, code, _color in CIRCUIT_STATE_CODES
    )
    return q.max_by(INSTANCE_STORE, states)


def _breaker_panels() -> tuple[Panel, ...]:
    all_calls = q.sum_by(STORE_METHOD, SCOPE.selector(CALLS))
    return (
        Panel(
            title="Circuit state",
            description=(
                "The breaker of each store in each process. open: the backend failed too often, so "
                "reads return their fallback at once and writes go to the dead-letter buffer; half_open: "
                "probes are testing the backend; forced_open/disabled: set by an operator. Fix the "
                "backend (see the Postgres dashboard); the breaker closes by itself once probes succeed."
            ),
            queries=(Query(_circuit_state_expr(), "{{store}} @ {{instance}}"),),
            kind="state-timeline",
            unit="none",
            value_texts=tuple(
                ValueText(code, state.value, color) for state, code, color in CIRCUIT_STATE_CODES
            ),
        ),
        Panel(
            title="Circuit transitions",
            description=(
                "Breaker state changes per interval. Repeated open / half_open / open flapping means "
                "the backend keeps failing its probes: fix the backend rather than loosening the "
                "breaker (GuardConfig.breaker)."
            ),
            queries=(
                Query(
                    q.or_zero(
                        q.sum_by(STORE, q.increase(SCOPE.selector(q.counter(names.CIRCUIT_TRANSITIONS)))),
                        q.max_by(STORE, SCOPE.selector(names.CIRCUIT_STATE)),
                    ),
                    "{{store}}",
                ),
            ),
            decimals=0,
        ),
        Panel(
            title="Retries per second by method",
            description=(
                "Extra attempts after a retryable error (connection loss, timeout, serialization "
                "failure, deadlock). Retries hide transient errors from callers but add latency and "
                "load; a sustained rate means the backend is degrading: check the Postgres dashboard's "
                "connection errors. load_planner_state is only retried with an idempotency key."
            ),
            queries=(
                Query(
                    q.or_zero(
                        q.sum_by(STORE_METHOD, q.rate(SCOPE.selector(q.counter(names.RETRIES)))), all_calls
                    ),
                    "{{store}} {{method}}",
                ),
            ),
            unit="ops",
            width=24,
        ),
    )


def _pause_panels() -> tuple[Panel, ...]:
    pause_calls = q.sum_by(STORE_METHOD, SCOPE.selector(CALLS, PAUSES))

    def failed(method: str, outcomes: tuple[Outcome, ...]) -> str:
        matchers = (
            q.eq(names.LABEL_METHOD, method),
            q.one_of(names.LABEL_OUTCOME, (o.value for o in outcomes)),
        )
        return q.sum_by(STORE_METHOD, q.increase(SCOPE.selector(CALLS, *matchers)))

    failures = (
        f"{failed(SAVE_PAUSE_METHOD, PAUSE_SAVE_FAILURE_OUTCOMES)} or "
        f"{failed(LOAD_PAUSE_METHOD, PAUSE_LOAD_FAILURE_OUTCOMES)}"
    )
    return (
        Panel(
            title="Pause save / load failures",
            description=(
                "Planner pauses (human-in-the-loop approval, OAuth) that could not be saved or loaded. "
                "A failed save_planner_state means the pause is not in the database, so a resume "
                "handled by another worker will not find it; a failed load_planner_state means a resume "
                "was answered as if the pause did not exist. Save failures: "
                f"{_values(PAUSE_SAVE_FAILURE_OUTCOMES)}; load failures: "
                f"{_values(PAUSE_LOAD_FAILURE_OUTCOMES)}. Not failures: not_found (token expired or "
                "already used) and stale (the pause came from this process's dead-letter buffer). Red "
                "marks are the pause alerts. Act at once: check Circuit state and the Postgres "
                "dashboard, and `guarded dlq list --path <spill file>` for dead-lettered saves."
            ),
            queries=(Query(q.or_zero(failures, pause_calls), "{{store}} {{method}}"),),
            decimals=0,
            thresholds=(Threshold("red", 1),),
        ),
        Panel(
            title="Pause calls by outcome",
            description=(
                "Pause saves and loads per second by outcome. load_planner_state not_found is a user "
                "coming back after the pause expired or a token used twice: a TTL/UX matter, not an "
                "outage. Any other non-ok outcome is a failure counted on the left."
            ),
            queries=(
                Query(
                    q.sum_by((names.LABEL_METHOD, names.LABEL_OUTCOME), _calls_rate(PAUSES)),
                    "{{method}} {{outcome}}",
                ),
            ),
            unit="ops",
        ),
    )


def _dead_letter_panels() -> tuple[Panel, ...]:
    depth = q.sum_by(STORE, SCOPE.selector(names.DLQ_DEPTH))

    def flow(metric: str) -> str:
        return q.or_zero(q.sum_by(STORE, q.rate(SCOPE.selector(q.counter(metric)))), depth)

    def losses(title: str, description: str, metric: str) -> Panel:
        """Writes lost or refused by method and reason: every one is a red mark."""
        return Panel(
            title=title,
            description=description,
            queries=(
                Query(
                    q.or_zero(
                        q.sum_by(
                            (names.LABEL_STORE, names.LABEL_METHOD, LABEL_REASON),
                            q.increase(SCOPE.selector(q.counter(metric))),
                        ),
                        depth,
                    ),
                    "{{store}} {{method}} {{reason}}",
                ),
            ),
            width=8,
            decimals=0,
            thresholds=(Threshold("red", 1),),
        )

    return (
        Panel(
            title="Dead-letter depth",
            description=(
                "Writes that finally failed and wait in this process's buffer (memory and spill file) "
                "for replay. It should fall back to zero once the backend recovers; if it keeps "
                "growing the backend still refuses writes. Inspect with `guarded dlq stats --path "
                "<spill file>`; the buffer is bounded, so watch Refused writes."
            ),
            queries=(
                Query(q.sum_by(INSTANCE_STORE, SCOPE.selector(names.DLQ_DEPTH)), "{{store}} @ {{instance}}"),
            ),
            width=8,
        ),
        Panel(
            title="Oldest dead-letter age",
            description=(
                "Age of the oldest write waiting for replay. Replays run while the backend answers, so "
                "a growing age means it is still down or refuses these writes: read the failure log of "
                "the guard and `guarded dlq list --path <spill file>`."
            ),
            queries=(
                Query(
                    q.max_by(INSTANCE_STORE, SCOPE.selector(names.DLQ_OLDEST_AGE)), "{{store}} @ {{instance}}"
                ),
            ),
            unit="s",
            width=8,
            thresholds=(
                Threshold("yellow", DEADLETTER_AGE_WARNING_SECONDS),
                Threshold("red", DEADLETTER_AGE_CRITICAL_SECONDS),
            ),
        ),
        losses(
            "Dropped writes (data loss)",
            "Held writes lost: spill_corrupt (only a damaged spill file held them; it is set aside "
            "for inspection), memory_full (parked writes held in memory past the caps). Each one is "
            "lost data. At its limits the buffer refuses new writes instead of dropping: see Refused "
            "writes.",
            names.DLQ_DROPPED,
        ),
        losses(
            "Refused writes (not kept)",
            "Writes the backend did not take and the dead-letter buffer could not keep, by method and "
            "reason: disk_cap (the spill file at max_disk_bytes), disk_full, spill_unavailable (the "
            "file cannot be used), memory_full (no spill file, at the memory caps). Their callers "
            "were answered refused (raised in strict mode); nothing kept was evicted. Fix the "
            "backend outage, and give the buffer room.",
            names.DLQ_REFUSED,
        ),
        Panel(
            title="Dead-letter flow",
            description=(
                "Writes entering the buffer (enqueued), leaving it on replay (replayed), and discarded "
                "because a newer write for the same key reached the backend first (superseded, no loss). "
                "Enqueued above replayed for long means the buffer is filling."
            ),
            queries=(
                Query(flow(names.DLQ_ENQUEUED), "enqueued {{store}}"),
                Query(flow(names.DLQ_REPLAYED), "replayed {{store}}"),
                Query(flow(names.DLQ_SUPERSEDED), "superseded {{store}}"),
            ),
            unit="ops",
            width=8,
        ),
        Panel(
            title="Parked writes (bad data)",
            description=(
                "Writes the backend refused as bad data. They are never replayed automatically: list "
                "them with `guarded dlq list --parked --path <spill file>`, fix the producer, then "
                "replay or purge them."
            ),
            queries=(
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.DLQ_PARKED_DEPTH)),
                    "{{store}} @ {{instance}}",
                ),
            ),
            width=8,
            thresholds=(Threshold("orange", 1),),
        ),
        Panel(
            title="Dead-letter size",
            description=(
                "Encoded size of the waiting writes in memory and in the spill file. Compare with the "
                "buffer's limits (GuardConfig.dead_letter max_disk_bytes, or max_memory_bytes without a "
                "spill file): at the limit, new failed writes are refused."
            ),
            queries=(
                Query(
                    q.sum_by((*INSTANCE_STORE, LABEL_LOCATION), SCOPE.selector(names.DLQ_BYTES)),
                    "{{store}} {{location}} @ {{instance}}",
                ),
            ),
            unit="bytes",
            width=8,
        ),
    )


def _batching_panels() -> tuple[Panel, ...]:
    return (
        Panel(
            title="Batch size (writes per flush)",
            description=(
                "How many append-only writes each bulk flush carries. Near 1 under load means batching "
                "buys nothing (raise GuardConfig.batching.max_delay); at batching.max_batch, flushes are "
                "full and pending writes queue up."
            ),
            queries=tuple(
                Query(
                    q.quantile(quantile, STORE_METHOD, SCOPE.selector(q.bucket(names.BATCH_SIZE))),
                    f"p{round(quantile * 100)} {{{{store}}}} {{{{method}}}}",
                )
                for quantile in (0.5, 0.95)
            ),
        ),
        Panel(
            title="Flush latency",
            description=(
                "Time one bulk flush takes, writer included. A rising flush latency slows every write "
                "waiting behind it and grows the pending queue: check the Postgres dashboard."
            ),
            queries=tuple(
                Query(
                    q.quantile(quantile, STORE_METHOD, SCOPE.selector(q.bucket(names.BATCH_FLUSH_DURATION))),
                    f"p{round(quantile * 100)} {{{{store}}}} {{{{method}}}}",
                    exemplar=True,
                )
                for quantile in (0.5, 0.99)
            ),
            unit="s",
        ),
        Panel(
            title="Batch pending",
            description=(
                "Writes queued or being flushed; with write-behind (ack=enqueue) they are already "
                "acknowledged to the caller and lost if the process is killed now. Stop processes "
                "gracefully (drain) and keep this low; a steady climb means flushes cannot keep up. At "
                "capacity (batch.queue_size) new writes wait, then are dead-lettered "
                "(GuardedBatchQueueFull)."
            ),
            queries=(
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.BATCH_PENDING)), "{{store}} @ {{instance}}"
                ),
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.BATCH_CAPACITY)),
                    "capacity {{store}} @ {{instance}}",
                ),
            ),
        ),
        Panel(
            title="Batch writes dropped (writer failed)",
            description=(
                "Writes of a flush whose batch writer raised (a bug, never an outage): answered "
                "fallback, neither written nor held for replay. Write-behind writes among them were "
                "acknowledged and are lost (GuardedBatchWritesFailed); the batch_writer_failed log "
                "records give the error type."
            ),
            queries=(
                Query(
                    q.or_zero(
                        q.sum_by(STORE_METHOD, q.increase(SCOPE.selector(names.BATCH_FAILED_WRITES))),
                        q.sum_by(STORE, SCOPE.selector(names.BATCH_CAPACITY)),
                    ),
                    "{{store}} {{method}}",
                ),
            ),
            decimals=0,
            thresholds=(Threshold("red", 1),),
        ),
        Panel(
            title="Flushes per second",
            description="Bulk flushes per second; times the batch size, this is the write volume per method.",
            queries=(
                Query(
                    q.sum_by(STORE_METHOD, q.rate(SCOPE.selector(q.histogram_count(names.BATCH_SIZE)))),
                    "{{store}} {{method}}",
                ),
            ),
            unit="ops",
        ),
    )


def _bulkhead_panels() -> tuple[Panel, ...]:
    return (
        Panel(
            title="Bulkhead: calls in the backend",
            description=(
                "Calls admitted to the backend now (bulkhead permits held, the guard's own flushes and "
                "replays included) against the limit (bulkhead.max_concurrent, else the pool's maximum "
                "size). At the limit with calls waiting in line, the backend or its pool is the "
                "bottleneck (GuardedPoolSaturated)."
            ),
            queries=(
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.BULKHEAD_IN_USE)),
                    "in use {{store}} @ {{instance}}",
                ),
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.BULKHEAD_LIMIT)),
                    "limit {{store}} @ {{instance}}",
                ),
            ),
            decimals=0,
            width=6,
        ),
        Panel(
            title="Bulkhead: calls waiting",
            description=(
                "Calls waiting in line for admission to the backend. A line that never empties while "
                "every permit is held is pool saturation."
            ),
            queries=(
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.BULKHEAD_QUEUE_DEPTH)),
                    "{{store}} @ {{instance}}",
                ),
            ),
            decimals=0,
            width=6,
        ),
        Panel(
            title="Bulkhead: admission wait",
            description=(
                "How long calls waited for admission to the backend (p99). This wait counts toward the "
                "caller's latency, never toward the circuit breaker's slow calls."
            ),
            queries=(
                Query(
                    q.quantile(0.99, STORE_METHOD, SCOPE.selector(q.bucket(names.BULKHEAD_WAIT))),
                    "p99 {{store}} {{method}}",
                    exemplar=True,
                ),
            ),
            unit="s",
            width=6,
        ),
        Panel(
            title="Bulkhead: admission timeouts per second",
            description=(
                "Calls not admitted before their deadline left time for the backend: they end timeout "
                "(reads answer stale or their fallback, writes are held and replayed). Sustained: more "
                "load than the backend's concurrency serves within the deadlines."
            ),
            queries=(
                Query(
                    q.sum_by(STORE_METHOD, q.rate(SCOPE.selector(names.BULKHEAD_TIMEOUTS))),
                    "{{store}} {{method}}",
                ),
            ),
            unit="ops",
            width=6,
        ),
    )


def _cache_and_memory_panels() -> tuple[Panel, ...]:
    return (
        Panel(
            title="Stale cache entries",
            description=(
                "Values kept for stale-if-error reads: during an outage a failed read answers the last "
                "value this process saw (outcome stale) instead of nothing. Bounded by "
                "GuardConfig.stale.max_entries; flat at the limit means older keys are evicted."
            ),
            queries=(
                Query(
                    q.sum_by(INSTANCE_STORE, SCOPE.selector(names.STALE_ENTRIES)), "{{store}} @ {{instance}}"
                ),
            ),
        ),
        Panel(
            title="Memory health",
            description=(
                "Short-term memory keys by the health state this process last saw (spec 003): "
                "healthy, retry, degraded, recovering. Degraded keys mean the planner runs without its "
                "full memory (summaries failing); look at the planner's LLM summariser, not the store."
            ),
            queries=(
                Query(
                    q.sum_by((names.LABEL_HEALTH,), SCOPE.selector(names.MEMORY_HEALTH_KEYS)), "{{health}}"
                ),
            ),
            stacked=True,
            series=tuple(
                SeriesStyle(f"^{health}$", color=color) for health, color in MEMORY_HEALTH_COLORS.items()
            ),
        ),
    )


def dashboard() -> Dashboard:
    """The StateStore overview dashboard."""
    return Dashboard(
        uid=UID,
        title="guarded / StateStore overview",
        description=(
            "Calls, errors and latency of every guarded StateStore, its breaker, retries, planner "
            "pause failures, dead letters, batching, stale cache and memory health."
        ),
        tags=("guarded", "statestore", "penguiflow"),
        variables=(
            QueryVariable(INSTANCE, "Instance", CALLS),
            QueryVariable(names.LABEL_STORE, "Store", f"{CALLS}{{{q.variable_matcher(INSTANCE)}}}"),
        ),
        annotations=(
            AlertAnnotation(
                "Pause save/load alerts",
                q.firing_alerts(PAUSE_ALERTS, q.variable_matcher(names.LABEL_STORE)),
                color="red",
            ),
            AlertAnnotation(
                "Store alerts",
                q.firing_alerts(STORE_ALERTS, q.variable_matcher(names.LABEL_STORE)),
                color="orange",
            ),
        ),
        rows=(
            Row("Calls", _calls_panels()),
            Row("Circuit breaker and retries", _breaker_panels()),
            Row("Planner pause (human-in-the-loop, OAuth)", _pause_panels()),
            Row("Dead letters", _dead_letter_panels()),
            Row("Batching", _batching_panels()),
            Row("Bulkhead (admission to the backend)", _bulkhead_panels()),
            Row("Stale cache and memory health", _cache_and_memory_panels()),
        ),
        default_datasource_uid=PROMETHEUS_UID,
        default_datasource_name=PROMETHEUS_NAME,
    )
