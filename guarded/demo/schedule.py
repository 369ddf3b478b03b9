"""Fault schedules of ``guarded demo``: named ones and a small spec language.

A spec is a comma-separated list of ``KIND@START[:DURATION]``. ``START`` and ``DURATION`` are
seconds (``5``, ``2.5s``) or a percentage of the run (``40%``)::

    restart@40%:3s,kill@2:1,slow@25%:2.5,pause-fail@6:3,bad@50%

Kinds (see :mod:`guarded.demo.faults` for what each does):

``restart``      stop the database (fast shutdown), keep it down for DURATION, start it again
``crash``        the same with an immediate shutdown (the server crashes)
``kill``         terminate the store's connections (``pg_terminate_backend``) for DURATION
``slow``         lock every table for DURATION, longer than the guard's deadline
``pause-fail``   lock only the planner pause table for DURATION: pause saves fail
``bad``          send bad payloads (NaN, lone surrogates, an oversized artifact) and NUL text
``overload``     1,000 more callers than usual, on the demo's 10-connection pool, for DURATION
``cross-worker`` partition a second worker for DURATION while a third process writes newer values
                 of the keys it holds; its replay must not bring the older values back

Faults may overlap; each must end before the run does.

The kinds above are those of ``--backend postgres``. On ``--backend redis`` the server faults
act on the ``redis-server`` (see :mod:`guarded.demo.redis_faults`): ``restart`` a clean shutdown
and start, ``crash`` a SIGKILL and start, ``kill`` ``CLIENT KILL TYPE normal``, ``slow`` the
server stalled (SIGSTOP, SIGCONT after DURATION); ``pause-fail`` and ``cross-worker`` are
PostgreSQL's only. On ``--backend hybrid`` a server fault names its server with a prefix,
``redis-crash@40%`` or ``postgres-kill@2:1`` (:data:`TARGETS`); ``bad`` and ``overload`` act on
the whole store. :data:`BACKEND_SCHEDULES` holds each backend's named schedules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class FaultKind(str, Enum):
    """What a fault does to the database or the workload."""

    RESTART = "restart"
    CRASH = "crash"
    KILL = "kill"
    SLOW = "slow"
    PAUSE_FAIL = "pause-fail"
    BAD = "bad"
    OVERLOAD = "overload"
    CROSS_WORKER = "cross-worker"


DEFAULT_DURATIONS: Mapping[FaultKind, float] = {
    FaultKind.RESTART: 3.0,
    FaultKind.CRASH: 3.0,
    FaultKind.KILL: 1.0,
    FaultKind.SLOW: 2.5,
    FaultKind.PAUSE_FAIL: 3.0,
    FaultKind.BAD: 0.0,
    FaultKind.OVERLOAD: 3.0,
    FaultKind.CROSS_WORKER: 2.0,
}
"""Seconds a fault lasts when its spec gives no duration."""

NAMED_SCHEDULES: Mapping[str, str] = {
    "none": "",
    "default": (
        "kill@8%,slow@15%,pause-fail@30%,bad@42%,restart@50%,cross-worker@65%,kill@75%,overload@80%,bad@85%"
    ),
    "quick": (
        "bad@5%,kill@12%:8%,restart@25%:15%,slow@48%:12%,pause-fail@62%:12%,overload@76%:10%,cross-worker@88%:10%"
    ),
    "restart-only": "restart@40%",
    "kills-only": "kill@20%:2,kill@50%:2,kill@80%:1",
    "slow-only": "slow@30%,pause-fail@60%",
    "load-only": "overload@20%:5,cross-worker@60%",
}
"""Schedules selectable by name with ``--faults NAME``."""

DEFAULT_SCHEDULE_SECONDS = 30.0
"""The run ``default`` is written for (its faults last seconds, not a share of the run). A shorter
run given ``default`` gets ``quick``: the same kinds, one at a time, each lasting a share of the
run, so ``guarded demo --duration 10`` fits and every fault has room to show its effect."""


BACKENDS = ("postgres", "redis", "hybrid")
"""The stores ``guarded demo --backend`` runs on."""

TARGETS = ("postgres", "redis")
"""The servers a fault can name (``redis-crash``): the hybrid runs both."""

SERVER_FAULTS = frozenset({FaultKind.RESTART, FaultKind.CRASH, FaultKind.KILL, FaultKind.SLOW})
"""Kinds that act on a server: on the hybrid they name which one."""

BACKEND_FAULTS: Mapping[str, frozenset[FaultKind]] = {
    "postgres": frozenset(FaultKind),
    "redis": SERVER_FAULTS | {FaultKind.BAD, FaultKind.OVERLOAD},
    "hybrid": SERVER_FAULTS | {FaultKind.BAD, FaultKind.OVERLOAD},
}
"""The kinds each backend can inject (``pause-fail`` locks PostgreSQL's pause table and
``cross-worker`` runs a second PostgreSQL worker: neither exists elsewhere)."""

REDIS_SCHEDULES: Mapping[str, str] = {
    "none": "",
    "default": "kill@8%,slow@15%,bad@30%,crash@40%,restart@55%,bad@65%,kill@70%,overload@80%",
    "quick": "bad@5%,kill@12%:8%,crash@25%:15%,slow@45%:10%,restart@60%:10%,overload@76%:10%",
    "restart-only": "crash@40%",
    "kills-only": "kill@20%:2,kill@50%:2,kill@80%:1",
    "slow-only": "slow@30%,slow@60%",
    "load-only": "overload@20%:5",
}
"""``--backend redis``: the kinds mean the Redis faults (the server SIGKILLed, stalled ...)."""

HYBRID_SCHEDULES: Mapping[str, str] = {
    "none": "",
    "default": (
        "postgres-kill@8%,redis-slow@15%,bad@30%,redis-crash@40%,postgres-slow@55%,"
        "postgres-restart@65%,overload@80%,redis-kill@90%"
    ),
    "quick": (
        "bad@5%,redis-crash@10%:12%,postgres-restart@26%:12%,redis-slow@42%:10%,postgres-kill@56%:8%,"
        "postgres-slow@68%:8%,redis-kill@80%:8%,overload@90%:8%"
    ),
    "restart-only": "redis-crash@30%,postgres-restart@60%",
    "kills-only": "redis-kill@20%:2,postgres-kill@50%:2,redis-kill@80%:1",
    "slow-only": "redis-slow@30%,postgres-slow@60%",
    "load-only": "overload@20%:5",
}
"""``--backend hybrid``: each server fault names its server; one part down, the other goes on."""

BACKEND_SCHEDULES: Mapping[str, Mapping[str, str]] = {
    "postgres": NAMED_SCHEDULES,
    "redis": REDIS_SCHEDULES,
    "hybrid": HYBRID_SCHEDULES,
}
"""The named schedules of each backend (the same names on every backend)."""


class ScheduleError(ValueError):
    """A fault schedule that cannot be parsed or does not fit the run."""


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One fault of a schedule: ``kind`` starts ``at`` seconds into the run and lasts ``duration``."""

    kind: FaultKind
    at: float
    duration: float
    target: str | None = None
    """The server a server fault acts on (:data:`TARGETS`); ``None``: the backend's one server."""

    @property
    def ends(self) -> float:
        return self.at + self.duration

    @property
    def label(self) -> str:
        """The fault as a spec names it: ``crash``, or ``redis-crash`` with a target."""
        return self.kind.value if self.target is None else f"{self.target}-{self.kind.value}"

    def describe(self) -> str:
        if self.duration:
            return f"{self.label} at {self.at:.1f}s for {self.duration:.1f}s"
        return f"{self.label} at {self.at:.1f}s"


