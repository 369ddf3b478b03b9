"""``guarded demo`` through ``guarded.cli.main``: a tiny run with a JSON verdict, and usage errors."""

from __future__ import annotations

import json

import pytest

from guarded.cli import main


def test_a_tiny_run_prints_a_passing_json_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "demo",
            "--duration",
            "3",
            "--concurrency",
            "3",
            "--faults",
            "bad@1,kill@1.5:0.5",
            "--metrics-port",
            "0",
            "--no-live",
            "--json",
            "--no-penguiflow",
        ]
    )
    captured = capsys.readouterr()
    verdict = json.loads(captured.out)  # stdout holds the JSON document only
    assert code == 0, verdict
    assert verdict["passed"] is True
    assert verdict["lost"] == 0
    assert verdict["acknowledged"] > 0
    assert verdict["acknowledged"] == verdict["persisted"]
    assert [fault["kind"] for fault in sorted(verdict["faults"], key=lambda f: f["planned_at"])] == [
        "bad",
        "kill",
    ]
    assert {item["result"] for item in verdict["bad_payloads"]} == {"parked", "rejected"}
    assert verdict["penguiflow_runs"] == 0
    assert verdict["metrics_url"].startswith("http://127.0.0.1:")
    assert "guarded demo: 3 sessions" in captured.err  # the progress went to stderr
    assert "fault: bad started" in captured.err
    assert "fault: bad over: 6 refused payloads sent" in captured.err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--duration", "5", "--faults", "restart@4:3"], "ends at 7.0s, after the run (5s)"),
        (["--faults", "meltdown@1"], "unknown fault kind 'meltdown'"),
    ],
)
def test_a_schedule_that_does_not_fit_is_a_usage_error(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_flags_are_validated_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--duration", "0"]) == 2
    assert "must be longer than zero" in capsys.readouterr().err
    assert main(["demo", "--concurrency", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert main(["demo", "--metrics-port", "99999"]) == 2
    assert "'99999' is not a port number" in capsys.readouterr().err
