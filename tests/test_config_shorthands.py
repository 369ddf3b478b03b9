"""Configuration a user guesses right.

Each test names the mistake as it was reproduced against the code before this change (the
"Before:" line of its docstring), then checks the behaviour now.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

import guarded
from guarded import GuardConfig, controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig, RetryConfig, TimeoutConfig, UnknownSettingError


@pytest.fixture(autouse=True)
def _no_guarded_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without GUARDED_* variables (the process may have some)."""
    for name in list(os.environ):
        if name.upper().startswith("GUARDED_"):
            monkeypatch.delenv(name)


@asynccontextmanager
async def guarded_store(store: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
    async with guard(store or InMemoryStateStore(), registry=CollectorRegistry(), **kwargs) as proxy:
        yield proxy


class HangingStore(InMemoryStateStore):
    """Reads that never answer."""

    async def load_history(self, trace_id: str) -> list[Any]:
        await asyncio.Event().wait()
        return []


# --- flat shorthands ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_timeout_shorthand_is_the_deadline_of_every_call() -> None:
    """Before: ``guard(store, timeout=0.3)`` raised ``Input should be a valid dictionary or
    instance of TimeoutConfig``."""
    async with guarded_store(HangingStore(), timeout=0.3, spill_path=None) as store:
        timeout = controller(store).config.timeout
        assert (timeout.deadline, timeout.critical_deadline, timeout.attempt) == (0.3, 0.3, 0.3)
        started = time.monotonic()
        assert await store.load_history("t") == []
        assert time.monotonic() - started < 0.3 + 0.1


@pytest.mark.asyncio
async def test_retries_shorthand_counts_retries_after_the_first_attempt() -> None:
    """Before: ``guard(store, retries=3)`` raised ``retries: Extra inputs are not permitted``."""
    async with guarded_store(retries=3) as store:
        config = controller(store).config
        assert (config.retry.max_attempts, config.retry.critical_max_attempts) == (4, 4)
        assert config.retry.enabled
        assert config.for_method("load_history", critical=False).max_attempts == 4
    no_retry = GuardConfig(retries=0)
    assert not no_retry.retry.enabled
    assert no_retry.for_method("save_planner_state", critical=True).max_attempts == 1


@pytest.mark.asyncio
async def test_spill_batching_and_breaker_shorthands(tmp_path: Path) -> None:
    """Before: ``spill_path=`` was an unknown field and ``batching=False`` / ``breaker=False``
    raised ``Input should be a valid dictionary or instance of BatchConfig`` (BreakerConfig)."""
    spill = tmp_path / "dlq-{name}.sqlite"
    async with guarded_store(spill_path=spill, batching=False, breaker=False) as store:
        config = controller(store).config
        assert config.dead_letter.path == str(spill)
        assert not config.batching.enabled
        assert not config.breaker.enabled
        assert controller(store).breaker.state.value == "disabled"
    assert GuardConfig(spill_path=None).dead_letter.path is None
    assert GuardConfig(batching=True, breaker=True).batching.enabled


def test_shorthands_work_on_guard_config_itself() -> None:
    config = GuardConfig(timeout=0.3, retries=2, spill_path=None, batching=False, breaker=False)
    assert config.timeout.deadline == 0.3
    assert config.retry.max_attempts == 3
    assert config.dead_letter.path is None
    assert not config.batching.enabled
    assert not config.breaker.enabled
    # The shorthand wins over the same fields of its section; the section's other fields stay.
    both = GuardConfig(retries=3, retry=RetryConfig(max_attempts=2, initial_backoff=0.5))
    assert (both.retry.max_attempts, both.retry.initial_backoff) == (4, 0.5)
    # So a dump with a shorthand added honours the shorthand.
    dumped = GuardConfig.model_validate({**GuardConfig().model_dump(), "retries": 1, "spill_path": None})
    assert dumped.retry.max_attempts == 2
    assert dumped.dead_letter.path is None


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("timeout", "0.3"),
        ("timeout", True),
        ("retries", -1),
        ("retries", 1.5),
        ("breaker", 0),
        ("spill_path", 3),
    ],
)
def test_a_shorthand_of_the_wrong_type_says_what_it_takes(setting: str, value: object) -> None:
    with pytest.raises(ValidationError, match=rf"{setting}={value!r}: {setting} takes ") as caught:
        GuardConfig(**{setting: value})
    assert "input_value" not in str(caught.value)


