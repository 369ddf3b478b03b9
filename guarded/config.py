"""Every tunable of the guard, with production defaults (``GuardConfig``), and the ``GUARDED_*``
environment variables that set them (docs/configuration.md has the table).

Every field is a variable, sections nested with ``__`` (``GUARDED_TIMEOUT__DEADLINE=0.3``,
``GUARDED_METHODS__LOAD_HISTORY__DEADLINE=1``), and so is each flat shorthand
(``GUARDED_TIMEOUT=0.3``, ``GUARDED_RETRIES=3``, ``GUARDED_SPILL_PATH=none``, ``GUARDED_BATCHING=0``,
``GUARDED_BREAKER=false``). pydantic-settings reads and parses them (nested names, JSON for a whole
section, ``none`` for ``None``, the booleans pydantic accepts) with the very field types of the
configuration, so a variable means exactly what the same argument does. The environment is read
each time a ``GuardConfig`` is validated (``GuardConfig()``, ``guard()`` without ``config``), never
at import.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict


class UnknownSettingError(TypeError):
    """A setting (argument, field or ``GUARDED_*`` variable) that does not exist, typically a
    misspelling; the message names the closest valid one. A ``TypeError``, as Python's own
    "got an unexpected keyword argument"."""


def closest(name: str, valid: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The valid name closest to ``name`` (difflib), or ``None`` when none is close."""
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=cutoff)
    return found[0] if found else None