_ITEM = re.compile(r"^(?:(?P<target>postgres|redis)-)?(?P<kind>[a-z-]+)@(?P<at>[^:]+)(?::(?P<duration>.+))?$")
_AMOUNT = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>s|%)?$")


def _amount(text: str, run_seconds: float, what: str) -> float:
    match = _AMOUNT.match(text.strip())
    if match is None:
        raise ScheduleError(f"{what} {text!r} is not seconds (5, 2.5s) or a percentage of the run (40%)")
    number = float(match["number"])
    return number * run_seconds / 100 if match["unit"] == "%" else number


def effective_schedule(spec: str, run_seconds: float) -> str:
    """The schedule a run of ``run_seconds`` uses for ``spec``: ``quick`` for ``default`` in a run
    shorter than :data:`DEFAULT_SCHEDULE_SECONDS`, otherwise ``spec`` itself."""
    if spec.strip() == "default" and run_seconds < DEFAULT_SCHEDULE_SECONDS:
        return "quick"
    return spec


def parse_schedule(spec: str, run_seconds: float, backend: str = "postgres") -> list[PlannedFault]:
    """The faults of ``spec`` (a name from the backend's :data:`BACKEND_SCHEDULES` or a spec
    string) for a run of ``run_seconds`` on ``backend``, ordered by start; :class:`ScheduleError`
    says what is wrong. ``default`` means ``quick`` in a short run (:func:`effective_schedule`)."""
    if backend not in BACKEND_SCHEDULES:
        raise ScheduleError(f"unknown backend {backend!r} (backends: {', '.join(BACKENDS)})")
    spec = effective_schedule(spec, run_seconds)
    text = BACKEND_SCHEDULES[backend].get(spec.strip(), spec)
    faults: list[PlannedFault] = []
    for raw in (part.strip() for part in text.split(",")):
        if not raw:
            continue
        match = _ITEM.match(raw)
        if match is None:
            raise ScheduleError(f"fault {raw!r} is not KIND@START[:DURATION]")
        try:
            kind = FaultKind(match["kind"])
        except ValueError:
            kinds = ", ".join(kind.value for kind in FaultKind)
            raise ScheduleError(f"unknown fault kind {match['kind']!r} (kinds: {kinds})") from None
        at = _amount(match["at"], run_seconds, "start")
        duration = (
            DEFAULT_DURATIONS[kind]
            if match["duration"] is None
            else _amount(match["duration"], run_seconds, "duration")
        )
        if kind is FaultKind.BAD:
            duration = 0.0
        fault = PlannedFault(kind, at, duration, _target(kind, match["target"], backend))
        if fault.ends > run_seconds:
            raise ScheduleError(
                f"{fault.describe()} ends at {fault.ends:.1f}s, after the run ({run_seconds:.0f}s): "
                "start it earlier, shorten it or lengthen --duration"
            )
        faults.append(fault)
    return sorted(faults, key=lambda fault: fault.at)