# --- partial timeout -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_partial_timeout_clamps_the_attempt_timeout() -> None:
    """Before: ``timeout={"deadline": 0.3}`` raised ``timeout.attempt (2.0s) exceeds
    timeout.deadline (0.3s)`` (the default attempt timeout, never given)."""
    assert GuardConfig(timeout={"deadline": 0.3}).timeout.attempt == 0.3
    assert GuardConfig(timeout=TimeoutConfig(deadline=0.3)).timeout.attempt == 0.3
    assert GuardConfig(timeout={"deadline": 10}).timeout.attempt == 2.0
    async with guarded_store(timeout={"deadline": 0.3}) as store:
        timeout = controller(store).config.timeout
        assert (timeout.attempt, timeout.deadline, timeout.critical_deadline) == (0.3, 0.3, 15.0)


def test_an_explicit_attempt_beyond_the_deadline_is_still_refused() -> None:
    with pytest.raises(ValidationError, match=r"timeout.attempt \(2.0s\) exceeds timeout.deadline \(0.3s\)"):
        GuardConfig(timeout={"attempt": 2.0, "deadline": 0.3})
    with pytest.raises(ValidationError, match="leave it unset and it is clamped"):
        TimeoutConfig(attempt=1, deadline=0.5)


@pytest.mark.asyncio
async def test_overrides_merge_into_config_section_by_section() -> None:
    """Before: ``guard(store, config=cfg, timeout={...})`` replaced cfg's whole timeout section."""
    base = GuardConfig(timeout={"attempt": 0.1, "critical_deadline": 9}, retry={"max_attempts": 5})
    async with guarded_store(config=base, timeout={"deadline": 0.3}, breaker=False) as store:
        config = controller(store).config
        assert (config.timeout.attempt, config.timeout.deadline, config.timeout.critical_deadline) == (
            0.1,
            0.3,
            9.0,
        )
        assert config.retry.max_attempts == 5
        assert not config.breaker.enabled


# --- misspellings ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_misspelled_argument_to_guard_names_the_closest_setting() -> None:
    """Before: ``guard(store, timout=0.3)`` raised pydantic's ``timout: Extra inputs are not
    permitted [type=extra_forbidden, input_value=0.3, ...]``."""
    with pytest.raises(
        UnknownSettingError, match=r"guard\(\) got an unknown setting 'timout' \(did you mean 'timeout'\?\)"
    ):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), timout=0.3)
    with pytest.raises(TypeError, match=r"'spil_path' \(did you mean 'spill_path'\?\)"):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), spil_path=None)


def test_a_misspelled_field_of_guard_config_names_the_closest_setting() -> None:
    """Before: ``GuardConfig(retyr=...)`` raised ``retyr: Extra inputs are not permitted``."""
    with pytest.raises(
        UnknownSettingError,
        match=r"GuardConfig\(\) got an unknown setting 'retyr' \(did you mean 'retry'\?\)",
    ):
        GuardConfig(retyr={"max_attempts": 2})
    with pytest.raises(UnknownSettingError, match=r"'timeout.deadlin' \(did you mean 'deadline'\?\)"):
        GuardConfig(timeout={"deadlin": 0.3})
    with pytest.raises(
        UnknownSettingError, match=r"'methods.load_history.retires' \(did you mean 'retry'\?\)"
    ):
        GuardConfig(methods={"load_history": {"retires": False}})
    with pytest.raises(UnknownSettingError, match=r"TimeoutConfig\(\) got an unknown setting 'deadlin'"):
        TimeoutConfig(deadlin=0.3)  # type: ignore[call-arg]


# --- environment ----------------------------------------------------------------------------------


