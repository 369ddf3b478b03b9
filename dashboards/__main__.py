"""``python -m dashboards [--check] [--grafana-dir DIR]``: write or verify the files in grafana/.

Without ``--check`` it writes the dashboard JSON, the Grafana provisioning files and (when
:mod:`dashboards.alerts` exists) the alert rule file. With ``--check`` it writes nothing and
exits 1 listing every file that differs from what would be written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .output import GRAFANA_DIR, differences, write


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file differs")
    parser.add_argument(
        "--grafana-dir", type=Path, default=GRAFANA_DIR, help=f"output directory (default: {GRAFANA_DIR})"
    )
    args = parser.parse_args(argv)
    if args.check:
        found = differences(args.grafana_dir)
        if found:
            print(f"{len(found)} file(s) under {args.grafana_dir} differ from what dashboards/ generates:")
            for line in found:
                print(f"  {line}")
            print("Run `python -m dashboards` and commit the result.")
            return 1
        print(f"{args.grafana_dir}: up to date")
        return 0
    changed = write(args.grafana_dir)
    for relative in changed:
        print(f"wrote {args.grafana_dir / relative}")
    if not changed:
        print(f"{args.grafana_dir}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
