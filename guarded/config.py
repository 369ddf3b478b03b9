"""Every tunable of the guard, with production defaults (``GuardConfig``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TimeoutConfig(_Frozen):
    """Per-attempt timeout and overall deadline of one logical call, in seconds."""

    attempt: float = Field(2.0, gt=0)
    deadline: float = Field(5.0, gt=0)
    critical_deadline: float = Field(15.0, gt=0)
    """Deadline of critical methods (``save_planner_state``): a lost pause breaks HITL/OAuth."""


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


class LoggingConfig(_Frozen):
    """Structured failure logs, rate-limited per (method, error type)."""

    interval: float = Field(10.0, ge=0)
    """At most one record per (method, error type) per interval; suppressed ones are counted."""


class ArtifactFallbackConfig(_Frozen):
    """Artifacts the backend could not take are kept in this process, within these bounds."""

    local_max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Per session and per trace; beyond it the oldest local artifacts are evicted (LRU)."""


class MethodConfig(_Frozen):
    """Per-method overrides; unset fields keep the guard-wide value."""

    attempt_timeout: float | None = Field(None, gt=0)
    deadline: float | None = Field(None, gt=0)
    max_attempts: int | None = Field(None, ge=1)
    retry: bool | None = None


class GuardConfig(_Frozen):
    """Configuration of :func:`guarded.guard`. Defaults suit a database-backed store."""

    timeout: TimeoutConfig = TimeoutConfig()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    logging: LoggingConfig = LoggingConfig()
    artifacts: ArtifactFallbackConfig = ArtifactFallbackConfig()
    methods: dict[str, MethodConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _attempt_fits_deadline(self) -> GuardConfig:
        if self.timeout.attempt > self.timeout.deadline:
            attempt, deadline = self.timeout.attempt, self.timeout.deadline
            raise ValueError(f"timeout.attempt ({attempt}s) exceeds timeout.deadline ({deadline}s)")
        return self

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
        )


class ResolvedMethodConfig(_Frozen):
    """The settings one method's layers run with."""

    attempt_timeout: float
    deadline: float
    max_attempts: int
