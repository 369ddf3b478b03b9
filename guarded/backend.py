"""The backend interface: what a StateStore may read of a guarded call, the rules it follows, and
what it may declare to the guard.

A backend is any object with the StateStore methods (:mod:`guarded.protocol`); the guard works
with one that knows nothing of it. A backend that wants the guard's stronger promises across
retries, replays and processes uses this module, and nothing else of the guard's internals: the
records it stores are in :mod:`guarded.models`, their codecs in :mod:`guarded.codec`, the errors in
:mod:`guarded.errors`. ``docs/backends.md`` walks through a small backend that uses all of it.

**What a backend may read of the call in progress** (context variables the guard sets around the
backend call; the guard sets them, a backend only reads them):

* :func:`current_idempotency_key`: the key of the logical call, the same for every retry of it.
  A consume (``load_planner_state``) that records who consumed an item and answers a repeat with
  the same key again makes the consume safe to retry (declare
  :attr:`BackendDeclarations.honours_idempotency_key`).
* :func:`current_unanswered_keys`: keys of earlier consumes of the same item whose answers never
  reached their callers; the item consumed under one of them, within the backend's grace period,
  belongs to the current key (declare :attr:`BackendDeclarations.recovers_unanswered_consumes`).
* :func:`current_item_keys`: one key per item of an append without a natural id (planner events),
  set for the guard's own flushes and replays; the i-th item is stored under the i-th key instead
  of ``"<idempotency key>:<i>"``, so a flush whose answer was lost and the later replay of one of
  its writes store that write once.
* :func:`current_logical_times` / :func:`current_logical_time`: the logical time of each item of
  the upsert in progress, and :func:`is_replay`: whether it replays an earlier write.
* :func:`read_must_be_current`: for a backend that declares ``routes_reads`` (read replicas),
  whether the read in progress must be answered by its primary: writes it must include are held
  in the dead-letter buffer.

**The rules of a last-write-wins upsert** (memory states, trajectories, remote bindings, pauses).
A write held during an outage is replayed later, perhaps after another worker wrote the same key
directly; bookkeeping inside one process cannot see that worker, so the data itself carries the
time. Tasks need none of this: a task state carries its own ``updated_at``.

* **A direct write is applied**, whatever the stored row's time: a clock behind another host's
  must not drop a live write. The row takes ``max(the write's time, the stored time + 1)``, so its
  time only grows, and the backend hands that time to :func:`merge_logical_time`.
* **Only a replay is compared** (:func:`is_replay`: a held write replayed, a snapshot restored):
  it replaces the row only when its time is not older than the stored one (an equal time wins, so
  a repeat of the same write is harmless). A replay it leaves alone is reported by raising
  :class:`~guarded.errors.WriteSupersededError` once the rest of the call is applied; the guard
  counts it as superseded, never as delivered.
* **A replay without a time** (held by a version that did not keep one) is older than any row
  with a time: :func:`current_logical_times` answers :data:`UNTIMED_REPLAY`.
* **A time to live counts from the call**: a replayed write with a TTL keeps only
  :func:`ttl_left` of it.

A logical time is an integer, microseconds since the Unix epoch, from a hybrid logical clock: the
wall clock, but strictly increasing within the process, and moved past every time the backend
reports (:func:`merge_logical_time`), so the times of a process never fall behind what it has seen
stored by another. How a replay and a direct write made elsewhere compare is as good as the
hosts' clocks: keep them synchronised (NTP) to well under the shortest outage you expect. In SQL::

    times = current_logical_times(len(rows))   # one per row; the clock's time when unset
    if is_replay():
        # INSERT ... ON CONFLICT (key) DO UPDATE SET ..., logical_time = EXCLUDED.logical_time
        #     WHERE table.logical_time <= EXCLUDED.logical_time RETURNING logical_time
        # (fewer rows returned than sent: raise WriteSupersededError(refused))
    else:
        # INSERT ... ON CONFLICT (key) DO UPDATE SET ...,
        #     logical_time = GREATEST(EXCLUDED.logical_time, table.logical_time + 1)
        #     RETURNING logical_time
    merge_logical_time(max(returned times))

A backend that does not opt in is still protected within one process by the guard's own
bookkeeping, but not against another worker's newer write.

**Metrics of a backend** (pool use, table sizes, ...) are Prometheus metrics like the guard's. Take
their names from :data:`metric_names`, the one catalog of every name guarded emits (the dashboards
and alert rules are built from the same constants; a new backend adds its names there, prefixed
``guarded_<backend>_``, with base units and ``_total`` for counters), and label them with
:data:`~guarded.observability.telemetry_names.LABEL_STORE` plus only bounded labels of its own.
prometheus-client refuses a second metric of one name in a registry, so build the families once per
registry with :class:`PerRegistry` (``families_for = PerRegistry(build)``; ``families_for(registry)``
builds on first use and shares afterwards) and give each store its own labelled children, removed
when it closes.

**What a backend may declare**: the attributes of :class:`BackendDeclarations`, each optional, each
read once when the guard is built; and the bulk forms of :data:`BULK_FORMS`, which the guard uses
when the backend has a method of that name. A store made of other stores (a hybrid) declares
:class:`ComposedStore`: the guard then guards each part on its own. :data:`LEGACY_ALIASES` names
the protocol's legacy method names and the method each stands for.

**What a backend may report**: a backend with a connection pool may have :class:`ReportsPoolUsage`'s
``pool_usage()``, a snapshot (:class:`PoolUsage`: connections in use, the maximum, callers waiting)
that the guard's health check reads on every call without awaiting; every connection in use with
callers waiting makes the guard ``degraded`` with the reason ``pool_saturated``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, Self

from .config import UnknownSettingError, closest_hint
from .durations import DURATION_EXAMPLES, parse_duration
from .env_settings import ConfigurationError, EnvSettings
from .error_classes import (
    INSUFFICIENT_PRIVILEGE,
    INSUFFICIENT_RESOURCES,
    OPERATIONAL_CONDITIONS,
    POOLER_MISMATCH,
    READ_ONLY,
    SCHEMA_MISMATCH,
    SERVER_UNAVAILABLE,
    SYSTEM_ERROR,
    TOO_MANY_CONNECTIONS,
    UNDEFINED_OBJECT,
    BackendNotReachedError,
    ErrorClass,
    ErrorClassifier,
    register_classifier,
)
from .errors import WriteSupersededError
from .local_artifacts import (
    ArtifactLimitError,
    ArtifactPut,
    ArtifactTooLargeError,
    CheckedArtifactPuts,
    GroupLimit,
    InMemoryArtifactStore,
    artifact_id,
    checked_artifact_bytes,
    new_artifact_ref,
    plan_evictions,
    prepare_artifact_put,
    ref_groups,
    sanitize_artifact_namespace,
)
from .observability import telemetry_names as metric_names
from .observability.multiprocess_metrics import forget_series
from .observability.per_registry import PerRegistry
from .observability.scrape_time_gauges import ScrapeTimeGauge, scrape_time_gauge
from .policy_table import PolicyTable
from .pool_usage import POOL_USAGE, PoolUsage, ReportsPoolUsage
from .protocol import LEGACY_ALIASES
from .steering import sanitize_steering_event

# What a backend reads of the call in progress.

IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "guarded_idempotency_key", default=None
)
"""The key of the logical call in progress, or ``None`` outside any guarded call."""

UNANSWERED_KEYS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "guarded_unanswered_keys", default=None
)
"""Keys of earlier consumes of the same item whose answers never reached their callers, set by the
guard around the consume that recovers them (one consume at a time). A backend that honours them
(it declares ``recovers_unanswered_consumes = True``) treats an item consumed under one of these
keys, within its grace period, as not consumed yet: the current key consumes it -- atomically, so
it now belongs to the current key, and neither the old keys nor any other caller get it again."""

ITEM_KEYS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "guarded_item_keys", default=None
)
"""One key per item of the append in progress, set by the guard for its own flushes and replays
of appends without a natural id (planner events). A backend that honours keys stores the i-th
item under the i-th key (instead of ``"<key>:<i>"``), so a flush whose acknowledgement was lost and
the later replay of one of its writes store that write once."""

LOGICAL_TIMES: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "guarded_logical_times", default=None
)
"""The logical time of each item of the upsert in progress (one for a single write), or ``None``
outside a guarded upsert (the backend then takes :func:`next_logical_time`)."""

REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("guarded_replaying", default=False)
"""Whether the upsert in progress replays a write made earlier (a held write, a snapshot being
restored): only then does the backend compare its time with the stored row's and leave a newer row
alone (raising :class:`~guarded.errors.WriteSupersededError`). ``False`` for a direct write, which
is always applied."""

MUST_BE_CURRENT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "guarded_must_be_current", default=False
)
"""Whether the read in progress must be answered from the backend's most current copy, set by the
guard around a read of a backend that declares ``routes_reads`` while writes the read's answer
must include are held in its dead-letter buffer (their replay commits on the primary, and a copy
that lags would miss what the buffer no longer shows). Queued writes need no mark: the guard
flushes a read's scope before the read, and the backend sees those writes commit."""

