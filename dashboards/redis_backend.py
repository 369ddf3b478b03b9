"""The Redis backend dashboard: the guard's calls to a Redis store by method, each Redis node's
round trip, availability and errors, its memory against ``maxmemory``, evicted and expired keys,
and the planner pauses the store saved and consumed.

Node series come from ``guarded.backends.redis`` (backends/redis/redis_metrics.py), labelled by
store and node (``host:port``, a server of the deployment); the method panels are the guard's own
series of the same store names (the guard and its Redis store share the name, as ``guard(store)``
names them by default).
"""

from __future__ import annotations

from guarded.observability import telemetry_names as names

from . import promql as q
from .backend_dashboard import INSTANCE, backend_dashboard
from .model import Dashboard, Panel, Query, Row, SeriesStyle, Threshold
from .semantics import ERROR_OUTCOMES, LATENCY_P99_ALERT_SECONDS, REDIS_MEMORY_ALERT_RATIO
from .store_overview import PAUSE_ALERTS

UID = "guarded-redis"
SCOPE = q.Scope((INSTANCE, names.LABEL_STORE))
STORE_METHOD = (names.LABEL_STORE, names.LABEL_METHOD)
STORE_NODE = (names.LABEL_STORE, names.LABEL_NODE)
NODE_LEGEND = "{{store}} {{node}}"
METHOD_LEGEND = "{{store}} {{method}}"
ERRORS = q.one_of(names.LABEL_OUTCOME, (outcome.value for outcome in ERROR_OUTCOMES))
BACKEND_ALERTS = (
    *PAUSE_ALERTS,
    names.ALERT_REDIS_NODE_DOWN,
    names.ALERT_REDIS_NODE_ERRORS,
    names.ALERT_REDIS_MEMORY_NEAR_MAX,
    names.ALERT_REDIS_EVICTING,
    names.ALERT_CIRCUIT_OPEN,
    names.ALERT_ERROR_BUDGET_BURN,
    names.ALERT_LATENCY_P99,
)


def _node_max(metric: str) -> str:
    """``metric`` per (store, node): every process samples the same node, so the largest reading."""
    return q.max_by(STORE_NODE, SCOPE.selector(metric))


def _call_panels() -> tuple[Panel, ...]:
    calls = q.counter(names.CALLS)
    all_calls = q.sum_by(STORE_METHOD, q.rate(SCOPE.selector(calls)))
    errors = q.or_zero(q.sum_by(STORE_METHOD, q.rate(SCOPE.selector(calls, ERRORS))), all_calls)
    latency = SCOPE.selector(q.bucket(names.CALL_DURATION))
    return (
        Panel(
            title="Errors per second by method",
            description=(
                "Calls of the Redis store that ended in an error outcome, by method: the guard's own "
                "view (timeouts, calls refused by an open breaker, writes held for replay, bad data "
                "refused). Which node failed them is in 'Errors by node'; the StateStore overview "
                "dashboard shows every outcome."
            ),
            queries=(Query(errors, METHOD_LEGEND),),
            unit="ops",
            width=8,
        ),
        Panel(
            title="p50 latency by method",
            description=(
                "Median latency of the Redis store's calls as the guard measured them (attempts and "
                "backoff included). Sub-millisecond to a few milliseconds is healthy; compare with the "
                "node round trip ('PING round trip by node') to tell the network from the store's work."
            ),
            queries=(Query(q.quantile(0.5, STORE_METHOD, latency), METHOD_LEGEND, exemplar=True),),
            unit="s",
            width=8,
        ),
        Panel(
            title="p99 latency by method",
            description=(
                "The tail of the Redis store's calls. A tail near the deadline while PING stays fast "
                "means a slow command (a big value, a long Lua script: look at SLOWLOG) or a saturated "
                "client; with PING slow too, the node or the network is the cause. The red line is "
                "GuardedStoreLatencyP99High's threshold."
            ),
            queries=(Query(q.quantile(0.99, STORE_METHOD, latency), METHOD_LEGEND, exemplar=True),),
            unit="s",
            width=8,
            thresholds=(Threshold("red", LATENCY_P99_ALERT_SECONDS),),
        ),
    )


