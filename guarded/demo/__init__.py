"""``guarded demo``: a PenguiFlow-shaped workload on ``guard(PostgresStateStore)`` under faults.

The demo starts an embedded PostgreSQL, runs concurrent agent sessions (and a real PenguiFlow
flow) through a guarded store while it restarts the database, kills connections, locks tables
and sends bad payloads, serves ``/metrics``, shows a live view, and ends with a verdict computed
by reading the database back: every acknowledged write must be there. See docs/demo.md.

Modules: :mod:`.schedule` (fault schedules), :mod:`.workload` and :mod:`.penguiflow_flow` (the
load), :mod:`.faults` and :mod:`.bad_payloads` (the faults), :mod:`.ledger` and
:mod:`.readback` (what was acknowledged, what is stored), :mod:`.verdict` and :mod:`.report`
(the judgement), :mod:`.status` and :mod:`.live` (the live view), :mod:`.metrics_server`,
:mod:`.runner` (the whole run) and :mod:`.cli` (the command).
"""

from .runner import DemoOptions, DemoResult, run_demo
from .schedule import NAMED_SCHEDULES, FaultKind, PlannedFault, ScheduleError, parse_schedule
from .verdict import Verdict, compute_verdict

__all__ = [
    "NAMED_SCHEDULES",
    "DemoOptions",
    "DemoResult",
    "FaultKind",
    "PlannedFault",
    "ScheduleError",
    "Verdict",
    "compute_verdict",
    "parse_schedule",
    "run_demo",
]
