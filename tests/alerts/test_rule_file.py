"""The rule file: generated from the code, named from telemetry_names, each alert with a runbook."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from penguiflow.sessions.telemetry import TaskTelemetryEvent

from dashboards import alerts, semantics
from guarded.deadletter.telemetry import LABEL_REASON
from guarded.layers.breaker import BreakerState
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome
from guarded.policy import Kind
from guarded.policy_table import PolicyTable
from guarded.telemetry.task_events import TASK_ENDS

REPO = Path(__file__).resolve().parents[2]
RULE_FILE = REPO / "grafana" / alerts.RULE_FILE_PATH
RUNBOOKS = REPO / alerts.RUNBOOK_DOC
RUNBOOK_PARTS = ("What it means", "Impact", "First checks", "Remediation")


def _rules() -> list[dict[str, Any]]:
    return [rule for group in alerts.rule_file()["groups"] for rule in group["rules"]]


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def _runbook_sections() -> dict[str, str]:
    """Level-2 sections of docs/alerts.md by GitHub anchor (heading lower-cased, spaces to dashes)."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    for chunk in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading, _, body = chunk.partition("\n")
        anchor = re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")
        sections[anchor] = body
    return sections


def test_committed_rule_file_is_what_the_code_generates() -> None:
    assert RULE_FILE.exists(), f"{RULE_FILE} is missing: run `python -m dashboards.alerts`"
    committed = RULE_FILE.read_text(encoding="utf-8")
    assert yaml.safe_load(committed) == alerts.rule_file(), "regenerate with `python -m dashboards.alerts`"
    assert committed == alerts.render(), "regenerate with `python -m dashboards.alerts`"


def test_rendering_is_deterministic_and_round_trips() -> None:
    assert alerts.render() == alerts.render()
    assert yaml.safe_load(alerts.render()) == alerts.rule_file()


def test_every_alert_name_has_a_rule_and_every_rule_a_known_name() -> None:
    defined = {
        value for key, value in vars(names).items() if key.startswith("ALERT_") and isinstance(value, str)
    }
    assert defined == set(names.ALERT_NAMES), "ALERT_NAMES misses an ALERT_* constant"
    used = {rule["alert"] for rule in _alert_rules()}
    assert used == defined


def test_durations_in_annotations_are_spelled_out() -> None:
    assert alerts.in_words("5m") == "5 minutes"
    assert alerts.in_words("1h") == "1 hour"
    assert alerts.in_words(15 * 60) == "15 minutes"
    assert alerts.in_words(90) == "90 seconds"


def test_every_alert_has_a_severity_summary_description_and_runbook() -> None:
    for rule in _alert_rules():
        assert rule["labels"]["severity"] in (alerts.CRITICAL, alerts.WARNING), rule["alert"]
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, rule["alert"]
        assert "{{ $labels." in annotations["description"], rule["alert"]
        assert annotations["runbook_url"] == f"{alerts.DEFAULT_RUNBOOK_BASE}#{rule['alert'].lower()}"
        assert alerts.is_absolute_url(annotations["runbook_url"]), rule["alert"]


def test_every_alert_has_a_runbook_section_with_its_four_parts() -> None:
    sections = _runbook_sections()
    for rule in _alert_rules():
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor in sections, f"docs/alerts.md has no section for {rule['alert']}"
        for part in RUNBOOK_PARTS:
            assert f"**{part}.**" in sections[anchor], f"{rule['alert']}: runbook lacks '{part}'"


def test_runbook_links_follow_the_chosen_base() -> None:
    base = "https://example.invalid/guarded/docs/alerts.md"
    for group in alerts.rule_file(runbook_base=base)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["annotations"]["runbook_url"] == f"{base}#{rule['alert'].lower()}"