UNTIMED_REPLAY = 0
"""The logical time of a replay kept without one (by a version that did not keep times): older
than any row written with a time, so it lands only where the key has none."""


def current_idempotency_key() -> str | None:
    """The idempotency key of the current logical call (see :data:`IDEMPOTENCY_KEY`), or ``None``."""
    return IDEMPOTENCY_KEY.get()


def current_unanswered_keys() -> tuple[str, ...]:
    """The keys of unanswered consumes the current consume may recover (see
    :data:`UNANSWERED_KEYS`); empty when there are none."""
    return UNANSWERED_KEYS.get() or ()


def read_must_be_current() -> bool:
    """Whether the read in progress must not be answered from a copy that may lag (a read
    replica): see :data:`MUST_BE_CURRENT`."""
    return MUST_BE_CURRENT.get()


def current_item_keys() -> tuple[str, ...] | None:
    """The per-item keys of the append in progress (see :data:`ITEM_KEYS`), or ``None``."""
    return ITEM_KEYS.get()


def is_replay() -> bool:
    """Whether the upsert in progress replays an earlier write (see :data:`REPLAYING`)."""
    return REPLAYING.get()


_last = 0


def next_logical_time() -> int:
    """A new logical time: the wall clock in microseconds, larger than any earlier one of the
    process and than any time :func:`merge_logical_time` was given."""
    global _last
    now = time.time_ns() // 1000
    _last = now if now > _last else _last + 1
    return _last


