"""``guarded assets export DIR``: write the dashboards, provisioning, alert rules and collector config.

The files ship inside the package (:mod:`guarded.assets`), so a ``pip install guarded`` has them;
the options rewrite the values a deployment changes (docs/dashboards.md, docs/alerts.md). Exit
codes (docs/cli.md): 0 written, 2 a user error, one ``error: ...; hint: ...`` line (a bad option,
files in the way, a directory that cannot be written).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..assets import (
    DEFAULT_DASHBOARDS_PATH,
    DEFAULT_FOLDER,
    PROMETHEUS_URL_VARIABLE,
    TEMPO_URL_VARIABLE,
    AssetError,
    export_assets,
)
from .support import DOCUMENTATION_URL, UsageError

if TYPE_CHECKING:
    from . import Subparsers


def register(subparsers: Subparsers) -> None:
    """Add the ``assets`` subcommand and its ``export`` subcommand."""
    parser = subparsers.add_parser(
        "assets",
        help="write the dashboards, provisioning, alert rules and collector config that ship with guarded",
        description=(
            "The operator's files that ship with guarded: Grafana dashboards and provisioning, "
            "Prometheus alert rules and an OpenTelemetry Collector configuration."
        ),
    )
    commands = parser.add_subparsers(dest="assets_command", metavar="COMMAND", required=True)
    export = commands.add_parser(
        "export",
        help="write the files into a directory",
        description=(
            "Write grafana/dashboards/*.json, grafana/provisioning/{datasources,dashboards}/guarded.yaml, "
            "grafana/alerts/guarded-rules.yml and otel-collector.yaml under DIR (created when missing). "
            "Without options the data sources read their URLs from Grafana's environment "
            f"(${{{PROMETHEUS_URL_VARIABLE}}}, ${{{TEMPO_URL_VARIABLE}}})."
        ),
        epilog=(
            "Mount DIR/grafana at /etc/grafana/guarded and the two provisioning files into "
            "/etc/grafana/provisioning/{datasources,dashboards}/guarded.yaml, beside your own: "
            f"see {DOCUMENTATION_URL}dashboards/."
        ),
    )
    export.add_argument("directory", type=Path, metavar="DIR", help="where to write the files")
    export.add_argument(
        "--runbook-base",
        metavar="URL",
        help="where docs/alerts.md is published; each alert's runbook_url becomes URL#<alert> "
        "(default: as shipped)",
    )
    export.add_argument(
        "--prometheus-url",
        metavar="URL",
        help=f"the Prometheus data source's URL (default: ${{{PROMETHEUS_URL_VARIABLE}}}, read by Grafana)",
    )
    export.add_argument(
        "--tempo-url",
        metavar="URL",
        help=f"the Tempo data source's URL (default: ${{{TEMPO_URL_VARIABLE}}}, read by Grafana)",
    )
    export.add_argument(
        "--folder",
        default=DEFAULT_FOLDER,
        metavar="NAME",
        help=f"the Grafana folder of the dashboards (default: {DEFAULT_FOLDER})",
    )
    export.add_argument(
        "--dashboards-path",
        default=DEFAULT_DASHBOARDS_PATH,
        metavar="PATH",
        help=f"where Grafana reads DIR/grafana/dashboards (default: {DEFAULT_DASHBOARDS_PATH})",
    )
    export.add_argument("--force", action="store_true", help="overwrite files that differ")
    export.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Export the assets into ``args.directory``; print the path of each file of the export."""
    try:
        paths = export_assets(
            args.directory,
            runbook_base=args.runbook_base,
            prometheus_url=args.prometheus_url,
            tempo_url=args.tempo_url,
            folder=args.folder,
            dashboards_path=args.dashboards_path,
            overwrite=args.force,
        )
    except AssetError as exc:
        raise UsageError(exc.message, exc.hint) from exc
    except OSError as exc:
        target = exc.filename or args.directory
        reason = exc.strerror or str(exc)
        raise UsageError(
            f"cannot write {target}: {reason}", "export into a directory you can write to"
        ) from exc
    for path in paths:
        print(path)
    return 0


__all__ = ["register", "run_export"]
