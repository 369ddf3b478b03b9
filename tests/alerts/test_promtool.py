"""The real promtool checks the rule file and runs the committed unit tests of every alert.

The mutation tests weaken one decision of one rule (an outcome counted, a window, a ``for``, a
guard) and require promtool to fail that alert's unit tests: proof that the unit tests can fail
and that the near misses are really tested. Every promtool run is independent, so they all start
at once (a module fixture) and each test reads its own run's result.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import alerts
from guarded.observability import telemetry_names as names

from . import promtool_cases

REPO = Path(__file__).resolve().parents[2]
RULE_FILE = REPO / "grafana" / alerts.RULE_FILE_PATH
TEST_DIR = promtool_cases.TEST_DIR
RULE_FILE_NAME = Path(promtool_cases.RULE_FILE).name

Result = subprocess.CompletedProcess[str]


def _run(promtool: str, *args: str, cwd: Path = REPO) -> Result:
    command = [promtool, *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


# --- mutations ---------------------------------------------------------------------------------

Rule = dict[str, Any]


@dataclass(frozen=True)
class Mutation:
    """Weaken the rules of ``alert`` with ``change``; the unit tests in ``test_file`` must fail."""

    id: str
    alert: str
    change: Callable[[Rule], None]
    test_file: str
    severity: str | None = None
    """Only the rule of this severity (an alert with two tiers)."""


def _replace(old: str, new: str) -> Callable[[Rule], None]:
    def change(rule: Rule) -> None:
        assert old in rule["expr"], f"mutation target {old!r} not in {rule['alert']}: update the mutation"
        rule["expr"] = rule["expr"].replace(old, new)

    return change


def _drop_for(rule: Rule) -> None:
    assert "for" in rule, f"{rule['alert']} has no `for`: update the mutation"
    del rule["for"]


def _never_fires(rule: Rule) -> None:
    rule["expr"] = "vector(1) == 0"


def _without_new_series(rule: Rule) -> None:
    """Drop the clause of :func:`dashboards.alerts.events_in_window` that counts the series born
    in the window (its first parenthesised block and the ``or`` after it)."""
    lines = rule["expr"].splitlines()
    start = next(index for index, line in enumerate(lines) if line.strip() == "(")
    closing = lines[start].replace("(", ")")
    end = lines.index(closing, start + 1)
    assert lines[end + 1].strip() == "or", f"{rule['alert']}: unexpected shape, update the mutation"
    rule["expr"] = "\n".join(lines[:start] + lines[end + 2 :])


def _born_without_alive_check(rule: Rule) -> None:
    """Count a series as born whenever it was missing ``window`` ago, process up or not."""
    lines = rule["expr"].splitlines()
    check = f"and on ({', '.join(alerts.PROCESS_LABELS)})"
    start = next((index for index, line in enumerate(lines) if line.strip() == check), None)
    assert start is not None, f"{rule['alert']}: unexpected shape, update the mutation"
    assert lines[start + 1].strip().startswith(f"{alerts.ALIVE} offset"), rule["alert"]
    rule["expr"] = "\n".join(lines[:start] + lines[start + 2 :])


MUTATIONS = [
    Mutation(
        "pause-save-misses-new-series-of-a-young-process",
        names.ALERT_PAUSE_SAVE_FAILED,
        _replace(f"(count_over_time({alerts.ALIVE}[5m]))", f"(count_over_time({alerts.ALIVE}[5m]) * 0)"),
        "pause-save-failed.yml",
    ),
    Mutation(
        "pause-save-ignores-dead-lettered",
        names.ALERT_PAUSE_SAVE_FAILED,
        _replace("circuit_open|dead_lettered|fallback", "circuit_open|fallback"),
        "pause-save-failed.yml",
    ),
    Mutation(
        "pause-save-counts-retried-and-cancelled",
        names.ALERT_PAUSE_SAVE_FAILED,
        _replace('outcome=~"circuit_open', 'outcome=~"ok|retried|cancelled|circuit_open'),
        "pause-save-failed.yml",
    ),
    Mutation(
        "pause-save-misses-new-series",
        names.ALERT_PAUSE_SAVE_FAILED,
        _without_new_series,
        "pause-save-failed.yml",
    ),
    Mutation(
        "pause-save-old-failures-look-new-after-a-failed-scrape",
        names.ALERT_PAUSE_SAVE_FAILED,
        _born_without_alive_check,
        "pause-save-failed.yml",
    ),
    Mutation(
        "drops-old-drops-look-new-after-a-failed-scrape",
        names.ALERT_DEADLETTER_DROPS,
        _born_without_alive_check,
        "deadletter-drops.yml",
    ),
    Mutation(
        "pause-load-counts-not-found-and-stale",
        names.ALERT_PAUSE_LOAD_FAILED,
        _replace('outcome=~"circuit_open', 'outcome=~"not_found|stale|circuit_open'),
        "pause-load-failed.yml",
    ),
    Mutation(
        "circuit-open-only",
        names.ALERT_CIRCUIT_OPEN,
        _replace('state=~"half_open|open"', 'state="open"'),
        "circuit-open.yml",
        alerts.CRITICAL,
    ),
    Mutation("circuit-no-for", names.ALERT_CIRCUIT_OPEN, _drop_for, "circuit-open.yml", alerts.CRITICAL),
    Mutation(
        "circuit-without-traffic-guard",
        names.ALERT_CIRCUIT_OPEN,
        _replace(" > 0)", " >= 0)"),
        "circuit-open.yml",
        alerts.CRITICAL,
    ),
    Mutation(
        "circuit-forced-open-pages-at-once",
        names.ALERT_CIRCUIT_OPEN,
        _drop_for,
        "circuit-open.yml",
        alerts.WARNING,
    ),
    Mutation(
        "drops-miss-new-series",
        names.ALERT_DEADLETTER_DROPS,
        _without_new_series,
        "deadletter-drops.yml",
    ),
    Mutation(
        "refusals-miss-new-series",
        names.ALERT_DEADLETTER_REFUSED,
        _without_new_series,
        "deadletter-refused.yml",
    ),
    Mutation(
        "refusals-old-refusals-look-new-after-a-failed-scrape",
        names.ALERT_DEADLETTER_REFUSED,
        _born_without_alive_check,
        "deadletter-refused.yml",
    ),
    Mutation(
        "age-threshold-too-low",
        names.ALERT_DEADLETTER_OLD,
        _replace(f"> {alerts.DEADLETTER_AGE_WARNING_SECONDS}", "> 800"),
        "deadletter-oldest-entry-age.yml",
        alerts.WARNING,
    ),
    Mutation(
        "burn-without-short-window",
        names.ALERT_ERROR_BUDGET_BURN,
        _replace(f"\nand\n{alerts.error_ratio_record('5m')} >", f"\nor\n{alerts.error_ratio_record('1h')} >"),
        "error-budget-burn.yml",
        alerts.CRITICAL,
    ),
    Mutation(
        "burn-without-long-window",
        names.ALERT_ERROR_BUDGET_BURN,
        _replace(f"{alerts.error_ratio_record('6h')} >", f"{alerts.error_ratio_record('30m')} >"),
        "error-budget-burn.yml",
        alerts.WARNING,
    ),
    Mutation("latency-no-for", names.ALERT_LATENCY_P99, _drop_for, "latency-p99.yml"),
    Mutation("memory-no-for", names.ALERT_MEMORY_DEGRADED, _drop_for, "memory-degraded.yml"),
    Mutation(
        "tasks-without-volume-guard",
        names.ALERT_TASK_FAILURE_RATIO,
        _replace(f">= {alerts.TASK_MIN_ENDED}", ">= 0"),
        "task-failure-ratio.yml",
    ),
    Mutation(
        "pause-page-without-for-pages-on-a-failover",
        names.ALERT_PAUSE_SAVES_FAILING,
        _drop_for,
        "pause-saves-failing.yml",
    ),
    Mutation(
        "pause-page-per-instance",
        names.ALERT_PAUSE_SAVES_FAILING,
        _replace("sum by (job, store) (", "sum by (job, instance, store) ("),
        "pause-saves-failing.yml",
    ),
    Mutation(
        "pause-page-window-too-long",
        names.ALERT_PAUSE_SAVES_FAILING,
        _replace(f"[{alerts.PAUSE_PAGE_WINDOW}]", "[10m]"),
        "pause-saves-failing.yml",
    ),
    Mutation(
        "pause-ticket-per-outcome",
        names.ALERT_PAUSE_SAVE_FAILED,
        _replace("sum by (job, instance, store) (", "sum by (job, instance, store, outcome) ("),
        "pause-save-failed.yml",
    ),
    Mutation(
        "parked-old-writes-look-new-after-a-failed-scrape",
        names.ALERT_DEADLETTER_PARKED,
        _born_without_alive_check,
        "deadletter-parked.yml",
    ),
    Mutation(
        "quarantined-old-rows-look-new-after-a-failed-scrape",
        names.ALERT_DEADLETTER_QUARANTINED,
        _born_without_alive_check,
        "deadletter-quarantined.yml",
    ),
    Mutation(
        "parked-misses-new-series",
        names.ALERT_DEADLETTER_PARKED,
        _without_new_series,
        "deadletter-parked.yml",
    ),
    Mutation(
        "replay-stalled-during-an-outage",
        names.ALERT_REPLAY_STALLED,
        _replace(") == 1)\nunless", ") >= 0)\nunless"),
        "deadletter-replay-stalled.yml",
    ),
    Mutation("replay-stalled-no-for", names.ALERT_REPLAY_STALLED, _drop_for, "deadletter-replay-stalled.yml"),
    Mutation(
        "replay-stalled-ignores-replays",
        names.ALERT_REPLAY_STALLED,
        _replace(" > 0)", " > 1e9)"),
        "deadletter-replay-stalled.yml",
    ),
    Mutation("pool-saturated-no-for", names.ALERT_POOL_SATURATED, _drop_for, "pool-saturated.yml"),
    Mutation(
        "pool-saturated-without-a-line",
        names.ALERT_POOL_SATURATED,
        _replace(f"({names.BULKHEAD_QUEUE_DEPTH}) > 0", f"({names.BULKHEAD_QUEUE_DEPTH}) >= 0"),
        "pool-saturated.yml",
    ),
    Mutation("batch-queue-full-no-for", names.ALERT_BATCH_QUEUE_FULL, _drop_for, "batch-queue-full.yml"),
    Mutation(
        "batch-writes-old-drops-look-new-after-a-failed-scrape",
        names.ALERT_BATCH_WRITES_FAILED,
        _born_without_alive_check,
        "batch-writes-failed.yml",
    ),
    Mutation("schema-skew-no-for", names.ALERT_SCHEMA_VERSION_SKEW, _drop_for, "schema-version-skew.yml"),
    Mutation(
        "schema-skew-across-schemas",
        names.ALERT_SCHEMA_VERSION_SKEW,
        _replace(
            f"max by ({alerts.LABEL_JOB}, {names.LABEL_SCHEMA}) (",
            f"max by ({alerts.LABEL_JOB}) (",
        ),
        "schema-version-skew.yml",
    ),
    Mutation("replica-skipped-no-for", names.ALERT_REPLICA_SKIPPED, _drop_for, "replica-skipped.yml"),
    Mutation("pooler-mismatch-no-for", names.ALERT_POOLER_MISMATCH, _drop_for, "pooler-mismatch.yml"),
    Mutation(
        "partition-horizon-no-for",
        names.ALERT_PARTITION_HORIZON_NEAR,
        _drop_for,
        "partition-horizon-near.yml",
    ),
    Mutation(
        "partition-horizon-of-the-stalest-process",
        names.ALERT_PARTITION_HORIZON_NEAR,
        _replace("max by (", "min by ("),
        "partition-horizon-near.yml",
    ),
    Mutation(
        "tasks-count-cancelled-as-failed",
        names.ALERT_TASK_FAILURE_RATIO,
        _replace('{event_type="task_failed"}', '{event_type=~"task_cancelled|task_failed"}'),
        "task-failure-ratio.yml",
    ),
]


def _write_rules(directory: Path, document: dict[str, Any], test_files: list[str]) -> list[Path]:
    """The layout promtool expects: the rule file, and the test files in ``tests/`` beside it."""
    directory.mkdir()
    (directory / RULE_FILE_NAME).write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    tests = directory / "tests"
    tests.mkdir()
    for name in test_files:
        shutil.copy(TEST_DIR / name, tests / name)
    return [tests / name for name in test_files]


def _mutated(mutation: Mutation) -> dict[str, Any]:
    """The rule file with ``mutation`` applied, keeping only the mutated alert's rules and the
    recording rules they read: other alerts cannot change the outcome of this alert's tests, and
    promtool evaluates every rule of the file at every step."""
    document = copy.deepcopy(alerts.rule_file())
    changed = 0
    read = ""
    for group in document["groups"]:
        group["rules"] = [rule for rule in group["rules"] if rule.get("alert") == mutation.alert]
        read += "\n".join(rule["expr"] for rule in group["rules"])
        for rule in group["rules"]:
            if mutation.severity is not None and rule["labels"]["severity"] != mutation.severity:
                continue
            mutation.change(rule)
            changed += 1
    assert changed, f"mutation {mutation.id} matched no rule"
    for group, original in zip(document["groups"], alerts.rule_file()["groups"], strict=True):
        group["rules"] += [rule for rule in original["rules"] if rule.get("record", "\0") in read]
    return document


def _never_firing() -> dict[str, Any]:
    document = copy.deepcopy(alerts.rule_file())
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                _never_fires(rule)
    return document


@dataclass(frozen=True)
class MutationRun:
    checked: Result
    """``promtool check rules`` of the mutated rule file."""
    tested: Result
    """``promtool test rules`` of the alert's unit tests against it."""


