"""Run PromQL through the real ``promtool``: parse checks and evaluation on synthetic series.

``promtool check rules`` parses every expression of a rule file, so each dashboard query becomes
a recording rule; ``promtool test rules`` evaluates an expression on series given sample by
sample, with Prometheus' own engine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

RECORD_PREFIX = "dashboard_check:"
Sample = tuple[str, float]
"""``('{label="value", ...}', value)`` as promtool expects expected samples."""


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise RuntimeError("promtool is not installed (Debian package 'prometheus'); the dashboards need it")
    return found


def syntax_errors(expressions: Sequence[tuple[str, str]], workdir: Path) -> list[str]:
    """``promtool check rules`` on ``(name, expr)`` pairs; one message per expression it rejects."""
    rules = [
        {"record": f"{RECORD_PREFIX}{index}", "expr": expr} for index, (_, expr) in enumerate(expressions)
    ]
    path = workdir / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode == 0:
        return []
    output = result.stdout + result.stderr
    failing = sorted({int(index) for index in re.findall(re.escape(RECORD_PREFIX) + r"(\d+)", output)})
    if not failing:
        return [f"promtool check rules failed without naming a rule:\n{output}"]
    lines = output.splitlines()
    return [
        f"{expressions[index][0]}: {expressions[index][1]}\n    "
        + " ".join(line.strip() for line in lines if f'"{RECORD_PREFIX}{index}"' in line)
        for index in failing
    ]


def evaluation_failure(
    series: Mapping[str, str],
    expr: str,
    eval_minutes: int,
    expected: Sequence[Sample],
    workdir: Path,
) -> str | None:
    """Evaluate ``expr`` at minute ``eval_minutes`` over ``series`` (one sample a minute).

    ``series`` maps a series (``name{labels}``) to promtool's expanding notation (``0+1x10``).
    Returns ``None`` when the result is exactly ``expected``, else promtool's explanation.
    """
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": f"{eval_minutes}m",
                        "exp_samples": [{"labels": labels, "value": value} for labels, value in expected],
                    }
                ],
            }
        ],
    }
    path = workdir / "dashboard-eval.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    return None if result.returncode == 0 else result.stdout + result.stderr