def closest_hint(name: str, valid: Iterable[str], *, cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the valid name closest to ``name``, or nothing."""
    found = closest(name, valid, cutoff=cutoff)
    return f" (did you mean {found!r}?)" if found else ""


def refuse_unknown(names: Iterable[str], valid: Iterable[str], *, caller: str, prefix: str = "") -> None:
    """Raise :class:`UnknownSettingError` for the first of ``names`` not in ``valid``."""
    known = sorted(set(valid))
    for name in names:
        if name not in known:
            raise UnknownSettingError(
                f"{caller} got an unknown setting {prefix + name!r}"
                f"{closest_hint(name, known)}; valid{' in ' + prefix.rstrip('.') if prefix else ''}: "
                + ", ".join(known)
            )


class _Frozen(BaseModel):
    # hide_input_in_errors: a refused value is named by its path, never dumped with the whole input.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_settings(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            refuse_unknown(data, cls.model_fields, caller=f"{cls.__name__}()")
        return data


class TimeoutConfig(_Frozen):
    """Per-attempt timeout and overall deadline of one logical call, in seconds.

    ``attempt`` left unset is clamped to ``deadline`` when it would exceed it
    (``TimeoutConfig(deadline=0.3)`` has ``attempt == 0.3``); an ``attempt`` given explicitly
    (argument or ``GUARDED_TIMEOUT__ATTEMPT``) that exceeds ``deadline`` is refused."""

    attempt: float = Field(2.0, gt=0)
    deadline: float = Field(5.0, gt=0)
    critical_deadline: float = Field(15.0, gt=0)
    """Deadline of critical methods (``save_planner_state``): a lost pause breaks HITL/OAuth."""

    @model_validator(mode="after")
    def _attempt_fits_deadline(self) -> TimeoutConfig:
        if self.attempt <= self.deadline:
            return self
        if "attempt" in self.model_fields_set:
            source = " (GUARDED_TIMEOUT__ATTEMPT)" if os.environ.get("GUARDED_TIMEOUT__ATTEMPT") else ""
            raise ValueError(
                f"timeout.attempt ({self.attempt}s){source} exceeds timeout.deadline ({self.deadline}s): "
                "one attempt cannot outlast the call; lower timeout.attempt, or leave it unset and it "
                "is clamped to the deadline"
            )
        # The default attempt timeout, clamped; it stays unset, so a later merge clamps it anew.
        object.__setattr__(self, "attempt", self.deadline)
        return self


class RetryConfig(_Frozen):
    """Exponential backoff with jitter, for retryable errors on repeat-safe methods."""

    enabled: bool = True
    max_attempts: int = Field(3, ge=1)
    critical_max_attempts: int = Field(6, ge=1)
    initial_backoff: float = Field(0.05, ge=0)
    max_backoff: float = Field(1.0, ge=0)
    multiplier: float = Field(2.0, ge=1)
    jitter: float = Field(0.05, ge=0)
    """Upper bound of the random delay added to each backoff (tenacity ``wait_exponential_jitter``)."""


class BreakerConfig(_Frozen):
    """Circuit breaker over a sliding window (the resilience4j model)."""

    enabled: bool = True
    window: Literal["count", "time"] = "count"
    window_size: int = Field(50, ge=1)
    """Calls in a count window, or seconds in a time window."""
    minimum_calls: int = Field(10, ge=1)
    failure_rate_threshold: float = Field(0.5, gt=0, le=1)
    slow_call_rate_threshold: float = Field(0.8, gt=0, le=1)
    slow_call_duration: float = Field(1.0, gt=0)
    open_duration: float = Field(10.0, gt=0)
    """Seconds the breaker stays open before it lets probes through."""
    half_open_probes: int = Field(3, ge=1)


class BulkheadConfig(_Frozen):
    """A concurrency limit in front of the backend (the bulkhead): at most ``max_concurrent`` calls
    in the backend at once, the guard's own batch flushes and replays included; the others wait
    in line, first come first served. A caller waits while one attempt's time is left before its
    deadline (``timeout.attempt``, at most ``breaker.slow_call_duration`` and half the deadline),
    so an admitted call always has time to answer or to be shown slow; then it ends with outcome
    ``timeout`` (``BulkheadTimeoutError``, nothing sent): a read answers stale or its fallback, a
    write is held and replayed. Time spent in line never counts toward the circuit breaker's
    slow-call rate (docs/bulkhead.md)."""

    enabled: bool = True
    max_concurrent: int | None = None
    """Calls in the backend at once. ``None`` (the default): as many as the backend declares in
    its ``max_concurrency`` attribute (the PostgreSQL store: its pool's maximum size), no limit —
    and no bulkhead at all — when it declares nothing (the in-memory stores)."""

    @field_validator("max_concurrent")
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(
                f"bulkhead.max_concurrent must be at least 1, not {value} (None: the backend's own "
                "limit; bulkhead.enabled=False: no limit)"
            )
        return value


class LoggingConfig(_Frozen):
    """Structured failure logs, rate-limited per (method, error type)."""

    interval: float = Field(10.0, ge=0)
    """At most one record per (method, error type) per interval; suppressed ones are counted."""


class ArtifactFallbackConfig(_Frozen):
    """Artifacts the backend could not take are kept in this process, within these bounds, and
    dead-lettered: held in a spill file of their own (the dead-letter path with ``-artifacts``
    added to the file name) and replayed into the backend's artifact store when it recovers. A put
    that file cannot hold is refused, never acknowledged from this process's memory only."""

    local_max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Per session and per trace; beyond it the oldest local artifacts are evicted (LRU)."""
    spill_max_bytes: int = Field(256 * 1024 * 1024, ge=0)
    """Held artifacts (their encoded size: base64 content plus metadata) in the artifact spill
    file, at most (its ``max_disk_bytes``). A put that would go beyond it is refused (outcome
    ``refused``, :class:`~guarded.errors.WriteNotKeptError` in strict mode, counted with
    ``reason="disk_cap"``); nothing held is evicted. ``0`` holds no artifact: every put the backend
    cannot take is refused. Also their in-memory cap when there is no spill file."""


Ack = Literal["commit", "enqueue"]
"""When a batched write is acknowledged: ``"commit"`` (group commit, the default) once the batch
holding it is committed to the backend or to the spill file; ``"enqueue"`` (write-behind) as soon
as it is queued, leaving a window of ``max_delay`` plus one flush in which it exists only in this
process."""


class BatchConfig(_Frozen):
    """Batching of append-only writes (``save_event``, ``save_update``, ``save_planner_event``).

    By default (``ack="commit"``) this is group commit as databases do it: a write goes out at
    once when no flush of its method is running, writes that arrive while one runs form the next
    batch, and each caller returns once the batch holding its write is committed (to the backend,
    or to the spill file when the backend cannot take it)."""

    enabled: bool = True
    ack: Ack = "commit"
    """``"commit"`` (group commit) or ``"enqueue"`` (write-behind, an explicit opt-in: acknowledged
    when queued; see docs/durability.md for its window). Per method: ``methods[name].ack``."""
    max_batch: int = Field(500, ge=1)
    """A method's queue is flushed as soon as it holds this many writes."""
    max_delay: float = Field(0.002, ge=0)
    """With ``ack="enqueue"``: a queue is flushed once its oldest write has waited this long
    (seconds), the window in which an acknowledged write exists only in this process. Group
    commit has no timer."""
    queue_size: int = Field(20_000, ge=1)
    """Writes queued or being flushed, all methods together; a full queue makes callers wait
    (up to their deadline, then the write is dead-lettered)."""
    max_concurrent_flushes: int = Field(4, ge=1)
    """Flushes of one method running at once."""
    parallel_flush_at: int = Field(48, ge=1)
    """Group commit: writes waiting while a flush runs that start a further flush beside it (up
    to ``max_concurrent_flushes``; a full batch of ``max_batch`` always does); a queue of at least
    twice as many is split evenly over the free flushes. Callers then fall into cohorts whose
    flushes overlap: the process prepares one batch while the database commits another."""
    single_write_concurrency: int = Field(16, ge=1)
    """Concurrent single writes per flush when the backend has no bulk method."""


class DeadLetterConfig(_Frozen):
    """Writes that finally failed are acknowledged and kept here, then replayed in order."""

    enabled: bool = True
    path: str | None = Field(default_factory=lambda: default_spill_path())
    """SQLite spill file (``{name}`` is replaced by the guard's name, ``{identity}`` by a short
    digest of the store's identity, see :mod:`guarded.store_identity`). Every dead-lettered write is
    committed to it before the caller is acknowledged, so it survives a crash of the process.
    Processes configured with the same path each claim a slot file of their own beside it, and
    adopt the files of processes that are gone, only those recorded for the same store identity.
    Default: ``GUARDED_DLQ_PATH`` when set, else ``$XDG_STATE_HOME/guarded/{name}-{identity}.sqlite``
    (``~/.local/state`` when ``XDG_STATE_HOME`` is unset), so two applications or stores never
    share a file by accident. ``None`` keeps the buffer in memory only, by explicit choice: held
    writes die with the process (one WARNING says so when the guard starts). A store that keeps
    nothing across processes (``durable_across_processes = False``) has no spill file whatever
    the path. A :class:`pathlib.Path` is taken as its text."""
    application: str | None = None
    """Names this application in the identity of a store that declares none (``target_identity``):
    held writes of such a store are adopted only by a guard of the same name, over a store of the
    same class, in an application of the same name. Default: the resolved path of the main
    program (see :func:`guarded.store_identity.application_identity`)."""
    max_memory_entries: int = Field(10_000, ge=1)
    max_memory_bytes: int = Field(64 * 1024 * 1024, ge=1)
    """In-memory caps: with a spill file they bound the copies of what it holds (beyond them
    entries live on disk only); without one, a new write past them is refused
    (:class:`~guarded.errors.WriteNotKeptError`, counted and logged), the oldest are never dropped."""
    max_disk_bytes: int = Field(1024 * 1024 * 1024, ge=1)
    """Spill-file cap (encoded bytes of the held and parked writes); a new write past it is refused
    (:class:`~guarded.errors.WriteNotKeptError`, counted and logged), nothing kept is evicted."""
    synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    """SQLite ``synchronous`` in WAL mode: NORMAL survives a crash of the process, FULL also a
    power loss (one fsync per commit)."""
    replay_rate: float = Field(500.0, gt=0)
    """Writes per second the background replay sends to a recovering backend, at most."""
    replay_batch: int = Field(100, ge=1)
    """Consecutive replayed events grouped into one bulk write, at most."""
    max_replay_attempts: int = Field(10, ge=1)
    """Failed replays of one held write after which it is parked with its last error. A failure
    counts only while the backend takes other writes (a success in the same pass, or since the
    write's previous attempt), never for an operational condition (a missing table); a call that
    can never succeed (it does not bind to the method, an unknown method, a stored call that does
    not decode) is parked at its first attempt."""
    drain_timeout: float = Field(10.0, ge=0)
    """Seconds ``aclose()`` spends draining the buffer to the backend before leaving the rest in
    the spill file."""

    @field_validator("path", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value


def state_directory() -> str:
    """The user's state directory per the XDG base directory convention: ``$XDG_STATE_HOME``, else
    ``~/.local/state``."""
    configured = os.environ.get("XDG_STATE_HOME")
    if configured and os.path.isabs(configured):
        return configured
    return os.path.join(os.path.expanduser("~"), ".local", "state")


DEFAULT_SPILL_FILE = "{name}-{identity}.sqlite"
"""The file name of the default spill path: one file (and its slots) per guard name and store identity."""

FORMER_DEFAULT_SPILL_FILE = "{name}.sqlite"
"""The file name of the default spill path before store identities separated them."""


def default_spill_path() -> str:
    """Where a guard spills held writes when not told: ``GUARDED_DLQ_PATH``, else
    ``<state directory>/guarded/{name}-{identity}.sqlite`` (read when the configuration is built)."""
    return os.environ.get("GUARDED_DLQ_PATH") or os.path.join(
        state_directory(), "guarded", DEFAULT_SPILL_FILE
    )


def former_default_spill_path(path: str | None) -> str | None:
    """The spill path earlier versions used by default in place of ``path`` when ``path`` is a
    default one (its file name is :data:`DEFAULT_SPILL_FILE`, or a sibling of it such as the
    artifacts' ``{name}-{identity}-artifacts.sqlite``), else ``None``: held writes left there and
    recorded for the same store are still adopted."""
    if path is None:
        return None
    directory, name = os.path.split(path)
    stem, ext = os.path.splitext(DEFAULT_SPILL_FILE)
    if not (name.startswith(stem) and name.endswith(ext)):
        return None
    return os.path.join(directory, os.path.splitext(FORMER_DEFAULT_SPILL_FILE)[0] + name[len(stem) :])


class StaleConfig(_Frozen):
    """Stale-if-error: the last value this process read or wrote per key serves failed reads."""

    enabled: bool = True
    max_entries: int = Field(10_000, ge=0)
    max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Estimated bytes of the values held (see :func:`guarded.layers.stale_reads.estimate_size`); a
    value above an eighth of this is not kept. ``0`` keeps nothing."""
    answer_held_pauses: bool = True
    """Whether a resume (``load_planner_state``) the backend cannot answer is answered from a save
    of its token held in this process's dead-letter buffer (outcome ``stale``). The backend is the
    truth whenever it can be reached: a held save is first delivered to it and the backend answers.
    ``True`` keeps a paused flow resumable during an outage, but a worker cut off from the backend
    cannot know that another worker consumed the token meanwhile: it may deliver it a second time.
    ``False`` never answers a pause from a hold (at most once across workers): such a resume fails
    (or gets its fallback) until the backend is back and the hold is replayed. Independent of
    :attr:`enabled`."""


class MethodConfig(_Frozen):
    """Per-method overrides; unset fields keep the guard-wide value."""

    attempt_timeout: float | None = Field(None, gt=0)
    deadline: float | None = Field(None, gt=0)
    max_attempts: int | None = Field(None, ge=1)
    retry: bool | None = None
    ack: Ack | None = None
    """Of a batched write: ``"commit"`` or ``"enqueue"`` (see :attr:`BatchConfig.ack`)."""


class GuardConfig(_Frozen):
    """Configuration of :func:`guarded.guard`. Defaults suit a database-backed store."""

    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    bulkhead: BulkheadConfig = Field(default_factory=BulkheadConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    artifacts: ArtifactFallbackConfig = Field(default_factory=ArtifactFallbackConfig)
    batching: BatchConfig = Field(default_factory=BatchConfig)
    dead_letter: DeadLetterConfig = Field(default_factory=DeadLetterConfig)
    """Built when the configuration is: ``GUARDED_DLQ_PATH`` and ``XDG_STATE_HOME`` are read then."""
    stale: StaleConfig = Field(default_factory=StaleConfig)
    methods: dict[str, MethodConfig] = Field(default_factory=dict)
    strict: bool = False
    """Strict mode (``GUARDED_STRICT=1``): a call rejected as the caller's bug (arguments that do
    not bind, a wrong type, bad data) or failing with a programming error raises to the caller
    instead of returning the fallback; store failures still degrade. For tests and development
    (see :mod:`guarded.pipeline.strict_mode` and :func:`guarded.testing.strict`)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_settings(cls, data: Any) -> Any:
        # Overrides _Frozen's check: shorthands, misspellings (nested ones too) and GUARDED_* variables.
        if not isinstance(data, Mapping):
            return data
        return prepare_settings(data, caller="GuardConfig()")

    def for_method(self, name: str, *, critical: bool) -> ResolvedMethodConfig:
        """The effective settings of one method."""
        override = self.methods.get(name, MethodConfig())
        deadline = override.deadline or (
            self.timeout.critical_deadline if critical else self.timeout.deadline
        )
        attempts = override.max_attempts or (
            self.retry.critical_max_attempts if critical else self.retry.max_attempts
        )
        retry = self.retry.enabled if override.retry is None else override.retry
        return ResolvedMethodConfig(
            attempt_timeout=min(override.attempt_timeout or self.timeout.attempt, deadline),
            deadline=deadline,
            max_attempts=attempts if retry else 1,
            ack=override.ack or self.batching.ack,
        )


class ResolvedMethodConfig(_Frozen):
    """The settings one method's layers run with."""

    attempt_timeout: float
    deadline: float
    max_attempts: int
    ack: Ack = "commit"


# --- Flat shorthands, misspellings, environment (docs/configuration.md) --------------------------

SHORTHANDS: dict[str, str] = {
    "timeout": "a number of seconds: the deadline of every call (timeout.deadline and "
    "timeout.critical_deadline), timeout.attempt clamped to it",
    "retries": "a whole number >= 0 of retries after the first attempt (retry.max_attempts and "
    "retry.critical_max_attempts = retries + 1; 0 disables retry)",
    "spill_path": "the dead-letter spill file (dead_letter.path); None keeps held writes in memory only",
    "batching": "True or False: batching.enabled",
    "breaker": "True or False: breaker.enabled",
}
"""The flat settings ``guard()`` and ``GuardConfig()`` take besides the nested ones, and what each
means. ``timeout``, ``batching`` and ``breaker`` are also the names of nested sections: a mapping
or a section model is the nested form, a number or a bool the shorthand."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _section(value: object) -> dict[str, Any]:
    """A nested section given as a mapping or as its model, as the mapping of its set fields."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"expected a mapping or a section model, not {type(value).__name__}")


def merge_settings(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, section by section: a section both give is merged field by
    field (a model counting by the fields it was given), anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        mergeable = (Mapping, BaseModel)
        if isinstance(value, mergeable) and isinstance(below, mergeable):
            merged[key] = merge_settings(_section(below), _section(value))
        else:
            merged[key] = value
    return merged


def _shorthand_error(name: str, value: object) -> ValueError:
    return ValueError(f"{name}={value!r}: {name} takes {SHORTHANDS[name]}")


def expand_shorthands(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each flat shorthand replaced by the nested settings it stands for. The
    shorthand wins over the same fields of its section given too, the section's other fields are
    kept: ``{**config.model_dump(), "retries": 3}`` makes 4 attempts."""
    out = dict(data)
    sections: dict[str, dict[str, Any]] = {}
    if "timeout" in out and not isinstance(out["timeout"], Mapping | BaseModel):
        value = out.pop("timeout")
        if not _is_number(value):
            raise _shorthand_error("timeout", value)
        sections["timeout"] = {"deadline": value, "critical_deadline": value}
    if "retries" in out:
        value = out.pop("retries")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _shorthand_error("retries", value)
        sections["retry"] = {
            "enabled": value > 0,
            "max_attempts": value + 1,
            "critical_max_attempts": value + 1,
        }
    if "spill_path" in out:
        value = out.pop("spill_path")
        if value is not None and not isinstance(value, str | os.PathLike):
            raise _shorthand_error("spill_path", value)
        sections["dead_letter"] = {"path": None if value is None else os.fspath(value)}
    for name in ("batching", "breaker"):
        if name in out and not isinstance(out[name], Mapping | BaseModel):
            value = out.pop(name)
            if not isinstance(value, bool):
                raise _shorthand_error(name, value)
            sections[name] = {"enabled": value}
    for name, fields in sections.items():
        out[name] = merge_settings(_section(out[name]), fields) if name in out else fields
    return out


def sections() -> dict[str, type[_Frozen]]:
    """GuardConfig's nested sections by field name (``methods`` excluded)."""
    found: dict[str, type[_Frozen]] = {}
    for name, field in GuardConfig.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, _Frozen):
            found[name] = annotation
    return found


def check_setting_names(data: Mapping[str, Any], *, caller: str) -> None:
    """Refuse a misspelled setting anywhere in ``data`` (top level, a section's fields, a
    ``methods`` entry's fields), naming the closest valid one."""
    refuse_unknown(data, [*GuardConfig.model_fields, *SHORTHANDS], caller=caller)
    for name, section in sections().items():
        value = data.get(name)
        if isinstance(value, Mapping):
            refuse_unknown(value, section.model_fields, caller=caller, prefix=f"{name}.")
    methods = data.get("methods")
    if isinstance(methods, Mapping):
        for method, value in methods.items():
            if isinstance(value, Mapping):
                refuse_unknown(value, MethodConfig.model_fields, caller=caller, prefix=f"methods.{method}.")


# --- the GUARDED_* environment ------------------------------------------------------------

PREFIX = "GUARDED_"
DELIMITER = "__"

FOREIGN = frozenset({"dlq_path", "metrics_target", "differential_seed", "factory"})
"""``GUARDED_*`` variables read elsewhere (``GUARDED_DLQ_PATH`` by the default of
``dead_letter.path``, the others by tools and tests); ``GUARDED_PG_*`` are the PostgreSQL store's."""

_SHORTHAND_TYPES: dict[str, Any] = {
    "timeout": TimeoutConfig | float | None,
    "batching": BatchConfig | bool | None,
    "breaker": BreakerConfig | bool | None,
}


@functools.cache
def _settings_model() -> type[BaseSettings]:
    """A settings class with GuardConfig's fields (each optional) and the shorthands, built once
    from GuardConfig so that a field added there is a variable too."""
    fields: dict[str, Any] = {
        name: (_SHORTHAND_TYPES.get(name, Optional[field.annotation]), None)  # noqa: UP045
        for name, field in GuardConfig.model_fields.items()
    }
    fields["retries"] = (int | None, None)
    fields["spill_path"] = (str | None, None)

    class _Base(BaseSettings):
        model_config = SettingsConfigDict(
            env_prefix=PREFIX,
            env_nested_delimiter=DELIMITER,
            case_sensitive=False,
            extra="ignore",
            env_parse_none_str="none",
            env_ignore_empty=True,  # GUARDED_STRICT= (set, empty) means unset, as in a shell
            hide_input_in_errors=True,
        )

    model: type[BaseSettings] = create_model("GuardedEnvironment", __base__=_Base, **fields)
    return model


def _variable(*parts: str) -> str:
    return PREFIX + DELIMITER.join(parts).upper()


def _unknown(name: str, suggestion: str | None, valid: str = "") -> UnknownSettingError:
    hint = f" (did you mean {suggestion}?)" if suggestion else ""
    return UnknownSettingError(f"{name} is not a guarded setting{hint}{'; ' + valid if valid else ''}")


def _is_setting(name: str) -> bool:
    """Whether ``name`` (a ``GUARDED_*`` variable) is a setting. A variable that is evidently a
    misspelled setting raises :class:`UnknownSettingError` naming the closest valid variable; one
    that belongs to something else (``GUARDED_PG_*``, ``GUARDED_DLQ_PATH``, ...) is ``False``."""
    head, *rest = name[len(PREFIX) :].lower().split(DELIMITER)
    nested = sections()
    top = [*GuardConfig.model_fields, *SHORTHANDS]
    if head not in top:
        if head in FOREIGN or head.startswith("pg_"):
            return False
        for title, model in nested.items():  # GUARDED_RETRY_MAX_ATTEMPTS: one underscore for two
            field = head[len(title) + 1 :]
            if head.startswith(title + "_") and field in model.model_fields:
                raise _unknown(name, _variable(title, field, *rest))
        found = closest(head, top, cutoff=0.8)
        if found is not None:
            raise _unknown(name, _variable(found, *rest))
        return False
    if not rest:
        return True
    if head == "methods":
        if len(rest) == 2 and rest[1] in MethodConfig.model_fields:
            return True
        found = closest(rest[-1], MethodConfig.model_fields) if len(rest) == 2 else None
        fields = ", ".join(field.upper() for field in MethodConfig.model_fields)
        raise _unknown(
            name,
            _variable(head, rest[0], found) if found else None,
            f"a method's setting is GUARDED_METHODS__<METHOD>__<FIELD>, <FIELD> one of {fields}",
        )
    section = nested.get(head)
    if section is None:
        raise _unknown(name, _variable(head), f"{_variable(head)} takes one value, it has no fields")
    if len(rest) == 1 and rest[0] in section.model_fields:
        return True
    found = closest(rest[0], section.model_fields)
    valid = ", ".join(_variable(head, field) for field in section.model_fields)
    raise _unknown(name, _variable(head, found) if found else None, f"{head} has {valid}")


def _refused(error: ValidationError) -> ValueError:
    """A value pydantic refused, said with the variable that carried it."""
    found: list[tuple[list[str], str]] = []
    for item in error.errors():
        # The location without the union members' tags ("function-after[...]", "float").
        path = [str(part) for part in item["loc"] if _NAME.fullmatch(str(part)) and str(part) not in _TAGS]
        message = item["msg"].removeprefix("Value error, ")
        found.append((path, message))
    lines: list[str] = []
    for path, message in found:
        line = message
        if not _own_check(message):
            if len(path) == 1 and path[0] in SHORTHANDS:
                if any(len(other) > 1 and other[0] == path[0] for other, _ in found):
                    continue  # a field of the section was refused: the shorthand reading is noise
                if any(_own_check(other) for _, other in found):
                    continue  # the section was refused by its own check, which says why
                message = f"takes {SHORTHANDS[path[0]]}, or a JSON object of its fields"
            variable = _variable(*path)
            value = next((v for k, v in os.environ.items() if k.upper() == variable), None)
            line = f"{variable}{f'={value!r}' if value is not None else ''}: {message}"
        if line not in lines:
            lines.append(line)
    return ValueError("; ".join(lines))


def _own_check(message: str) -> bool:
    """A refusal of this package's own checks, which names its settings itself."""
    return message.startswith(("timeout.", "bulkhead.", "retries=", "timeout=", "spill_path="))


_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_TAGS = frozenset({"float", "bool", "int", "str", "none"})


def environment_settings() -> dict[str, Any]:
    """The settings the ``GUARDED_*`` variables give now, shorthands expanded (empty when none is
    set). Raises :class:`UnknownSettingError` for a misspelled variable, ``ValueError`` for a
    value its setting does not take."""
    if not any(_is_setting(name) for name in list(os.environ) if name.upper().startswith(PREFIX)):
        return {}
    given = {name.upper() for name in os.environ}
    for name in SHORTHANDS:
        whole = _variable(name)
        if whole in given and any(other.startswith(whole + DELIMITER) for other in given):
            raise ValueError(f"{whole} and {whole}{DELIMITER}<FIELD> are both set: set one or the other")
    try:
        settings = _settings_model()()
    except ValidationError as error:
        raise _refused(error) from None
    return expand_shorthands(settings.model_dump(exclude_unset=True))


def prepare_settings(data: Mapping[str, Any], *, caller: str) -> dict[str, Any]:
    """The input of one ``GuardConfig`` validation: names checked, shorthands expanded, and the
    ``GUARDED_*`` environment underneath (explicit settings > environment > defaults)."""
    check_setting_names(data, caller=caller)
    return merge_settings(environment_settings(), expand_shorthands(data))


def build_config(config: GuardConfig | Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> GuardConfig:
    """The configuration of ``guard(store, config=config, **overrides)``: ``overrides`` (nested
    settings or shorthands) on top of the settings ``config`` was given, section by section, then
    the ``GUARDED_*`` environment, then the defaults. Without overrides, ``config`` as it is (a
    ``GuardConfig`` read the environment when it was built), or ``GuardConfig()`` read now.

    ``config`` may be a mapping of settings, validated as ``GuardConfig(**config)`` (a misspelled
    name is an :class:`UnknownSettingError`, a bad value a ``ValidationError``); anything else is
    a ``TypeError`` naming ``GuardConfig``."""
    if isinstance(config, Mapping):
        config = GuardConfig.model_validate(config)
    elif config is not None and not isinstance(config, GuardConfig):
        raise TypeError(
            "config must be a GuardConfig (or a mapping of its settings), not "
            f"{type(config).__name__}: guard(store, config=GuardConfig(...)), or settings as "
            "keywords: guard(store, timeout=2.0)"
        )
    if not overrides:
        return config if config is not None else GuardConfig()
    check_setting_names(overrides, caller="guard()")
    base = config.model_dump(exclude_unset=True) if config is not None else {}
    return GuardConfig.model_validate(merge_settings(base, expand_shorthands(overrides)))
