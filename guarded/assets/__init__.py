"""The operator's files that ship with guarded, and :func:`export_assets`, which writes them.

``guarded assets export DIR`` (or :func:`export_assets`) writes::

    DIR/grafana/dashboards/*.json                      the dashboards (docs/dashboards.md)
    DIR/grafana/provisioning/datasources/guarded.yaml  Prometheus and Tempo data sources
    DIR/grafana/provisioning/dashboards/guarded.yaml   a file provider for the dashboards
    DIR/grafana/alerts/guarded-rules.yml               Prometheus alert and recording rules
    DIR/otel-collector.yaml                            an OpenTelemetry Collector configuration

Unchanged, the files are the package's own bytes: the data source URLs are Grafana environment
references (``${GUARDED_PROMETHEUS_URL}``, ``${GUARDED_TEMPO_URL}``), the dashboards land in the
folder ``guarded`` and are read from ``/etc/grafana/guarded/dashboards``. The options rewrite
exactly those values, and the runbook link of every alert.

The files in this package are copies: ``grafana/`` under it is what ``python -m dashboards``
generates (the repository's ``grafana/``, from ``dashboards/``) and ``otel-collector.yaml`` is
the repository's. tests/assets/ fails when they drift; ``make assets`` refreshes them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

PROMETHEUS_URL_VARIABLE = "GUARDED_PROMETHEUS_URL"
"""The environment variable Grafana reads the Prometheus data source's URL from."""
TEMPO_URL_VARIABLE = "GUARDED_TEMPO_URL"
"""The environment variable Grafana reads the Tempo data source's URL from."""
GRAFANA_MOUNT = "/etc/grafana/guarded"
"""Where the export's ``grafana/`` directory is mounted in a Grafana container: a subdirectory of
its own, beside (not over) the user's ``/etc/grafana/provisioning``."""
DEFAULT_DASHBOARDS_PATH = f"{GRAFANA_MOUNT}/dashboards"
"""Where the dashboard provider reads the dashboard JSON unless told otherwise."""
DEFAULT_FOLDER = "guarded"
"""The Grafana folder the dashboards are provisioned into unless told otherwise."""

GRAFANA_DIR = "grafana"
COLLECTOR_CONFIG = "otel-collector.yaml"
DATASOURCES_FILE = f"{GRAFANA_DIR}/provisioning/datasources/guarded.yaml"
DASHBOARD_PROVIDER_FILE = f"{GRAFANA_DIR}/provisioning/dashboards/guarded.yaml"
RULE_FILE = f"{GRAFANA_DIR}/alerts/guarded-rules.yml"
"""Paths of an export, relative to its directory (POSIX separators)."""

_FOLDER_UID_LENGTH = 40
"""Grafana's limit on a folder uid."""


class AssetError(ValueError):
    """An option that cannot be used, or a file in the way: ``message`` says which, ``hint`` what to do."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(f"{message}; {hint}")
        self.message = message
        self.hint = hint


class ExistingFilesError(AssetError):
    """Files of the export exist in the target with other content (``paths``); nothing was written."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        first = self.paths[0]
        if len(self.paths) == 1:
            what = f"{first} already exists with other content"
        else:
            what = f"{len(self.paths)} files already exist with other content ({first} among them)"
        super().__init__(what, "overwrite them (overwrite=True, --force) or export into another directory")


def packaged_assets() -> dict[str, bytes]:
    """Every shipped file, by its path in an export (``grafana/...``, ``otel-collector.yaml``)."""
    root = files(__name__)
    found = {COLLECTOR_CONFIG: root.joinpath(COLLECTOR_CONFIG).read_bytes()}
    for relative, resource in _walk(root.joinpath(GRAFANA_DIR), GRAFANA_DIR):
        found[relative] = resource.read_bytes()
    return dict(sorted(found.items()))


