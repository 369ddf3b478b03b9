"""Builders for the PromQL the dashboards use, so every query filters on the template variables.

Metric names come from :mod:`guarded.observability.telemetry_names`; this module only derives the series names
Prometheus exposes for them (``_total`` of a counter, ``_bucket``/``_sum``/``_count`` of a
histogram) and composes expressions. ``$__rate_interval`` is Grafana's: at least four scrape
intervals, so a rate always has enough samples.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

RATE_INTERVAL = "$__rate_interval"
ALERTS = "ALERTS"
"""Prometheus' own series of pending and firing alerts (labels alertname, alertstate and the alert's)."""
HISTOGRAM_SUFFIXES: tuple[str, ...] = ("_bucket", "_sum", "_count")
COUNTER_SUFFIX = "_total"
_PLAIN = re.compile(r"[A-Za-z0-9_]+")


def counter(name: str) -> str:
    """The exposed series name of counter ``name`` (prometheus-client appends ``_total``)."""
    return name if name.endswith(COUNTER_SUFFIX) else name + COUNTER_SUFFIX


def bucket(name: str) -> str:
    """The ``_bucket`` series of histogram ``name``."""
    return name + "_bucket"


def histogram_sum(name: str) -> str:
    """The ``_sum`` series of histogram ``name``."""
    return name + "_sum"


def histogram_count(name: str) -> str:
    """The ``_count`` series of histogram ``name``."""
    return name + "_count"


def eq(label: str, value: str) -> str:
    """Matcher ``label="value"``."""
    return f'{label}="{_escape(value)}"'


def one_of(label: str, values: Iterable[str]) -> str:
    """Matcher ``label=~"a|b|c"`` for exactly these values."""
    found = sorted(set(values))
    if not found:
        raise ValueError(f"one_of({label!r}) needs at least one value")
    unsafe = [value for value in found if not _PLAIN.fullmatch(value)]
    if unsafe:
        raise ValueError(f"one_of({label!r}): values must be plain words, not regular expressions: {unsafe}")
    return f'{label}=~"{"|".join(found)}"'


def variable_matcher(label: str) -> str:
    """Matcher ``label=~"$label"``: the template variable of the same name."""
    return f'{label}=~"${label}"'


@dataclass(frozen=True, slots=True)
class Scope:
    """The labels a dashboard filters every series on, each through its template variable."""

    labels: tuple[str, ...]

    def selector(self, metric: str, *matchers: str) -> str:
        """``metric{label=~"$label", ..., matchers...}``."""
        return f"{metric}{{{', '.join([*map(variable_matcher, self.labels), *matchers])}}}"


def by(labels: Sequence[str]) -> str:
    return ", ".join(labels)


def rate(selector: str) -> str:
    return f"rate({selector}[{RATE_INTERVAL}])"


def increase(selector: str) -> str:
    return f"increase({selector}[{RATE_INTERVAL}])"


def sum_by(labels: Sequence[str], expr: str) -> str:
    return f"sum by ({by(labels)}) ({expr})"


def max_by(labels: Sequence[str], expr: str) -> str:
    return f"max by ({by(labels)}) ({expr})"


def min_by(labels: Sequence[str], expr: str) -> str:
    return f"min by ({by(labels)}) ({expr})"


def quantile(q: float, labels: Sequence[str], bucket_selector: str) -> str:
    """``histogram_quantile`` of the ``_bucket`` series ``bucket_selector``, keeping ``labels``."""
    if not 0 < q < 1:
        raise ValueError(f"quantile must be between 0 and 1, got {q}")
    return f"histogram_quantile({q}, {sum_by([*labels, 'le'], rate(bucket_selector))})"


def or_zero(expr: str, baseline: str) -> str:
    """``expr``, or 0 for every series of ``baseline`` that ``expr`` lacks.

    Counters that only appear after their first event (failures, drops) then draw a flat zero
    for each healthy series instead of "No data", which an operator could read as "broken".
    ``baseline`` must be grouped by the same labels as ``expr``.
    """
    return f"({expr} or 0 * {baseline})"


def firing_alerts(alertnames: Iterable[str], *matchers: str) -> str:
    """Prometheus' ``ALERTS`` series of these alerts while they fire."""
    return (
        f"{ALERTS}{{{', '.join([one_of('alertname', alertnames), eq('alertstate', 'firing'), *matchers])}}}"
    )


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator} / {denominator}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
