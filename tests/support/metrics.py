"""Reading what the guard exported into a Prometheus registry: one sample, calls by outcome, a
counter summed over its label sets, task telemetry events."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry

from guarded.observability import telemetry_names as names

CALLS = names.CALLS + "_total"
DURATION_COUNT = names.CALL_DURATION + "_count"
RETRIES = names.RETRIES + "_total"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value, 0 when the series does not exist."""
    return registry.get_sample_value(name, labels) or 0.0


def calls(registry: CollectorRegistry, method: str, outcome: str, store: str = "default") -> float:
    """Calls counted for (store, method, outcome); 0 when the series does not exist."""
    return sample(registry, CALLS, store=store, method=method, outcome=outcome)


def retries(registry: CollectorRegistry, method: str, store: str = "default") -> float:
    return sample(registry, RETRIES, store=store, method=method)


def method_outcomes(registry: CollectorRegistry, store: str | None = "default") -> Counter[tuple[str, str]]:
    """Calls by (method, outcome) of ``store`` (``None``: every store); outcomes that never happened
    (exported as 0) are left out."""
    counts: Counter[tuple[str, str]] = Counter()
    for family in registry.collect():
        for found in family.samples:
            if found.name == CALLS and found.value and store in (None, found.labels.get("store")):
                counts[(found.labels["method"], found.labels["outcome"])] += int(found.value)
    return counts


def outcome_counts(registry: CollectorRegistry, store: str | None = "default") -> Counter[str]:
    """Calls of ``store`` (``None``: every store) by outcome, every method together; outcomes that
    never happened (exported as 0) are left out."""
    counts: Counter[str] = Counter()
    for (_, outcome), count in method_outcomes(registry, store).items():
        counts[outcome] += count
    return counts


def total(registry: CollectorRegistry, name: str, store: str | None = None) -> int:
    """Samples named ``name`` summed over every label set (of ``store`` only, when given)."""
    value = 0.0
    for family in registry.collect():
        for found in family.samples:
            if found.name == name and store in (None, found.labels.get("store")):
                value += found.value
    return int(value)


def task_events(
    registry: CollectorRegistry, event_type: str, outcome: str, task_type: str, mode: str
) -> float:
    """PenguiFlow task telemetry events counted for those labels (``guarded_task_events_total``)."""
    labels = {"event_type": event_type, "outcome": outcome, "task_type": task_type, "mode": mode}
    return sample(registry, names.TASK_EVENTS, **labels)