def _walk(directory: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    for entry in directory.iterdir():
        if entry.name.startswith((".", "__")) or entry.name.endswith((".py", ".pyc")):
            continue
        relative = f"{prefix}/{entry.name}"
        if entry.is_dir():
            yield from _walk(entry, relative)
        else:
            yield relative, entry


def render_assets(
    *,
    runbook_base: str | None = None,
    prometheus_url: str | None = None,
    tempo_url: str | None = None,
    folder: str = DEFAULT_FOLDER,
    dashboards_path: str = DEFAULT_DASHBOARDS_PATH,
) -> dict[str, bytes]:
    """The files of an export with the options applied, by path (see :func:`export_assets`)."""
    assets = packaged_assets()
    text = {path: assets[path].decode("utf-8") for path in (DATASOURCES_FILE, DASHBOARD_PROVIDER_FILE)}
    if prometheus_url is not None:
        value = _url(prometheus_url, "Prometheus URL", "http://prometheus:9090")
        text[DATASOURCES_FILE] = _set(text[DATASOURCES_FILE], "url", f"${{{PROMETHEUS_URL_VARIABLE}}}", value)
    if tempo_url is not None:
        value = _url(tempo_url, "Tempo URL", "http://tempo:3200")
        text[DATASOURCES_FILE] = _set(text[DATASOURCES_FILE], "url", f"${{{TEMPO_URL_VARIABLE}}}", value)
    if folder != DEFAULT_FOLDER:
        name, uid = _folder(folder)
        provider = _set(text[DASHBOARD_PROVIDER_FILE], "folder", DEFAULT_FOLDER, name)
        text[DASHBOARD_PROVIDER_FILE] = _set(provider, "folderUid", DEFAULT_FOLDER, uid)
    if dashboards_path != DEFAULT_DASHBOARDS_PATH:
        value = _container_path(dashboards_path)
        text[DASHBOARD_PROVIDER_FILE] = _set(
            text[DASHBOARD_PROVIDER_FILE], "path", DEFAULT_DASHBOARDS_PATH, value
        )
    for path, changed in text.items():
        assets[path] = changed.encode("utf-8")
    if runbook_base is not None:
        assets[RULE_FILE] = _runbooks(assets[RULE_FILE].decode("utf-8"), runbook_base).encode("utf-8")
    return assets


def export_assets(
    target: str | os.PathLike[str],
    *,
    runbook_base: str | None = None,
    prometheus_url: str | None = None,
    tempo_url: str | None = None,
    folder: str = DEFAULT_FOLDER,
    dashboards_path: str = DEFAULT_DASHBOARDS_PATH,
    overwrite: bool = False,
) -> list[Path]:
    """Write the dashboards, provisioning, alert rules and collector config under ``target``.

    ``target`` is created when missing. Returns the path of every file of the export, sorted.

    Options (each ``None`` or default leaves the packaged bytes as they are):

    * ``runbook_base``: where docs/alerts.md is published; every alert's ``runbook_url`` becomes
      ``runbook_base#<alert name in lower case>`` (the heading anchors of docs/alerts.md).
    * ``prometheus_url`` / ``tempo_url``: written into the data sources instead of the
      ``${GUARDED_PROMETHEUS_URL}`` / ``${GUARDED_TEMPO_URL}`` references Grafana expands from its
      environment. Grafana still expands ``$NAME`` in the value given.
    * ``folder``: the Grafana folder of the dashboards (its uid is derived from the name).
    * ``dashboards_path``: where, inside Grafana, the provider reads ``grafana/dashboards/``.

    A file already in ``target`` with other content is an :class:`AssetError` unless
    ``overwrite``; nothing is written then. Identical files are left alone.
    """
    rendered = render_assets(
        runbook_base=runbook_base,
        prometheus_url=prometheus_url,
        tempo_url=tempo_url,
        folder=folder,
        dashboards_path=dashboards_path,
    )
    root = Path(target)
    if root.exists() and not root.is_dir():
        raise AssetError(f"{root} exists and is not a directory", "give a directory to export into")
    destinations = {root.joinpath(*PurePosixPath(path).parts): data for path, data in rendered.items()}
    if not overwrite:
        clashes = [path for path, data in destinations.items() if _differs(path, data)]
        if clashes:
            raise ExistingFilesError(clashes)
    for path, data in destinations.items():
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(destinations)


def _differs(path: Path, data: bytes) -> bool:
    if not path.exists():
        return False
    return not path.is_file() or path.read_bytes() != data


# --- option values ---------------------------------------------------------------------------

_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]")