def _series_names(expr: str) -> set[str]:
    """Metric and recorded-series names in ``expr`` (identifiers followed by a selector, range,
    offset or the end of a term, excluding PromQL functions and keywords)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_strings))
    return {token for token in tokens if token.startswith("guarded_") or ":" in token}


def test_every_series_a_rule_reads_comes_from_telemetry_names_or_a_recording_rule() -> None:
    constants = {value for value in vars(names).values() if isinstance(value, str)}
    exposed = {alerts.CALLS_TOTAL, alerts.CALL_DURATION_BUCKET}
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    read: set[str] = set()
    for rule in _rules():
        read |= _series_names(rule["expr"])
    assert read, "no series found: the name pattern is broken"
    assert read <= constants | exposed | recorded, read - constants - exposed - recorded
    assert alerts.CALLS_TOTAL == names.CALLS + "_total"
    assert alerts.CALL_DURATION_BUCKET == names.CALL_DURATION + "_bucket"


def test_every_recorded_series_is_read_by_an_alert() -> None:
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    read: set[str] = set()
    for rule in _alert_rules():
        read |= _series_names(rule["expr"])
    assert recorded == read & recorded


def test_each_outcome_is_a_success_an_error_or_neutral_exactly_once() -> None:
    kinds = (semantics.SUCCESS_OUTCOMES, semantics.ERROR_OUTCOMES, semantics.NEUTRAL_OUTCOMES)
    assert set().union(*kinds) == set(Outcome)
    assert sum(len(kind) for kind in kinds) == len(Outcome)
    assert Outcome.NOT_FOUND in semantics.SUCCESS_OUTCOMES
    assert Outcome.DEAD_LETTERED in semantics.PAUSE_SAVE_FAILURE_OUTCOMES
    assert Outcome.STALE not in semantics.PAUSE_LOAD_FAILURE_OUTCOMES
    assert set(semantics.PAUSE_SAVE_FAILURE_OUTCOMES) <= set(semantics.ERROR_OUTCOMES)
    assert set(semantics.PAUSE_LOAD_FAILURE_OUTCOMES) <= set(semantics.ERROR_OUTCOMES)


def test_pause_methods_are_the_policy_tables_critical_save_and_consume_once_load() -> None:
    table = PolicyTable.for_state_store()
    save, load = table.get(semantics.SAVE_PAUSE_METHOD), table.get(semantics.LOAD_PAUSE_METHOD)
    assert not save.inferred
    assert save.critical
    assert not load.inferred
    assert load.kind is Kind.CONSUME


def test_label_values_come_from_their_definitions() -> None:
    assert set(alerts.NOT_CLOSED_STATES) <= set(BreakerState)
    assert alerts.MEMORY_DEGRADED in names.MEMORY_HEALTH_STATES
    event_types = typing.get_args(TaskTelemetryEvent.model_fields["event_type"].annotation)
    assert set(semantics.TASK_TERMINAL_EVENTS) <= set(event_types)
    assert set(semantics.TASK_TERMINAL_EVENTS) == TASK_ENDS
    assert semantics.TASK_FAILED in semantics.TASK_TERMINAL_EVENTS


def test_thresholds_drawn_on_panels_are_the_alerts_thresholds() -> None:
    assert semantics.TASK_FAILURE_RATIO_ALERT == alerts.TASK_FAILURE_RATIO_THRESHOLD
    assert semantics.DEADLETTER_AGE_WARNING_SECONDS == alerts.DEADLETTER_AGE_WARNING_SECONDS
    assert semantics.DEADLETTER_AGE_CRITICAL_SECONDS == alerts.DEADLETTER_AGE_CRITICAL_SECONDS
    assert semantics.LATENCY_P99_ALERT_SECONDS == alerts.LATENCY_P99_THRESHOLD_SECONDS


def test_the_replay_stall_says_how_long_nothing_was_replayed() -> None:
    def seconds(duration: str) -> int:
        return int(duration[:-1]) * {"m": 60, "h": 3600}[duration[-1]]

    quiet = seconds(alerts.REPLAY_STALLED_WINDOW) + seconds(alerts.REPLAY_STALLED_FOR)
    assert quiet == alerts.REPLAY_STALLED_QUIET_SECONDS


def test_slo_numbers_agree() -> None:
    assert pytest.approx(1 - alerts.SLO_TARGET) == alerts.ERROR_BUDGET
    windows = {tier.long_window for tier in alerts.BURN_RATE_TIERS}
    windows |= {tier.short_window for tier in alerts.BURN_RATE_TIERS}
    assert windows == set(alerts.ERROR_RATIO_WINDOWS)


def test_rules_aggregate_by_bounded_labels_only() -> None:
    bounded = {
        alerts.LABEL_JOB,
        alerts.LABEL_INSTANCE,
        LABEL_REASON,
        alerts.LABEL_LE,
        names.LABEL_SCHEMA,
        names.LABEL_STORE,
        names.LABEL_METHOD,
        names.LABEL_OUTCOME,
        names.LABEL_TASK_TYPE,
        names.LABEL_POOLER_ERROR_KIND,
        names.LABEL_TABLE,
        names.LABEL_NODE,  # a Redis server of the deployment: bounded by the cluster's size
        names.LABEL_REDIS_ERROR_KIND,
    }
    for rule in _rules():
        for group in re.findall(r"\b(?:by|on) \(([^)]*)\)", rule["expr"]):
            labels = {label.strip() for label in group.split(",")}
            assert labels <= bounded, (rule.get("alert") or rule.get("record"), labels - bounded)


def test_main_writes_the_rule_file(tmp_path: Path) -> None:
    target = tmp_path / "nested" / "rules.yml"
    assert alerts.main([str(target)]) == 0
    assert target.read_text(encoding="utf-8") == alerts.render()


def test_main_links_runbooks_where_they_are_published(tmp_path: Path) -> None:
    target = tmp_path / "rules.yml"
    base = "https://runbooks.example.invalid/alerts.md"
    assert alerts.main(["--runbook-base", base, str(target)]) == 0
    assert yaml.safe_load(target.read_text(encoding="utf-8")) == alerts.rule_file(runbook_base=base)


def test_the_default_runbook_base_is_the_published_docs_alerts_md() -> None:
    assert alerts.is_absolute_url(alerts.DEFAULT_RUNBOOK_BASE)
    assert alerts.DEFAULT_RUNBOOK_BASE.endswith("/" + alerts.RUNBOOK_DOC)
    assert "{{" not in alerts.DEFAULT_RUNBOOK_BASE


def test_main_takes_the_runbook_base_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = "https://wiki.example.invalid/ops/guarded-alerts"
    monkeypatch.setenv(alerts.RUNBOOK_BASE_ENV, base)
    target = tmp_path / "rules.yml"
    assert alerts.main([str(target)]) == 0
    assert yaml.safe_load(target.read_text(encoding="utf-8")) == alerts.rule_file(runbook_base=base)
    override = "https://other.example.invalid/alerts.md"
    assert alerts.main(["--runbook-base", override, str(target)]) == 0
    assert yaml.safe_load(target.read_text(encoding="utf-8")) == alerts.rule_file(runbook_base=override)


@pytest.mark.parametrize(
    "base", ["docs/alerts.md", "/srv/docs/alerts.md", "ftp://host/alerts.md", "https://"]
)
def test_main_refuses_a_runbook_base_that_is_not_an_absolute_url(
    base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "rules.yml"
    with pytest.raises(SystemExit) as exit_info:
        alerts.main(["--runbook-base", base, str(target)])
    assert exit_info.value.code == 2
    assert "--runbook-base must be an absolute http(s) URL" in capsys.readouterr().err
    assert not target.exists()


def test_the_pause_save_page_waits_and_the_ticket_does_not() -> None:
    by_name = {rule["alert"]: rule for rule in _alert_rules()}
    page = by_name[names.ALERT_PAUSE_SAVES_FAILING]
    ticket = by_name[names.ALERT_PAUSE_SAVE_FAILED]
    assert page["labels"]["severity"] == alerts.CRITICAL
    assert page["for"] == alerts.PAUSE_PAGE_FOR
    assert "sum by (job, store) (" in page["expr"]  # one page per store, not per outcome or instance
    assert ticket["labels"]["severity"] == alerts.WARNING
    assert "for" not in ticket
    assert ticket["expr"].startswith(f"sum by ({', '.join(alerts.PROCESS_LABELS)}) (")  # outcomes together


def test_main_refuses_unknown_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        alerts.main(["--frobnicate"])
    assert exit_info.value.code == 2
    assert "usage" in capsys.readouterr().err