def test_guarded_dlq_path_set_after_import_is_seen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before: reported as not seen; it was (the default is read when the configuration is
    built), and stays so."""
    assert guarded.GuardConfig is GuardConfig
    monkeypatch.setenv("GUARDED_DLQ_PATH", str(tmp_path / "x-{name}.sqlite"))
    assert GuardConfig().dead_letter.path == str(tmp_path / "x-{name}.sqlite")


@pytest.mark.asyncio
async def test_every_setting_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``GUARDED_TIMEOUT__DEADLINE=0.3`` (any variable but GUARDED_DLQ_PATH) was ignored."""
    monkeypatch.setenv("GUARDED_TIMEOUT__DEADLINE", "0.3")
    monkeypatch.setenv("GUARDED_BREAKER__FAILURE_RATE_THRESHOLD", "0.25")
    monkeypatch.setenv("GUARDED_METHODS__LOAD_HISTORY__DEADLINE", "1.5")
    monkeypatch.setenv("GUARDED_BULKHEAD__MAX_CONCURRENT", "none")
    monkeypatch.setenv("GUARDED_BATCHING", '{"ack": "enqueue", "max_batch": 10}')
    async with guarded_store() as store:
        config = controller(store).config
    assert (config.timeout.deadline, config.timeout.attempt) == (0.3, 0.3)
    assert config.breaker.failure_rate_threshold == 0.25
    assert config.methods["load_history"].deadline == 1.5
    assert config.bulkhead.max_concurrent is None
    assert (config.batching.ack, config.batching.max_batch) == ("enqueue", 10)


def test_shorthands_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GUARDED_TIMEOUT", "0.3")
    monkeypatch.setenv("GUARDED_RETRIES", "1")
    monkeypatch.setenv("GUARDED_BATCHING", "false")
    monkeypatch.setenv("GUARDED_BREAKER", "0")
    monkeypatch.setenv("GUARDED_SPILL_PATH", "none")
    config = GuardConfig()
    assert (config.timeout.deadline, config.timeout.critical_deadline) == (0.3, 0.3)
    assert config.retry.max_attempts == 2
    assert not config.batching.enabled
    assert not config.breaker.enabled
    assert config.dead_letter.path is None
    # The shorthand variable wins over the nested one, and both over GUARDED_DLQ_PATH.
    monkeypatch.delenv("GUARDED_SPILL_PATH")
    monkeypatch.setenv("GUARDED_DLQ_PATH", str(tmp_path / "legacy"))
    assert GuardConfig().dead_letter.path == str(tmp_path / "legacy")
    monkeypatch.setenv("GUARDED_DEAD_LETTER__PATH", str(tmp_path / "nested"))
    assert GuardConfig().dead_letter.path == str(tmp_path / "nested")
    monkeypatch.setenv("GUARDED_SPILL_PATH", str(tmp_path / "short"))
    assert GuardConfig().dead_letter.path == str(tmp_path / "short")


@pytest.mark.asyncio
async def test_precedence_explicit_over_environment_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDED_TIMEOUT__DEADLINE", "0.3")
    monkeypatch.setenv("GUARDED_RETRY__MAX_ATTEMPTS", "7")
    async with guarded_store(timeout={"deadline": 1.0}) as store:
        config = controller(store).config
    assert config.timeout.deadline == 1.0  # the argument
    assert config.retry.max_attempts == 7  # the environment
    assert config.timeout.critical_deadline == 15.0  # the default
    assert GuardConfig(timeout=TimeoutConfig(attempt=0.1)).timeout.deadline == 0.3
    # Read when the configuration is built, not at import.
    monkeypatch.setenv("GUARDED_TIMEOUT__DEADLINE", "0.4")
    assert GuardConfig().timeout.deadline == 0.4


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("GUARDED_TIMOUT", "GUARDED_TIMEOUT"),
        ("GUARDED_RETRY_MAX_ATTEMPTS", "GUARDED_RETRY__MAX_ATTEMPTS"),
        ("GUARDED_TIMEOUT__DEADLIN", "GUARDED_TIMEOUT__DEADLINE"),
        ("GUARDED_METHODS__LOAD_HISTORY__DEADLIN", "GUARDED_METHODS__LOAD_HISTORY__DEADLINE"),
    ],
)
def test_a_misspelled_variable_names_the_closest(
    monkeypatch: pytest.MonkeyPatch, variable: str, suggestion: str
) -> None:
    monkeypatch.setenv(variable, "0.3")
    with pytest.raises(
        UnknownSettingError, match=rf"{variable} is not a guarded setting \(did you mean {suggestion}\?\)"
    ):
        GuardConfig()