def _run_mutation(promtool: str, directory: Path, mutation: Mutation) -> MutationRun:
    [test_file] = _write_rules(directory, _mutated(mutation), [mutation.test_file])
    checked = _run(promtool, "check", "rules", RULE_FILE_NAME, cwd=directory)
    return MutationRun(checked, _run(promtool, "test", "rules", str(test_file), cwd=directory))


def _run_never_firing(promtool: str, directory: Path) -> Result:
    files = _write_rules(directory, _never_firing(), list(promtool_cases.FILES))
    return _run(promtool, "test", "rules", *map(str, files), cwd=directory)


def _run_committed(promtool: str) -> Result:
    files = [str(path.relative_to(REPO)) for path in sorted(TEST_DIR.glob("*.yml"))]
    return _run(promtool, "test", "rules", *files)


@dataclass(frozen=True)
class Runs:
    committed: Future[Result]
    """The committed unit tests against the committed rule file."""
    never_firing: Future[Result]
    """Every unit test against rules whose alerts never fire."""
    mutations: dict[str, Future[MutationRun]]


@pytest.fixture(scope="module")
def runs(promtool: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("promtool")
    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        # promtool is spawned from several threads at once. With vfork (CPython's default on
        # Linux) one child's execve failed once with EFAULT ("Bad address") in a fresh-clone
        # make test; plain fork, the documented fallback, shares no memory with the other threads.
        patch.setattr(subprocess, "_USE_VFORK", False)
        yield Runs(
            committed=pool.submit(_run_committed, promtool),
            never_firing=pool.submit(_run_never_firing, promtool, root / "never-firing"),
            mutations={
                mutation.id: pool.submit(_run_mutation, promtool, root / mutation.id, mutation)
                for mutation in MUTATIONS
            },
        )


# --- tests -------------------------------------------------------------------------------------


def test_promtool_accepts_the_rule_file(promtool: str) -> None:
    result = _run(promtool, "check", "rules", str(RULE_FILE.relative_to(REPO)))
    rules = sum(len(group["rules"]) for group in alerts.rule_file()["groups"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {rules} rules found" in result.stdout + result.stderr


def test_committed_unit_tests_are_what_the_cases_generate() -> None:
    expected = promtool_cases.rendered()
    committed = {path.name: path.read_text(encoding="utf-8") for path in sorted(TEST_DIR.glob("*.yml"))}
    assert set(committed) == set(expected), "regenerate with `python -m tests.alerts.promtool_cases`"
    for name, text in expected.items():
        assert committed[name] == text, f"{name} is stale: run `python -m tests.alerts.promtool_cases`"


def test_every_alert_has_a_unit_test_file_that_fires_it_and_keeps_it_silent() -> None:
    assert sorted(alert for alert, _ in promtool_cases.FILES.values()) == sorted(names.ALERT_NAMES)
    for name, (alert, build) in promtool_cases.FILES.items():
        checks = [check for test in build()["tests"] for check in test["alert_rule_test"]]
        assert {check["alertname"] for check in checks} == {alert}, name
        assert any(check["exp_alerts"] for check in checks), f"{name} never expects {alert} to fire"
        assert any(not check["exp_alerts"] for check in checks), f"{name} never expects {alert} silent"


def test_every_alert_goes_through_a_30_second_failover_and_only_the_tickets_fire() -> None:
    single_failure_tickets = {names.ALERT_PAUSE_SAVE_FAILED, names.ALERT_PAUSE_LOAD_FAILED}
    for name, (alert, build) in promtool_cases.FILES.items():
        [failover] = [
            test for test in build()["tests"] if test["name"].startswith("a 30 s database failover")
        ]
        assert failover["interval"] == promtool_cases.BLIP_INTERVAL == "15s", name
        assert promtool_cases.DURING * 15 == 30
        checks = failover["alert_rule_test"]
        assert any(not check["exp_alerts"] for check in checks), f"{name}: never silent after the failover"
        firing = [check for check in checks if check["exp_alerts"]]
        assert bool(firing) == (alert in single_failure_tickets), f"{name}: {alert} and the failover"
        assert all(check["exp_alerts"][0]["exp_labels"]["severity"] == "warning" for check in firing), name


def test_every_alert_passes_its_unit_tests(runs: Runs) -> None:
    result = runs.committed.result()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(promtool_cases.FILES), result.stdout


def test_every_alerts_unit_tests_fail_when_it_never_fires(runs: Runs) -> None:
    result = runs.never_firing.result()
    assert result.returncode != 0
    for alert in names.ALERT_NAMES:
        assert f"alertname: {alert}," in result.stderr, f"no test of {alert} failed"


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[mutation.id for mutation in MUTATIONS])
def test_unit_tests_fail_when_a_rule_is_weakened(runs: Runs, mutation: Mutation) -> None:
    run = runs.mutations[mutation.id].result()
    assert run.checked.returncode == 0, f"the mutation broke the syntax, not the logic: {run.checked.stdout}"
    tested = run.tested
    assert tested.returncode != 0, f"{mutation.test_file} still passes with {mutation.id}:\n{tested.stdout}"
    assert "FAILED" in tested.stdout + tested.stderr
