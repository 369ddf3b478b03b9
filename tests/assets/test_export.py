"""``export_assets`` and ``guarded assets export``: the shipped files, the options, the refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from guarded.assets import (
    COLLECTOR_CONFIG,
    DASHBOARD_PROVIDER_FILE,
    DATASOURCES_FILE,
    DEFAULT_DASHBOARDS_PATH,
    DEFAULT_FOLDER,
    GRAFANA_MOUNT,
    PROMETHEUS_URL_VARIABLE,
    RULE_FILE,
    TEMPO_URL_VARIABLE,
    AssetError,
    ExistingFilesError,
    export_assets,
    packaged_assets,
    render_assets,
)
from guarded.cli import main


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _sources(root: Path) -> dict[str, dict[str, Any]]:
    return {source["type"]: source for source in _yaml(root / DATASOURCES_FILE)["datasources"]}


def _provider(root: Path) -> dict[str, Any]:
    (provider,) = _yaml(root / DASHBOARD_PROVIDER_FILE)["providers"]
    assert isinstance(provider, dict)
    return provider


def _alerts(root: Path) -> list[dict[str, Any]]:
    groups = _yaml(root / RULE_FILE)["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _changed_lines(before: bytes, after: bytes) -> list[tuple[str, str]]:
    old, new = before.decode().splitlines(), after.decode().splitlines()
    assert len(old) == len(new)
    return [(a, b) for a, b in zip(old, new, strict=True) if a != b]


def test_the_default_export_is_the_packaged_files_byte_for_byte(tmp_path: Path) -> None:
    target = tmp_path / "new" / "assets"  # created, parents included
    written = export_assets(target)
    shipped = packaged_assets()
    assert written == sorted(target / path for path in shipped)
    assert {path.relative_to(target).as_posix() for path in target.rglob("*") if path.is_file()} == set(
        shipped
    )
    for path, data in shipped.items():
        assert (target / path).read_bytes() == data, path
    assert {
        "grafana/dashboards/guarded-store-overview.json",
        DATASOURCES_FILE,
        DASHBOARD_PROVIDER_FILE,
        RULE_FILE,
        COLLECTOR_CONFIG,
    } <= set(shipped)
    for path in shipped:
        if path.endswith(".json"):
            assert json.loads(shipped[path])["uid"].startswith("guarded-")
    # Exporting again over identical files is fine.
    assert export_assets(target) == written


def test_the_data_sources_read_their_urls_from_grafanas_environment(tmp_path: Path) -> None:
    export_assets(tmp_path)
    sources = _sources(tmp_path)
    assert sources["prometheus"]["url"] == f"${{{PROMETHEUS_URL_VARIABLE}}}"
    assert sources["tempo"]["url"] == f"${{{TEMPO_URL_VARIABLE}}}"
    provider = _provider(tmp_path)
    assert provider["folder"] == provider["folderUid"] == DEFAULT_FOLDER
    assert provider["options"]["path"] == DEFAULT_DASHBOARDS_PATH == f"{GRAFANA_MOUNT}/dashboards"


def test_the_options_rewrite_their_values_and_nothing_else(tmp_path: Path) -> None:
    base = "https://wiki.example.com/guarded/alerts.md"
    export_assets(
        tmp_path,
        runbook_base=base,
        prometheus_url="http://prometheus.monitoring:9090",
        tempo_url="https://tempo.example.com",
        folder="Platform / Storage: guarded",
        dashboards_path="/var/lib/grafana/dashboards/guarded",
    )
    sources = _sources(tmp_path)
    assert sources["prometheus"]["url"] == "http://prometheus.monitoring:9090"
    assert sources["tempo"]["url"] == "https://tempo.example.com"
    provider = _provider(tmp_path)
    assert provider["folder"] == "Platform / Storage: guarded"
    assert provider["folderUid"] == "platform-storage-guarded"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/guarded"
    alerts = _alerts(tmp_path)
    assert alerts
    for rule in alerts:
        assert rule["annotations"]["runbook_url"] == f"{base}#{rule['alert'].lower()}"

    shipped = packaged_assets()
    assert len(_changed_lines(shipped[DATASOURCES_FILE], (tmp_path / DATASOURCES_FILE).read_bytes())) == 2
    assert (
        len(
            _changed_lines(
                shipped[DASHBOARD_PROVIDER_FILE], (tmp_path / DASHBOARD_PROVIDER_FILE).read_bytes()
            )
        )
        == 3
    )
    rules = _changed_lines(shipped[RULE_FILE], (tmp_path / RULE_FILE).read_bytes())
    assert len(rules) == len(alerts)
    assert all("runbook_url: " in old and "runbook_url: " in new for old, new in rules)
    for path in shipped.keys() - {DATASOURCES_FILE, DASHBOARD_PROVIDER_FILE, RULE_FILE}:
        assert (tmp_path / path).read_bytes() == shipped[path], path


def test_a_url_may_name_another_environment_variable() -> None:
    rendered = render_assets(prometheus_url="${PROM_URL}", tempo_url="$TEMPO")
    text = rendered[DATASOURCES_FILE].decode()
    assert 'url: "${PROM_URL}"' in text
    assert 'url: "$TEMPO"' in text


def test_a_value_yaml_would_misread_is_quoted(tmp_path: Path) -> None:
    export_assets(tmp_path, folder="yes # not a comment", runbook_base="https://x.example/a.md?b='c'")
    assert _provider(tmp_path)["folder"] == "yes # not a comment"
    assert all(
        rule["annotations"]["runbook_url"].startswith("https://x.example/a.md?b='c'#")
        for rule in _alerts(tmp_path)
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prometheus_url": "prometheus:9090"}, "is not an http:// or https:// URL"),
        ({"prometheus_url": ""}, "is empty or contains whitespace"),
        ({"tempo_url": "http://tempo :3200"}, "is empty or contains whitespace"),
        ({"folder": "  "}, "is empty"),
        ({"folder": "???"}, "no ASCII letter or digit"),
        ({"dashboards_path": "dashboards"}, "is not absolute"),
        ({"runbook_base": "https://x.example/alerts.md#top"}, "without whitespace or '#'"),
        ({"runbook_base": "docs/alerts.md"}, "is not an absolute http(s) URL"),
        ({"runbook_base": ""}, "is not an absolute http(s) URL"),
    ],
)
def test_a_bad_option_is_an_asset_error_with_a_hint(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    with pytest.raises(AssetError, match=re.escape(message)) as caught:
        export_assets(tmp_path / "out", **options)
    assert caught.value.hint
    assert not (tmp_path / "out").exists()


def test_files_with_other_content_are_refused_unless_overwrite(tmp_path: Path) -> None:
    export_assets(tmp_path)
    (tmp_path / DATASOURCES_FILE).write_text("mine\n", encoding="utf-8")
    with pytest.raises(ExistingFilesError, match="already exists with other content") as caught:
        export_assets(tmp_path, prometheus_url="http://p:9090")
    assert caught.value.paths == [tmp_path / DATASOURCES_FILE]
    assert (tmp_path / DATASOURCES_FILE).read_text(encoding="utf-8") == "mine\n"  # nothing written

    export_assets(tmp_path, prometheus_url="http://p:9090", overwrite=True)
    assert _sources(tmp_path)["prometheus"]["url"] == "http://p:9090"


def test_a_file_as_the_target_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x", encoding="utf-8")
    with pytest.raises(AssetError, match="is not a directory"):
        export_assets(target)


# --- guarded assets export ---------------------------------------------------------------------


def test_the_command_writes_the_files_and_prints_their_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "assets",
            "export",
            str(tmp_path),
            "--prometheus-url",
            "http://prometheus:9090",
            "--tempo-url",
            "http://tempo:3200",
            "--folder",
            "Storage",
            "--dashboards-path",
            "/srv/dashboards",
            "--runbook-base",
            "https://wiki.example.com/alerts",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.splitlines() == [str(tmp_path / path) for path in packaged_assets()]
    assert _sources(tmp_path)["prometheus"]["url"] == "http://prometheus:9090"
    assert _provider(tmp_path)["folder"] == "Storage"
    assert _provider(tmp_path)["options"]["path"] == "/srv/dashboards"
    assert all(
        rule["annotations"]["runbook_url"].startswith("https://wiki.example.com/alerts#")
        for rule in _alerts(tmp_path)
    )


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: "), lines[0]
    assert "; hint: " in lines[0], lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["assets", "export", str(tmp_path), "--prometheus-url", "prometheus:9090"]) == 2
    assert "is not an http:// or https:// URL" in _one_error_line(capsys)

    assert main(["assets", "export", str(tmp_path)]) == 0
    capsys.readouterr()
    (tmp_path / COLLECTOR_CONFIG).write_text("edited\n", encoding="utf-8")
    assert main(["assets", "export", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert "already exists with other content" in line
    assert "--force" in line
    assert main(["assets", "export", str(tmp_path), "--force"]) == 0
    assert (tmp_path / COLLECTOR_CONFIG).read_bytes() == packaged_assets()[COLLECTOR_CONFIG]


def test_a_directory_that_cannot_be_written_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "grafana"
    blocker.write_text("a file where a directory must go", encoding="utf-8")
    assert main(["assets", "export", str(tmp_path)]) == 2
    assert "cannot write" in _one_error_line(capsys)
