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


class ScheduleError(ValueError):
    """A fault schedule that cannot be parsed or does not fit the run."""


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One fault of a schedule: ``kind`` starts ``at`` seconds into the run and lasts ``duration``."""

    kind: FaultKind
    at: float
    duration: float

    @property
    def ends(self) -> float:
        return self.at + self.duration

    def describe(self) -> str:
        if self.duration:
            return f"{self.kind.value} at {self.at:.1f}s for {self.duration:.1f}s"
        return f"{self.kind.value} at {self.at:.1f}s"


_ITEM = re.compile(r"^(?P<kind>[a-z-]+)@(?P<at>[^:]+)(?::(?P<duration>.+))?$")
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


def parse_schedule(spec: str, run_seconds: float) -> list[PlannedFault]:
    """The faults of ``spec`` (a name from :data:`NAMED_SCHEDULES` or a spec string) for a run of
    ``run_seconds``, ordered by start; :class:`ScheduleError` says what is wrong. ``default``
    means ``quick`` in a short run (:func:`effective_schedule`)."""
    spec = effective_schedule(spec, run_seconds)
    text = NAMED_SCHEDULES.get(spec.strip(), spec)
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
        fault = PlannedFault(kind, at, duration)
        if fault.ends > run_seconds:
            raise ScheduleError(
                f"{fault.describe()} ends at {fault.ends:.1f}s, after the run ({run_seconds:.0f}s): "
                "start it earlier, shorten it or lengthen --duration"
            )
        faults.append(fault)
    return sorted(faults, key=lambda fault: fault.at)


__all__ = [
    "DEFAULT_DURATIONS",
    "DEFAULT_SCHEDULE_SECONDS",
    "NAMED_SCHEDULES",
    "FaultKind",
    "PlannedFault",
    "ScheduleError",
    "effective_schedule",
    "parse_schedule",
]
