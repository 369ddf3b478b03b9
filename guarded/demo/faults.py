"""Inject the schedule's faults into a real PostgreSQL and record what each one actually did.

* ``restart`` / ``crash``: ``pg_ctl stop`` (fast / immediate), wait, ``pg_ctl start``.
* ``kill``: ``pg_terminate_backend`` of every connection of the store's pool (found by its
  ``application_name``) from a separate admin connection, every 0.2 s for the duration.
* ``slow``: a side transaction takes ``ACCESS EXCLUSIVE`` locks on every table and holds them
  longer than the guard's deadline, so every statement waits (a slow, stuck database).
* ``pause-fail``: the same on ``planner_pauses`` only, so ``save_planner_state`` fails for the
  window (what the pause-save alert watches).
* ``bad``: :func:`~guarded.demo.bad_payloads.send_bad_payloads`.
* ``overload``: :func:`~guarded.demo.overload.run_overload` on the demo's store.
* ``cross-worker``: :func:`~guarded.demo.cross_worker.run_cross_worker`.

On Redis (``--backend redis``, and the ``redis-`` faults of ``--backend hybrid``) ``restart``,
``crash``, ``kill`` and ``slow`` act on the ``redis-server`` instead
(:mod:`guarded.demo.redis_faults`): a clean shutdown or a SIGKILL and a start, ``CLIENT KILL TYPE
normal``, SIGSTOP then SIGCONT; on a Redis Cluster ``crash`` kills a master and waits for its
replica's promotion. On a store made of parts (the hybrid) every server fault's effect also says
what each part did meanwhile: writes its server took, writes its guard held.

Each fault runs in its own task at its start time (faults may overlap) and leaves a
:class:`FaultRecord` saying when it ran and its observed effect; ``happened`` is ``False`` when
the fault had no effect (no connection to kill, a lock never acquired).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from guarded.testing.postgres import EmbeddedPostgres
from guarded.testing.redis import RedisServer

from .bad_payloads import send_bad_payloads
from .cross_worker import run_cross_worker
from .ledger import Ledger
from .overload import OVERLOAD_CALLERS, run_overload
from .redis_faults import fail_over_master, kill_redis_clients, restart_redis, stall_redis
from .schedule import SERVER_FAULTS, FaultKind, PlannedFault

FAULT_APPLICATION_NAME = "guarded-demo-faults"
"""``application_name`` of the admin connections (never killed by a ``kill`` fault)."""
TABLES = (
    "flow_events",
    "state_updates",
    "planner_events",
    "steering_events",
    "task_states",
    "memory_states",
    "planner_pauses",
    "trajectories",
    "remote_bindings",
    "artifacts",
)
CROSS_WORKER_KEYS = 20
"""Memory states and trajectories (each) both workers of a ``cross-worker`` phase write."""
KILL_INTERVAL = 0.2
LOCK_SAMPLE_INTERVAL = 0.1

PartCalls = Callable[[], Mapping[str, Mapping[tuple[str, str], int]]]
"""Calls by (method, outcome) of each part of a composed store, by the part's description."""


def write_outcomes(calls: Mapping[tuple[str, str], int]) -> tuple[int, int]:
    """``(stored, held)``: writes among ``calls`` that their server took, and that the guard held."""
    stored = held = 0
    for (method, outcome), count in calls.items():
        if not (method.startswith("save_") or method.startswith("artifact_store.put_")):
            continue
        if outcome in ("ok", "retried"):
            stored += count
        elif outcome == "dead_lettered":
            held += count
    return stored, held


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """What one fault did: planned and actual times (seconds into the run) and its effect."""

    kind: str
    planned_at: float
    started_at: float
    ended_at: float
    effect: str
    happened: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "planned_at": round(self.planned_at, 2),
            "started_at": round(self.started_at, 2),
            "ended_at": round(self.ended_at, 2),
            "effect": self.effect,
            "happened": self.happened,
        }


