"""The committed grafana/ files are exactly what ``python -m dashboards`` generates."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from dashboards import alerts, output, provisioning
from dashboards.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def test_committed_grafana_files_are_the_generated_ones() -> None:
    found = output.differences()
    assert not found, (
        "grafana/ differs from what dashboards/ generates; run `python -m dashboards` and commit:\n  "
        + "\n  ".join(found)
    )


def test_rendering_is_byte_for_byte_stable() -> None:
    first, second = output.rendered_files(), output.rendered_files()
    assert first == second
    for path, text in first.items():
        assert text.endswith("\n"), path
        assert not text.endswith("\n\n"), path
        if path.endswith(".json"):
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_the_alert_rule_file_is_written_as_dashboards_alerts_renders_it() -> None:
    files = output.rendered_files()
    assert files[alerts.RULE_FILE_PATH] == alerts.render()


def test_check_lists_changed_missing_and_unexpected_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--grafana-dir", str(tmp_path)]) == 0
    assert main(["--check", "--grafana-dir", str(tmp_path)]) == 0
    capsys.readouterr()

    overview = tmp_path / "dashboards" / "guarded-store-overview.json"
    overview.write_text(
        overview.read_text(encoding="utf-8").replace("guarded_", "renamed_"), encoding="utf-8"
    )
    (tmp_path / provisioning.DATASOURCES_FILE).unlink()
    (tmp_path / "dashboards" / "hand-made.json").write_text("{}\n", encoding="utf-8")

    assert main(["--check", "--grafana-dir", str(tmp_path)]) == 1
    printed = capsys.readouterr().out
    assert "dashboards/guarded-store-overview.json: differs" in printed
    assert f"{provisioning.DATASOURCES_FILE}: missing" in printed
    assert "dashboards/hand-made.json: not generated" in printed
    assert "python -m dashboards" in printed

    assert main(["--grafana-dir", str(tmp_path)]) == 0
    assert output.differences(tmp_path) == ["dashboards/hand-made.json: not generated (delete it)"]


def test_python_dash_m_dashboards_check_exits_1_on_an_empty_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dashboards", "--check", "--grafana-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "guarded-store-overview.json: missing" in result.stdout


def _alerts_module(**attributes: object) -> types.ModuleType:
    module = types.ModuleType(output.ALERTS_MODULE)
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


def test_no_rule_file_without_an_alerts_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, output.ALERTS_MODULE, None)
    files = output.rendered_files()
    assert alerts.RULE_FILE_PATH not in files
    assert any(path.startswith("dashboards/") for path in files)


def test_an_alerts_module_without_a_render_function_is_dumped_as_yaml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    document = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]}
    monkeypatch.setitem(
        sys.modules,
        output.ALERTS_MODULE,
        _alerts_module(rule_file=lambda: document, RULE_FILE_PATH="rules/x.yml"),
    )
    text = output.rendered_files()["rules/x.yml"]
    assert text.startswith(output.GENERATED)
    assert "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n" in text


@pytest.mark.parametrize(
    ("attributes", "error"),
    [
        ({"RULE_FILE_PATH": "alerts/x.yml"}, TypeError),
        ({"rule_file": lambda: {}}, TypeError),
        ({"rule_file": lambda: ["not", "a", "mapping"], "RULE_FILE_PATH": "x.yml"}, TypeError),
        ({"rule_file": lambda: {}, "RULE_FILE_PATH": "../outside.yml"}, ValueError),
        ({"rule_file": lambda: {}, "RULE_FILE_PATH": "/etc/prometheus/rules.yml"}, ValueError),
        ({"rule_file": lambda: {}, "RULE_FILE_PATH": "dashboards/guarded-tasks.json"}, ValueError),
    ],
)
def test_a_malformed_alerts_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, attributes: dict[str, object], error: type[Exception]
) -> None:
    monkeypatch.setitem(sys.modules, output.ALERTS_MODULE, _alerts_module(**attributes))
    with pytest.raises(error, match=r"RULE_FILE_PATH|rule_file|collides"):
        output.rendered_files()