def _node_panels() -> tuple[Panel, ...]:
    ping = SCOPE.selector(q.bucket(names.GUARDED_REDIS_PING_SECONDS))
    errors = q.sum_by(
        (*STORE_NODE, names.LABEL_REDIS_ERROR_KIND),
        q.increase(SCOPE.selector(q.counter(names.GUARDED_REDIS_NODE_ERRORS_TOTAL))),
    )
    return (
        Panel(
            title="PING round trip by node (p50 / p99)",
            description=(
                "Round trip of the PING each process sends every node at each sample. It is the floor "
                "of every call's latency: tens to hundreds of microseconds on a local network. A node "
                "whose PING climbs is busy (a long script, a big KEYS or DEBUG, a fork for a snapshot) "
                "or far away."
            ),
            queries=tuple(
                Query(
                    q.quantile(quantile, STORE_NODE, ping),
                    f"p{round(quantile * 100)} {NODE_LEGEND}",
                    exemplar=True,
                )
                for quantile in (0.5, 0.99)
            ),
            unit="s",
            width=8,
        ),
        Panel(
            title="Node up",
            description=(
                "1 when the node answered the last sample of every process, 0 when one did not "
                "(GuardedRedisNodeDown after minutes). A cluster master down has its replica promoted "
                "within cluster-node-timeout; meanwhile writes to its slots are held by the guard and "
                "replayed."
            ),
            queries=(Query(q.min_by(STORE_NODE, SCOPE.selector(names.GUARDED_REDIS_NODE_UP)), NODE_LEGEND),),
            kind="stat",
            unit="none",
            decimals=0,
            width=8,
            thresholds=(Threshold("red"), Threshold("green", 1)),
        ),
        Panel(
            title="Errors by node",
            description=(
                "Failed commands per interval by node and kind: connection (refused or lost), timeout, "
                "loading (a restarted server reading its data), busy (a script over its time limit), "
                "readonly (a replica during a failover), oom (maxmemory under noeviction: writes are "
                "held and replayed once memory is freed), other. The sampler's failed samples count "
                "here too."
            ),
            queries=(Query(errors, f"{NODE_LEGEND} {{{{kind}}}}"),),
            decimals=0,
            width=8,
        ),
        Panel(
            title="Connected clients by node",
            description=(
                "Client connections open on each node, every client's (not only guarded's). A "
                "steady climb is a connection leak somewhere; near maxclients (10,000 by default) new "
                "connections are refused."
            ),
            queries=(Query(_node_max(names.GUARDED_REDIS_CONNECTED_CLIENTS), NODE_LEGEND),),
            width=12,
        ),
        Panel(
            title="Sample age",
            description=(
                "Time since a sample last found every node of the store answering. It stays below a "
                "few sampling intervals (sample_interval, 15 s by default); a growing age means a node "
                "does not answer (see 'Node up') and its memory and key panels are stale."
            ),
            queries=(
                Query(
                    "time() - "
                    + q.max_by(
                        (INSTANCE, names.LABEL_STORE), SCOPE.selector(names.GUARDED_REDIS_SAMPLE_TIMESTAMP)
                    ),
                    "{{store}} @ {{instance}}",
                ),
            ),
            unit="s",
            thresholds=(Threshold("yellow", 60), Threshold("red", 300)),
            width=12,
        ),
    )