class FaultInjector:
    """Runs a schedule against ``server`` (the demo's embedded PostgreSQL) and ``store``."""

    def __init__(
        self,
        server: EmbeddedPostgres | None,
        *,
        schema: str,
        application_name: str,
        store: Any,
        ledger: Ledger,
        clock: Callable[[], float],
        outcomes: Callable[[], dict[tuple[str, str], int]],
        max_artifact_bytes: int,
        breaker_changes: Callable[[], int] = lambda: 0,
        overload_callers: int = OVERLOAD_CALLERS,
        redis: RedisServer | None = None,
        redis_cluster: Any = None,
        part_calls: PartCalls | None = None,
    ) -> None:
        """``server``: the PostgreSQL the PostgreSQL faults act on (``None`` on Redis alone);
        ``redis`` or ``redis_cluster`` (a :class:`guarded.testing.redis_cluster.RedisCluster`):
        the Redis the Redis faults act on; ``part_calls``: the calls of each part of a composed
        store, to say what each did during a server fault."""
        self.server = server
        self.redis = redis
        self.redis_cluster = redis_cluster
        self.part_calls = part_calls
        self.schema = schema
        self.application_name = application_name
        self.store = store
        self.ledger = ledger
        self.clock = clock
        self.outcomes = outcomes
        self.max_artifact_bytes = max_artifact_bytes
        self.breaker_changes = breaker_changes
        self.overload_callers = overload_callers
        self.records: list[FaultRecord] = []
        self.active: dict[int, str] = {}
        """Faults running now, by id, described for the live view."""
        self.events: list[tuple[float, str]] = []
        """(seconds into the run, what happened): every fault's start, phases and end."""
        self._server_control = asyncio.Lock()
        self._redis_control = asyncio.Lock()
        self._bursts = 0

    def current(self) -> list[str]:
        """Descriptions of the faults in progress."""
        return list(self.active.values())

    def _phase(self, number: int, text: str) -> None:
        self.active[number] = text
        self.events.append((self.clock(), text))

    async def run(self, schedule: list[PlannedFault]) -> None:
        """Run every fault of ``schedule`` at its time; returns when all have finished."""
        await asyncio.gather(*(self._at(number, fault) for number, fault in enumerate(schedule)))

    async def _at(self, number: int, fault: PlannedFault) -> None:
        await asyncio.sleep(max(0.0, fault.at - self.clock()))
        started = self.clock()
        self._phase(number, f"{fault.label} started")
        try:
            effect, happened = await self._inject(number, fault)
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            effect, happened = f"could not be injected: {type(exc).__name__}: {exc}", False
        finally:
            self.active.pop(number, None)
        ended = self.clock()
        self.events.append((ended, f"{fault.label} over: {effect}"))
        self.records.append(FaultRecord(fault.label, fault.at, started, ended, effect, happened))

    async def _inject(self, number: int, fault: PlannedFault) -> tuple[str, bool]:
        if fault.kind not in SERVER_FAULTS or self.part_calls is None:
            return await self._inject_one(number, fault)
        before = {part: write_outcomes(calls) for part, calls in self.part_calls().items()}
        effect, happened = await self._inject_one(number, fault)
        meanwhile: list[str] = []
        for part, calls in self.part_calls().items():
            stored, held = write_outcomes(calls)
            stored_before, held_before = before.get(part, (0, 0))
            meanwhile.append(f"{part} stored {stored - stored_before}, held {held - held_before}")
        return f"{effect}; writes meanwhile: {'; '.join(meanwhile)}", happened

    async def _inject_one(self, number: int, fault: PlannedFault) -> tuple[str, bool]:
        kind = fault.kind
        if kind in SERVER_FAULTS and (fault.target == "redis" or self.server is None):
            return await self._inject_redis(number, fault)
        if kind in (FaultKind.RESTART, FaultKind.CRASH):
            return await self._restart(
                number, fault.duration, "fast" if kind is FaultKind.RESTART else "immediate"
            )
        if kind is FaultKind.KILL:
            return await self._kill(fault.duration)
        if kind is FaultKind.SLOW:
            return await self._lock(number, TABLES, fault.duration, "slow")
        if kind is FaultKind.PAUSE_FAIL:
            return await self._pause_fail(number, fault.duration)
        if kind is FaultKind.OVERLOAD:
            return await run_overload(
                self.store,
                self.ledger,
                callers=self.overload_callers,
                duration=fault.duration,
                breaker_changes=self.breaker_changes,
            )
        if kind is FaultKind.CROSS_WORKER:
            assert self.server is not None  # the schedule allows cross-worker on PostgreSQL only
            return await run_cross_worker(
                dsn=self.server.dsn,
                schema=self.schema,
                ledger=self.ledger,
                count=CROSS_WORKER_KEYS,
                prefix=f"cross-worker-{number}",
                duration=fault.duration,
                phase=lambda text: self._phase(number, f"cross-worker: {text}"),
            )
        return await self._bad()

    # --- Redis ------------------------------------------------------------------------------------

    async def _inject_redis(self, number: int, fault: PlannedFault) -> tuple[str, bool]:
        kind, cluster, server = fault.kind, self.redis_cluster, self.redis

        def phase(text: str) -> None:
            self._phase(number, text)

        if kind is FaultKind.KILL:
            if cluster is not None:
                urls = [f"redis://{node.host}:{node.port}" for node in cluster.nodes if node.running]
            else:
                assert server is not None
                urls = [server.url]
            return await kill_redis_clients(urls, fault.duration)
        async with self._redis_control:
            if cluster is not None:
                if kind is not FaultKind.CRASH:
                    return (
                        f"{kind.value} is not injected on a Redis Cluster (crash fails a master over)",
                        False,
                    )
                return await fail_over_master(cluster, fault.duration, phase=phase)
            assert server is not None
            if kind is FaultKind.SLOW:
                return await stall_redis(server, fault.duration, phase=phase)
            return await restart_redis(server, fault.duration, crash=kind is FaultKind.CRASH, phase=phase)

    # --- restart ----------------------------------------------------------------------------------

    async def _restart(self, number: int, downtime: float, mode: str) -> tuple[str, bool]:
        assert self.server is not None
        async with self._server_control:
            self._phase(number, "stopping the database")
            await asyncio.to_thread(self.server.stop, mode)
            down = self.clock()
            self._phase(number, "database down")
            await asyncio.sleep(downtime)
            self._phase(number, "database starting")
            await asyncio.to_thread(self.server.start)
            up = self.clock()
        shutdown = "fast shutdown" if mode == "fast" else "immediate shutdown (crash)"
        return f"database down {up - down:.1f}s ({shutdown})", True

    # --- connection kills ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _admin(self) -> AsyncIterator[asyncpg.Connection]:
        assert self.server is not None
        conn = await asyncpg.connect(
            self.server.dsn, timeout=5, server_settings={"application_name": FAULT_APPLICATION_NAME}
        )
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)

    async def _kill(self, duration: float) -> tuple[str, bool]:
        killed = 0
        end = self.clock() + duration
        async with self._admin() as conn:
            while True:
                rows = await conn.fetch(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = $1 AND pid <> pg_backend_pid()",
                    self.application_name,
                )
                killed += sum(1 for row in rows if row[0])
                if self.clock() >= end:
                    break
                await asyncio.sleep(KILL_INTERVAL)
        return f"{killed} store connections terminated", killed > 0

    # --- locks --------------------------------------------------------------------------------------

    async def _lock(
        self, number: int, tables: tuple[str, ...], duration: float, label: str
    ) -> tuple[str, bool]:
        names = ", ".join(f'"{self.schema}".{table}' for table in tables)
        waited = 0
        async with self._admin() as conn:
            transaction = conn.transaction()
            await transaction.start()
            try:
                await conn.execute("SET LOCAL lock_timeout = '5s'")
                await conn.execute(f"LOCK TABLE {names} IN ACCESS EXCLUSIVE MODE")
                self._phase(number, f"{label}: {len(tables)} table(s) locked")
                held_from = self.clock()
                while self.clock() - held_from < duration:
                    waiting: int = await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                        self.application_name,
                    )
                    waited = max(waited, waiting)
                    await asyncio.sleep(LOCK_SAMPLE_INTERVAL)
                held = self.clock() - held_from
            finally:
                with contextlib.suppress(Exception):
                    await transaction.rollback()
        what = "every table" if len(tables) > 1 else tables[0]
        return f"{what} locked {held:.1f}s; up to {waited} statements stuck behind the lock", True

    async def _pause_fail(self, number: int, duration: float) -> tuple[str, bool]:
        before = self._pause_save_failures()
        effect, happened = await self._lock(number, ("planner_pauses",), duration, "pause-fail")
        failed = self._pause_save_failures() - before
        return f"{effect}; {failed} pause saves missed their deadline (dead-lettered)", happened

    def _pause_save_failures(self) -> int:
        return sum(
            count
            for (method, outcome), count in self.outcomes().items()
            if method == "save_planner_state" and outcome not in ("ok", "retried")
        )

    # --- bad payloads -------------------------------------------------------------------------------

    async def _bad(self) -> tuple[str, bool]:
        self._bursts += 1
        sent = await send_bad_payloads(
            self.store, self.ledger, self._bursts, max_artifact_bytes=self.max_artifact_bytes
        )
        return f"{sent} refused payloads sent (NaN, lone surrogates, oversized) plus NUL text", sent > 0


__all__ = ["FAULT_APPLICATION_NAME", "TABLES", "FaultInjector", "FaultRecord", "PartCalls", "write_outcomes"]