def merge_logical_time(stored: int) -> None:
    """Move the process clock past ``stored``, a logical time a backend holds (the receive step of
    a hybrid logical clock): every later :func:`next_logical_time` is larger. A backend calls it
    with the time each upsert left on its rows."""
    global _last
    if stored > _last:
        _last = stored


def current_logical_times(count: int) -> Sequence[int]:
    """The logical times of the ``count`` items of the upsert in progress: those the guard set, or
    (none set, or not one per item) a new time for all of them -- :data:`UNTIMED_REPLAY` for a
    replay."""
    times = LOGICAL_TIMES.get()
    if times is not None and len(times) == count:
        return times
    if REPLAYING.get():
        return (UNTIMED_REPLAY,) * count
    return (next_logical_time(),) * count


def current_logical_time() -> int:
    """The logical time of the single upsert in progress (see :func:`current_logical_times`)."""
    return current_logical_times(1)[0]


def age_of(logical: int) -> float:
    """Seconds since the logical time ``logical`` by this process's wall clock (0 for a time not
    yet reached): how long ago a write was first called, when it is replayed."""
    return max(0.0, (time.time_ns() // 1000 - logical) / 1_000_000)


def ttl_left(ttl: float, logical: int) -> float:
    """Seconds a write called at logical time ``logical`` has left of a time to live ``ttl``: all of
    it for a direct write; for a replay (:data:`REPLAYING`) the TTL counts from its call, so the
    replay of a write that would have expired meanwhile has none left. A replay kept without a time
    (:data:`UNTIMED_REPLAY`: its call time is unknown) has all of it, from the replay."""
    return ttl - age_of(logical) if REPLAYING.get() and logical != UNTIMED_REPLAY else ttl


# What a backend may declare.

ERROR_CLASSIFIER = "error_classifier"
"""Attribute name of :attr:`BackendDeclarations.error_classifier`."""

HONOURS_IDEMPOTENCY_KEY = "honours_idempotency_key"
"""Attribute name of :attr:`BackendDeclarations.honours_idempotency_key`."""

RECOVERS_UNANSWERED_CONSUMES = "recovers_unanswered_consumes"
"""Attribute name of :attr:`BackendDeclarations.recovers_unanswered_consumes`."""

MAX_CONCURRENCY = "max_concurrency"
"""Attribute name of :attr:`BackendDeclarations.max_concurrency`."""

TARGET_IDENTITY = "target_identity"
"""Attribute name of :attr:`BackendDeclarations.target_identity`."""

DURABLE_ACROSS_PROCESSES = "durable_across_processes"
"""Attribute name of :attr:`BackendDeclarations.durable_across_processes`."""

DB_SYSTEM_NAME = "db_system_name"
"""Attribute name of :attr:`BackendDeclarations.db_system_name`."""

ROUTES_READS = "routes_reads"
"""Attribute name of :attr:`BackendDeclarations.routes_reads`."""

STORE_PARTS = "store_parts"
"""Attribute name of :attr:`ComposedStore.store_parts`."""


class BackendDeclarations(Protocol):
    """What a backend may declare to the guard, as class or instance attributes. Every one is
    optional (a backend declares none, some or all; the guard uses ``getattr`` with the default
    named below) and read once, when :func:`guarded.guard` builds the guard."""

    error_classifier: ClassVar[ErrorClassifier | None]
    """What the backend knows of its driver's errors: an :class:`ErrorClassifier` whose methods
    answer for the exceptions it recognises (the :class:`ErrorClass` of each, the operational
    condition it reports, whether the request provably never reached the server, a description fit
    for logs) and ``None`` for any other. The guard registers it (:func:`register_classifier`).
    Absent: the guard's generic rules (a timeout or a connection error is retried, a ``ValueError``
    parked, anything unknown held as :attr:`ErrorClass.FATAL`)."""

    honours_idempotency_key: ClassVar[bool]
    """``True`` when a consume (``load_planner_state``) honours :func:`current_idempotency_key`:
    a repeat with the same key, within the backend's grace period, gets the same answer. The guard
    then retries a consume whose outcome it does not know. Absent or ``False``: a consume is
    retried only when the failure provably never reached the backend."""

    recovers_unanswered_consumes: ClassVar[bool]
    """``True`` (with :attr:`honours_idempotency_key`) when a consume also honours
    :func:`current_unanswered_keys`. The guard then keeps the keys of consumes that got no answer
    and hands them to the next consume of the same token. Absent or ``False``: a consume that got
    no answer may have lost its item."""

    max_concurrency: int | None
    """How many calls the backend can run at once (an ``int`` of at least 1; a pooled backend: its
    pool's maximum size). The guard's bulkhead admits that many and keeps the rest waiting in line,
    unless ``bulkhead.max_concurrent`` is configured. Absent or ``None``: no limit and no bulkhead.
    Anything else is refused with ``TypeError``/``ValueError`` when the guard is built."""

    target_identity: str
    """Which data the store holds, as a non-empty string (PostgreSQL: server, database and schema,
    never credentials). Held writes are recorded with it and are adopted and replayed only into a
    store of the same identity. Absent: the application, the store's class and the guard's name,
    which only the same store of the same application matches."""

    durable_across_processes: bool
    """``False`` for a store that keeps nothing across processes (an in-memory store): its held
    writes get no spill file, and it adopts none. Absent: ``True`` (except for PenguiFlow's
    in-memory store, known to keep nothing)."""

    db_system_name: str | None
    """The ``db.system.name`` of the guard's spans (OpenTelemetry's name of the database system:
    ``"postgresql"``). Absent or not a string: the spans carry none."""

    routes_reads: bool
    """``True`` when the backend may answer some reads from a copy that lags (a read replica). The
    guard then marks each read of a trace or session while writes for the store are held in its
    dead-letter buffer (:func:`read_must_be_current`), and the backend answers it from its primary.
    Absent or ``False``: no mark (and no cost)."""


class ComposedStore(Protocol):
    """A store made of other stores, each a backend of its own (``HybridStateStore``: Redis for
    pauses and memory, PostgreSQL for the record). :func:`guarded.guard` guards each part on its
    own -- its own breaker, bulkhead, error classifier, dead-letter buffer and spill file, metrics
    and spans under the store name ``"<name>.<part>"`` -- and returns :meth:`with_parts` of the
    guarded parts, so one part failing never stops the calls routed to another.
    ``guarded.controller`` of the result controls every part (``parts``; ``flush``, ``drain`` and
    ``aclose`` cover them all). A store declares itself composed by having both members."""

    @property
    def store_parts(self) -> Mapping[str, object]:
        """The parts by name (a name is a lowercase identifier: it names the part's metrics and
        spill file)."""
        ...

    def with_parts(self, parts: Mapping[str, object]) -> Self:
        """The same store (its routing and options) over ``parts``, which has the same names."""
        ...


def store_parts_of(store: object) -> Mapping[str, object] | None:
    """The parts of a composed store (:class:`ComposedStore`), ``None`` for any other store."""
    parts: Any = getattr(store, STORE_PARTS, None)
    if isinstance(parts, Mapping) and callable(getattr(store, "with_parts", None)):
        return parts
    return None


BULK_FORMS: Mapping[str, str] = {
    policy.name: policy.bulk_form for policy in PolicyTable.for_state_store() if policy.bulk_form is not None
}
"""Every write with a bulk form, and the name of that form: ``save_event`` → ``save_events``,
``save_memory_state`` → ``save_memory_states`` ... (each item of a bulk form carries the
arguments named by :attr:`~guarded.policy.MethodPolicy.bulk_item` of the policy table). A backend
declares a bulk form by having a method of that name; the guard's group commit, replays and drains
then send many writes in one call. The whole call succeeds or fails; a bulk upsert follows the
logical-time rules item by item, and a bulk append of planner events honours
:func:`current_item_keys`."""


__all__ = [
    "BULK_FORMS",
    "DB_SYSTEM_NAME",
    "DURABLE_ACROSS_PROCESSES",
    "DURATION_EXAMPLES",
    "ERROR_CLASSIFIER",
    "HONOURS_IDEMPOTENCY_KEY",
    "IDEMPOTENCY_KEY",
    "INSUFFICIENT_PRIVILEGE",
    "INSUFFICIENT_RESOURCES",
    "ITEM_KEYS",
    "LEGACY_ALIASES",
    "LOGICAL_TIMES",
    "MAX_CONCURRENCY",
    "MUST_BE_CURRENT",
    "OPERATIONAL_CONDITIONS",
    "POOL_USAGE",
    "READ_ONLY",
    "RECOVERS_UNANSWERED_CONSUMES",
    "REPLAYING",
    "POOLER_MISMATCH",
    "ROUTES_READS",
    "SCHEMA_MISMATCH",
    "SERVER_UNAVAILABLE",
    "STORE_PARTS",
    "SYSTEM_ERROR",
    "TARGET_IDENTITY",
    "TOO_MANY_CONNECTIONS",
    "UNANSWERED_KEYS",
    "UNDEFINED_OBJECT",
    "UNTIMED_REPLAY",
    "ArtifactLimitError",
    "ArtifactPut",
    "ArtifactTooLargeError",
    "BackendDeclarations",
    "BackendNotReachedError",
    "CheckedArtifactPuts",
    "ComposedStore",
    "ConfigurationError",
    "EnvSettings",
    "ErrorClass",
    "ErrorClassifier",
    "GroupLimit",
    "InMemoryArtifactStore",
    "PerRegistry",
    "ScrapeTimeGauge",
    "PoolUsage",
    "ReportsPoolUsage",
    "UnknownSettingError",
    "WriteSupersededError",
    "age_of",
    "artifact_id",
    "checked_artifact_bytes",
    "closest_hint",
    "current_idempotency_key",
    "current_item_keys",
    "current_logical_time",
    "current_logical_times",
    "current_unanswered_keys",
    "forget_series",
    "scrape_time_gauge",
    "is_replay",
    "merge_logical_time",
    "metric_names",
    "new_artifact_ref",
    "next_logical_time",
    "parse_duration",
    "plan_evictions",
    "prepare_artifact_put",
    "read_must_be_current",
    "ref_groups",
    "register_classifier",
    "sanitize_artifact_namespace",
    "sanitize_steering_event",
    "store_parts_of",
    "ttl_left",
]