def test_other_guarded_variables_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GUARDED_PG_DSN", "GUARDED_METRICS_TARGET", "GUARDED_DIFFERENTIAL_SEED", "GUARDED_FACTORY"):
        monkeypatch.setenv(name, "x")
    assert GuardConfig() == GuardConfig(timeout={})


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"GUARDED_TIMEOUT__DEADLINE": "abc"},
            "GUARDED_TIMEOUT__DEADLINE='abc': Input should be a valid number",
        ),
        ({"GUARDED_TIMEOUT": "soon"}, "GUARDED_TIMEOUT='soon': takes a number of seconds"),
        ({"GUARDED_TIMEOUT": "1", "GUARDED_TIMEOUT__ATTEMPT": "0.1"}, "set one or the other"),
        (
            {"GUARDED_TIMEOUT__ATTEMPT": "3", "GUARDED_TIMEOUT__DEADLINE": "1"},
            r"timeout.attempt \(3.0s\) \(GUARDED_TIMEOUT__ATTEMPT\) exceeds timeout.deadline \(1.0s\)",
        ),
    ],
)
def test_a_bad_value_in_the_environment_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=message) as caught:
        GuardConfig()
    assert "input_value" not in str(caught.value)


def test_a_variable_set_empty_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GUARDED_STRICT=`` (a shell's way to clear a setting) leaves the default, never a
    validation error at guard() time (found by an adversarial review)."""
    monkeypatch.setenv("GUARDED_STRICT", "")
    monkeypatch.setenv("GUARDED_TIMEOUT__DEADLINE", "")
    config = GuardConfig()
    assert config.strict is False
    assert config.timeout.deadline == GuardConfig.model_construct().timeout.deadline
    monkeypatch.setenv("GUARDED_STRICT", "1")
    assert GuardConfig().strict is True


def test_a_spill_path_may_be_a_pathlib_path(tmp_path: Path) -> None:
    assert DeadLetterConfig(path=tmp_path / "dlq.sqlite").path == str(tmp_path / "dlq.sqlite")
    with pytest.raises(ValidationError, match="path"):
        DeadLetterConfig(path=3)  # type: ignore[arg-type]


# --- config as a mapping ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_config_may_be_a_mapping_validated_into_guard_config() -> None:
    """Before: ``guard(store, config={...})`` raised ``AttributeError: 'dict' object has no
    attribute 'dead_letter'`` from deep inside the guard."""
    settings = {"timeout": {"deadline": 2.5}, "retries": 0, "spill_path": None}
    async with guarded_store(config=settings) as store:
        config = controller(store).config
        assert isinstance(config, GuardConfig)
        assert config.timeout.deadline == 2.5
        assert config.retry.enabled is False
        assert config.dead_letter.path is None
    async with guarded_store(config=settings, retries=2) as store:  # keyword settings win over it
        assert controller(store).config.retry.max_attempts == 3
        assert controller(store).config.timeout.deadline == 2.5


def test_a_mapping_config_with_a_misspelled_or_bad_setting_is_refused_clearly() -> None:
    with pytest.raises(UnknownSettingError, match=r"'timout' \(did you mean 'timeout'\?\)"):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), config={"timout": 2})
    with pytest.raises(UnknownSettingError, match=r"'timeout\.deadlin' \(did you mean 'deadline'\?\)"):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), config={"timeout": {"deadlin": 2}})
    with pytest.raises(ValidationError, match=r"timeout\.deadline"):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), config={"timeout": {"deadline": -1}})


@pytest.mark.parametrize("config", [42, "timeout=2", ["timeout", 2], TimeoutConfig()])
def test_a_config_that_is_neither_a_guard_config_nor_a_mapping_is_a_type_error(config: object) -> None:
    with pytest.raises(TypeError, match=r"config must be a GuardConfig \(or a mapping of its settings\)"):
        guard(InMemoryStateStore(), registry=CollectorRegistry(), config=config)  # type: ignore[arg-type]