def _target(kind: FaultKind, target: str | None, backend: str) -> str | None:
    """The server ``kind`` acts on, checked against what ``backend`` runs."""
    allowed = BACKEND_FAULTS[backend]
    if kind not in allowed:
        kinds = ", ".join(sorted(item.value for item in allowed))
        raise ScheduleError(f"{kind.value} is not a fault of the {backend} backend (its kinds: {kinds})")
    if target is not None and kind not in SERVER_FAULTS:
        raise ScheduleError(f"{target}-{kind.value}: {kind.value} acts on the store, not on a server")
    if backend == "hybrid" and kind in SERVER_FAULTS:
        if target is None:
            raise ScheduleError(
                f"{kind.value}: the hybrid runs two servers; name one: "
                + " or ".join(f"{name}-{kind.value}" for name in TARGETS)
            )
        return target
    if target is not None and target != backend:
        raise ScheduleError(f"{target}-{kind.value}: the {backend} backend runs no {target} server")
    return None


__all__ = [
    "BACKENDS",
    "BACKEND_FAULTS",
    "BACKEND_SCHEDULES",
    "DEFAULT_DURATIONS",
    "DEFAULT_SCHEDULE_SECONDS",
    "NAMED_SCHEDULES",
    "HYBRID_SCHEDULES",
    "REDIS_SCHEDULES",
    "SERVER_FAULTS",
    "TARGETS",
    "FaultKind",
    "PlannedFault",
    "ScheduleError",
    "effective_schedule",
    "parse_schedule",
]