def _memory_panels() -> tuple[Panel, ...]:
    used = _node_max(names.GUARDED_REDIS_MEMORY_USED_BYTES)
    maximum = _node_max(names.GUARDED_REDIS_MAXMEMORY_BYTES)
    evicted = q.sum_by(
        STORE_NODE, q.increase(SCOPE.selector(q.counter(names.GUARDED_REDIS_EVICTED_KEYS_TOTAL)))
    )
    expired = q.sum_by(
        STORE_NODE, q.increase(SCOPE.selector(q.counter(names.GUARDED_REDIS_EXPIRED_KEYS_TOTAL)))
    )
    saved = q.sum_by(
        (names.LABEL_STORE,), q.rate(SCOPE.selector(q.counter(names.GUARDED_REDIS_PAUSES_SAVED_TOTAL)))
    )
    consumed = q.sum_by(
        (names.LABEL_STORE,), q.rate(SCOPE.selector(q.counter(names.GUARDED_REDIS_PAUSES_CONSUMED_TOTAL)))
    )
    return (
        Panel(
            title="Memory used vs maxmemory",
            description=(
                "used_memory of each node and its maxmemory (dashed; none drawn for a node without a "
                "limit). At maxmemory Redis applies maxmemory-policy: noeviction refuses writes (OOM: "
                "the guard holds them and replays), any volatile-* or allkeys-* policy evicts keys, and "
                "every key guarded writes has a TTL, so pauses and memory states can be evicted."
            ),
            queries=(
                Query(used, f"used {NODE_LEGEND}"),
                Query(f"{maximum} > 0", f"max {NODE_LEGEND}"),
            ),
            series=(SeriesStyle("^max ", dashed=True),),
            unit="bytes",
            width=8,
        ),
        Panel(
            title="Memory use of maxmemory",
            description=(
                "used_memory over maxmemory per node (nodes without a limit are left out). The red line "
                "is GuardedRedisMemoryNearMax's threshold: raise maxmemory, add shards, or shorten the "
                "TTLs of the store's key classes."
            ),
            queries=(Query(q.ratio(used, f"({maximum} > 0)"), NODE_LEGEND),),
            unit="percentunit",
            maximum=1,
            thresholds=(Threshold("yellow", 0.8), Threshold("red", REDIS_MEMORY_ALERT_RATIO)),
            width=8,
        ),
        Panel(
            title="Evicted keys by node",
            description=(
                "Keys each node evicted at maxmemory per interval (any client's keys: Redis does not "
                "say whose). Any eviction on a node holding the store's pauses may have dropped a pause "
                "before its resume: set maxmemory-policy noeviction for a store's Redis "
                "(GuardedRedisEvictingKeys)."
            ),
            queries=(Query(evicted, NODE_LEGEND),),
            decimals=0,
            width=8,
        ),
        Panel(
            title="Expired keys by node",
            description=(
                "Keys whose TTL ran out per interval on each node (every client's keys). Expiry is how "
                "the store's key classes are bounded: pauses never resumed, old memory, events past "
                "their retention. Compare with 'Pause saves vs consumes': a gap there ends up here."
            ),
            queries=(Query(expired, NODE_LEGEND),),
            decimals=0,
            width=12,
        ),
        Panel(
            title="Pause saves vs consumes",
            description=(
                "Planner pauses the store saved, and pauses a resume consumed, per second. Resumes "
                "follow saves by the time a human or an OAuth callback takes; a lasting gap means "
                "pauses left waiting, which expire at their TTL (counted in 'Expired keys by node') or, "
                "under an evicting policy at maxmemory, are evicted. Redis does not tell which key "
                "expired or was evicted: this is the store's own count of what it saved and consumed."
            ),
            queries=(Query(saved, "saved {{store}}"), Query(consumed, "consumed {{store}}")),
            unit="ops",
            width=12,
        ),
    )


def dashboard() -> Dashboard:
    """The Redis backend dashboard."""
    source = q.histogram_count(names.GUARDED_REDIS_PING_SECONDS)
    return backend_dashboard(
        uid=UID,
        title="guarded / Redis backend",
        description=(
            "Calls to the Redis store by method; per node round trip, availability, errors, memory "
            "against maxmemory, evicted and expired keys; pauses saved and consumed."
        ),
        tags=("guarded", "redis"),
        source=source,
        alerts=BACKEND_ALERTS,
        rows=(
            Row("Calls by method", _call_panels()),
            Row("Nodes", _node_panels()),
            Row("Memory and keys", _memory_panels()),
        ),
    )