def _url(value: str, what: str, example: str) -> str:
    hint = f"give the URL Grafana reaches it at, for example {example}"
    if not value or _UNSAFE.search(value):
        raise AssetError(f"{what} {value!r} is empty or contains whitespace", hint)
    if "$" not in value and not re.match(r"https?://[^/]", value):
        raise AssetError(f"{what} {value!r} is not an http:// or https:// URL", hint)
    return value


def _folder(name: str) -> tuple[str, str]:
    hint = f"give a folder title such as {DEFAULT_FOLDER!r} or 'Platform storage'"
    if not name.strip() or re.search(r"[\x00-\x1f\x7f]", name):
        raise AssetError(f"folder {name!r} is empty or contains control characters", hint)
    uid = re.sub(r"[^A-Za-z0-9_-]+", "-", name.strip()).strip("-").lower()[:_FOLDER_UID_LENGTH]
    if not uid:
        raise AssetError(f"folder {name!r} has no ASCII letter or digit to make its uid of", hint)
    return name, uid


def _container_path(value: str) -> str:
    hint = f"give the directory as Grafana sees it, for example {DEFAULT_DASHBOARDS_PATH}"
    if not value or _UNSAFE.search(value):
        raise AssetError(f"dashboards path {value!r} is empty or contains whitespace", hint)
    if "$" not in value and not value.startswith("/"):
        raise AssetError(f"dashboards path {value!r} is not absolute", hint)
    return value


# --- rewriting the packaged YAML --------------------------------------------------------------
# The packaged files are generated, with one value per line, so a value is replaced on its line
# and nothing else in the file changes. The base install has no YAML library; JSON strings are
# YAML double-quoted scalars, so json.dumps quotes every value written.


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _set(text: str, key: str, old: str, new: str) -> str:
    pattern = re.compile(rf"^(\s*(?:- )?{re.escape(key)}: ){re.escape(old)}$", re.MULTILINE)
    result, count = pattern.subn(lambda match: match.group(1) + _quoted(new), text)
    if count != 1:
        raise RuntimeError(f"the packaged file has {count} lines '{key}: {old}', expected one")
    return result


_RUNBOOK = re.compile(r"^(\s*runbook_url: )(.+)$", re.MULTILINE)


def _runbooks(text: str, base: str) -> str:
    if _UNSAFE.search(base) or "#" in base or not re.match(r"https?://[^/]", base):
        raise AssetError(
            f"runbook base {base!r} is not an absolute http(s) URL without whitespace or '#'",
            "give the URL of your copy of docs/alerts.md, for example "
            "https://github.com/ORG/REPO/blob/main/docs/alerts.md (each alert appends #its-name)",
        )

    def replace(match: re.Match[str]) -> str:
        current = _scalar(match.group(2))
        if "#" not in current:
            raise RuntimeError(f"the packaged rule file has a runbook_url without an anchor: {current!r}")
        anchor = current.rsplit("#", 1)[1]
        return match.group(1) + _quoted(f"{base}#{anchor}")

    result, count = _RUNBOOK.subn(replace, text)
    if count == 0:
        raise RuntimeError("the packaged rule file has no runbook_url")
    return result


def _scalar(raw: str) -> str:
    """The value of a one-line YAML scalar as the generator writes them (plain or quoted)."""
    raw = raw.strip()
    if raw.startswith('"'):
        value: str = json.loads(raw)
        return value
    if raw.startswith("'") and raw.endswith("'"):
        return raw[1:-1].replace("''", "'")
    return raw


__all__ = [
    "COLLECTOR_CONFIG",
    "DASHBOARD_PROVIDER_FILE",
    "DATASOURCES_FILE",
    "DEFAULT_DASHBOARDS_PATH",
    "DEFAULT_FOLDER",
    "GRAFANA_DIR",
    "GRAFANA_MOUNT",
    "PROMETHEUS_URL_VARIABLE",
    "RULE_FILE",
    "TEMPO_URL_VARIABLE",
    "AssetError",
    "ExistingFilesError",
    "export_assets",
    "packaged_assets",
    "render_assets",
]
