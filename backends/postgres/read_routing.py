"""Read replicas: which server answers a read, and how far behind each replica is.

A store given ``replica_dsn`` keeps one pool per replica beside its primary pool and a
:class:`ReadRouter`. History and list reads (see ``docs/postgres.md``, "Read replicas", for the
table of methods) go to a replica when it holds everything the read must see; everything else --
writes, pause loads and consumes, memory states, binding look-ups, migrations, maintenance -- goes
to the primary.

**How far behind, by WAL position.** Every ``replica_check_interval`` the router notes the local
monotonic time ``t`` and then reads the primary's ``pg_current_wal_insert_lsn()``: every commit
acknowledged before ``t`` lies at or before that position. It then reads each replica's
``pg_last_wal_replay_lsn()``. A replica that has replayed up to a sampled position holds everything
the primary had committed at that sample's time: the newest such time is the replica's *caught-up
time*, and its lag is ``now - caught-up time``. Nothing depends on the hosts' clocks agreeing, and
an idle primary costs no lag (``now() - pg_last_xact_replay_timestamp()``, the other usual
measure, grows while nothing is written and compares two hosts' clocks). The lag so measured is
at most the real one plus one check interval.

**Read-your-writes.** The router remembers, per trace and per session, the monotonic time at which
this store's last write of it returned (committed or not: a write that failed may have committed).
A read of a scope goes to a replica only when the replica's caught-up time is after that write,
so it has replayed it; otherwise the primary answers. Writes of other processes are seen on a
replica within its lag, which is never more than ``replica_max_lag`` for a replica in use. A read
the guard marks as one that must be current (:func:`guarded.backend.read_must_be_current`: writes
for it are held in the dead-letter buffer) goes to the primary.

**A replica that is down or too far behind is skipped**: one whose check failed or timed out, whose
lag exceeds ``replica_max_lag``, or that is not in recovery at all; reads go to the primary and the
next check tries it again. A read on a replica that fails or outlasts ``replica_read_timeout`` is
answered by the primary in the same call, and the replica is left out until its next good check.
The metrics show all of it (:mod:`.replica_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from guarded.backend import read_must_be_current

from .connection import Database
from .replica_metrics import FAILED, LAGGING, NOT_REPLICA, PRIMARY, UNREACHABLE, ReplicaMetrics
from .tables import Tables

logger = logging.getLogger("guarded.backends.postgres")

T = TypeVar("T")

ReadScope = tuple[str, str]
"""What a read shows and a write changes: ``(TRACE, trace_id)``, ``(SESSION, session_id)`` or
``(ROUTER_SESSION, router_session_id)``, ids as stored."""
TRACE = "trace"
SESSION = "session"
ROUTER_SESSION = "router_session"
EVERY_ROUTER_SESSION: ReadScope = (ROUTER_SESSION + "*", "")
"""What a terminal mark of a binding changes (its router session is not known without a read)."""

PRIMARY_POSITION = "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint"
REPLAYED_POSITION = "SELECT (pg_last_wal_replay_lsn() - '0/0')::bigint"


@dataclass(eq=False, slots=True)
class Replica:
    """One replica: its pool, the tables read through it, and what its checks found."""

    label: str
    """``replica0``, ``replica1``, ... in the order configured (the metrics' label)."""
    db: Database
    tables: Tables
    caught_up: float = -math.inf
    """Monotonic time: everything the primary had committed then, the replica has replayed."""
    usable: bool = False
    """The last check reached it as a standby (a failed read clears it until the next check)."""
    reason: str | None = None
    """Why it is left out (``None`` while in use)."""


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """What the last check found of a replica (:meth:`PostgresStateStore.check_replicas`)."""

    label: str
    lag: float | None
    """Seconds behind the primary; ``None`` before it was first reached."""
    in_use: bool
    """Reads go to it (reachable, a standby, within ``replica_max_lag``)."""
    reason: str | None
    """Why it is left out: ``unreachable``, ``lagging``, ``not_replica`` or ``failed``."""


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """How reads are spread over replicas (the ``replica_*`` options of the store)."""

    max_lag: float
    check_interval: float
    read_timeout: float


@dataclass(eq=False)
class ReadRouter:
    """Sends each read to a replica that holds what it must see, or to the primary (see the module
    docs); checks the replicas in the background while reads come."""

    primary_db: Database
    primary: Tables
    replicas: Sequence[Replica]
    settings: RoutingSettings
    metrics: ReplicaMetrics | None = None
    _writes: dict[ReadScope, float] = field(default_factory=dict)
    _positions: deque[tuple[float, int]] = field(default_factory=deque)
    _next: int = 0
    _monitor: asyncio.Task[None] | None = None
    _closed: bool = False

    def wrote(self, scopes: Iterable[ReadScope]) -> None:
        """A write of these scopes returned (or failed): reads of them wait for the replicas to
        replay it."""
        now = time.monotonic()
        writes = self._writes
        for scope in scopes:
            writes[scope] = now

    async def read(self, scopes: Iterable[ReadScope], operation: Callable[[Tables], Awaitable[T]]) -> T:
        """``operation`` on the tables of the server that should answer a read of ``scopes``: a
        replica that has replayed this store's last write of them, else the primary; a replica
        that fails or is slow is replaced by the primary within the call."""
        self._ensure_monitor()
        replica = None if read_must_be_current() else self._replica_for(scopes)
        if replica is not None:
            try:
                async with asyncio.timeout(self.settings.read_timeout):
                    result = await operation(replica.tables)
            except Exception as exc:  # the primary answers whatever went wrong on the replica
                self._leave_out(replica, FAILED, exc)
            else:
                self._count(replica.label)
                return result
        self._count(PRIMARY)
        return await operation(self.primary)

    def _replica_for(self, scopes: Iterable[ReadScope]) -> Replica | None:
        writes = self._writes
        newest = max((writes.get(scope, -math.inf) for scope in scopes), default=-math.inf)
        oldest_usable = time.monotonic() - self.settings.max_lag
        count = len(self.replicas)
        for offset in range(count):
            index = (self._next + offset) % count
            replica = self.replicas[index]
            if replica.usable and replica.caught_up > newest and replica.caught_up >= oldest_usable:
                self._next = index + 1
                return replica
        return None

    def _count(self, target: str) -> None:
        if self.metrics is not None:
            self.metrics.reads_by_target[target].inc()

    def _leave_out(self, replica: Replica, reason: str, exc: BaseException | None = None) -> None:
        if replica.usable or replica.reason != reason:
            logger.warning(
                "guarded_pg_replica_skipped",
                extra={
                    "event": "guarded_pg_replica_skipped",
                    "replica": replica.label,
                    "reason": reason,
                    "error": type(exc).__name__ if exc is not None else None,
                },
            )
        replica.usable = False
        replica.reason = reason
        if self.metrics is not None:
            self.metrics.skipped(replica.label, reason)

    # -- checks ------------------------------------------------------------------------------------

    def _ensure_monitor(self) -> None:
        """The checks run on the loop of the reads: started on the first, again on a new loop."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        monitor = self._monitor
        if monitor is not None and not monitor.done() and monitor.get_loop() is loop:
            return
        self._monitor = loop.create_task(self._check_forever(), name="guarded-pg-replica-checks")

    async def _check_forever(self) -> None:
        while not self._closed:
            try:
                await self.check()
            except Exception:  # pragma: no cover - check() handles what a server can do
                logger.exception("guarded_pg_replica_check_failed")
            await asyncio.sleep(self.settings.check_interval)

    async def check(self) -> list[ReplicaStatus]:
        """Check every replica now (the background checks do this every ``check_interval``)."""
        sampled = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.read_timeout):
                position = await self.primary_db.fetchval(PRIMARY_POSITION)
        except Exception as exc:
            # No new sample: the replicas' caught-up times stop moving and age out of use.
            logger.debug("guarded_pg_primary_position_unavailable", extra={"error": type(exc).__name__})
        else:
            self._positions.append((sampled, int(position)))
        await asyncio.gather(*(self._check(replica) for replica in self.replicas))
        self._forget_old(time.monotonic())
        return self.status()

    async def _check(self, replica: Replica) -> None:
        try:
            async with asyncio.timeout(self.settings.read_timeout):
                replayed = await replica.db.fetchval(REPLAYED_POSITION)
        except Exception as exc:
            self._set_lag(replica)  # still growing while it cannot be asked
            self._leave_out(replica, UNREACHABLE, exc)
            return
        if replayed is None:
            self._leave_out(replica, NOT_REPLICA)
            return
        for sampled, position in reversed(self._positions):
            if position <= replayed:
                replica.caught_up = max(replica.caught_up, sampled)
                break
        lag = self._set_lag(replica)
        if lag > self.settings.max_lag:
            self._leave_out(replica, LAGGING)
            return
        if not replica.usable:
            logger.info(
                "guarded_pg_replica_in_use",
                extra={"event": "guarded_pg_replica_in_use", "replica": replica.label},
            )
        replica.usable, replica.reason = True, None

    def _set_lag(self, replica: Replica) -> float:
        lag = time.monotonic() - replica.caught_up
        if self.metrics is not None and math.isfinite(lag):
            self.metrics.set_lag(replica.label, lag)
        return lag

    def _forget_old(self, now: float) -> None:
        """Drop what no routing decision can need: writes and positions older than any replica in
        use can be, keeping the newest position each replica has reached."""
        horizon = now - self.settings.max_lag - self.settings.check_interval
        reached = min((replica.caught_up for replica in self.replicas), default=now)
        positions = self._positions
        while len(positions) > 1 and (positions[0][0] < horizon or positions[1][0] <= reached):
            positions.popleft()
        stale = [scope for scope, written in self._writes.items() if written < horizon]
        for scope in stale:
            del self._writes[scope]

    def status(self) -> list[ReplicaStatus]:
        """What the last checks found of each replica."""
        now = time.monotonic()
        return [
            ReplicaStatus(
                label=replica.label,
                lag=now - replica.caught_up if math.isfinite(replica.caught_up) else None,
                in_use=replica.usable and now - replica.caught_up <= self.settings.max_lag,
                reason=replica.reason,
            )
            for replica in self.replicas
        ]

    async def close(self) -> None:
        """Stop the checks and close the replicas' pools (a replica that does not answer is cut off)."""
        self._closed = True
        monitor, self._monitor = self._monitor, None
        if monitor is not None and not monitor.done():
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await monitor
        for replica in self.replicas:
            if replica.db.is_open:
                pool = replica.db.pool
                try:
                    await asyncio.wait_for(pool.close(), timeout=self.settings.read_timeout + 1)
                except (TimeoutError, Exception):
                    pool.terminate()
        if self.metrics is not None:
            self.metrics.close()


__all__ = [
    "EVERY_ROUTER_SESSION",
    "PRIMARY_POSITION",
    "REPLAYED_POSITION",
    "ROUTER_SESSION",
    "SESSION",
    "TRACE",
    "ReadRouter",
    "ReadScope",
    "Replica",
    "ReplicaStatus",
    "RoutingSettings",
]
