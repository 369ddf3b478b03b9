"""The verdict as a concise human report."""

from __future__ import annotations

from collections import Counter

from .ledger import WriteKind
from .verdict import Verdict

LABELS = {
    WriteKind.EVENT: "runtime events",
    WriteKind.UPDATE: "task updates",
    WriteKind.STEERING: "steering events",
    WriteKind.PLANNER_EVENT: "planner events",
    WriteKind.TASK: "task states",
    WriteKind.MEMORY: "memory states",
    WriteKind.PAUSE: "planner pauses",
    WriteKind.TRAJECTORY: "trajectories",
    WriteKind.ARTIFACT: "artifacts",
}


REASON_WIDTH = 90


def _short(reason: str) -> str:
    """The reason without its "(call not kept: ...)" detail, cut to :data:`REASON_WIDTH`."""
    reason = reason.split(" (call not kept:", 1)[0]
    return reason if len(reason) <= REASON_WIDTH else reason[: REASON_WIDTH - 3] + "..."


def render_verdict(verdict: Verdict) -> str:
    """A few dozen lines: the headline, writes by kind, pauses, bad payloads, dead letters, faults."""
    lines: list[str] = []
    if verdict.passed:
        headline = (
            f"PASS: {verdict.acknowledged} writes acknowledged, all {verdict.persisted} in "
            f"{verdict.info.get('stored_in', 'PostgreSQL')}, 0 lost"
        )
    else:
        problems = [f"{verdict.lost} lost", f"{verdict.mismatched} mismatched"]
        if verdict.escaped:
            problems.append(f"{sum(verdict.escaped.values())} exceptions escaped the guard")
        if verdict.unaccounted_bad_payloads:
            problems.append(f"{verdict.unaccounted_bad_payloads} bad payloads neither parked nor rejected")
        headline = f"FAIL: {', '.join(problems)} (of {verdict.acknowledged} acknowledged writes)"
    lines.append(f"verdict  {headline}")
    if verdict.info.get("store"):
        lines.append(f"backend  {verdict.info.get('backend', 'postgres')}: {verdict.info['store']}")
    lines += [f"warning  {warning}" for warning in verdict.warnings]
    lines.append("")
    lines.append(f"  {'write':<16}{'acknowledged':>13}{'persisted':>11}{'lost':>6}   notes")
    for kind, tally in verdict.writes.items():
        notes: list[str] = []
        if tally.superseded:
            notes.append(f"{tally.superseded} superseded by newer writes of the same key")
        if tally.duplicated:
            notes.append(f"{tally.duplicated} duplicated rows")
        if tally.mismatched:
            notes.append(f"{tally.mismatched} MISMATCHED")
        if kind is WriteKind.EVENT and verdict.info.get("penguiflow_events"):
            notes.append(f"{verdict.info['penguiflow_events']} saved by PenguiFlow itself")
        if kind is WriteKind.ARTIFACT and verdict.artifacts_refused:
            notes.append(f"+{verdict.artifacts_refused} refused (not acknowledged)")
        counts = f"{tally.acknowledged:>13}{tally.persisted:>11}{tally.lost:>6}"
        lines.append(f"  {LABELS[kind]:<16}{counts}   {'; '.join(notes)}".rstrip())
        lines += [f"      e.g. {example}" for example in tally.examples]
    lines.append(
        f"  {'total':<16}{verdict.acknowledged:>13}{verdict.persisted:>11}{verdict.lost:>6}"
        + (
            f"   incl. {verdict.info['nul_writes']} with NUL characters"
            if verdict.info.get("nul_writes")
            else ""
        )
    )
    pauses = verdict.pauses
    lines += [
        "",
        f"  pauses: {pauses.resumed} resumed (consume once), {pauses.waiting_in_database} still "
        f"waiting in the database, {pauses.consumed_without_answer} consumed without an answer, "
        f"{pauses.resumed_then_still_loadable} loadable again after their resume"
        + (
            f" ({verdict.info['resume_retries']} resumes found nothing and were tried again)"
            if verdict.info.get("resume_retries")
            else ""
        ),
    ]
    if verdict.bad_payloads or verdict.unexpected_parked:
        lines.append(f"  bad payloads: {len(verdict.bad_payloads)} sent")
        groups = Counter((item.result, item.method, item.label) for item in verdict.bad_payloads)
        reasons = {(item.result, item.method, item.label): item.reason for item in verdict.bad_payloads}
        for (result, method, label), count in groups.items():
            reason = _short(reasons[(result, method, label)])
            lines.append(f"    {count}x {result:<11} {label} ({method}): {reason}")
        for item in verdict.unexpected_parked:
            lines.append(f"    UNEXPECTED parked {item.method}: {_short(item.reason)}")
    if verdict.escaped:
        lines.append(f"  exceptions that escaped the guard: {verdict.escaped}")
    held = verdict.dead_letters
    if held:
        lines.append(
            f"  dead letters: {held['enqueued_total']} held during faults, "
            f"{held['replayed_total']} replayed, {held['superseded_total']} superseded, "
            f"{held['dropped_total']} dropped, "
            f"{held['left_after_drain']} left after the drain"
        )
    for name, part in verdict.info.get("parts", {}).items():
        lines.append(
            f"    part {name} ({part['server']}): {part['held']} held, {part['replayed']} replayed, "
            f"{part['left_after_drain']} left"
        )
    if verdict.outcomes:
        outcomes = ", ".join(f"{outcome} {count}" for outcome, count in verdict.outcomes.items())
        lines.append(f"  guarded calls by outcome: {outcomes}")
    if verdict.faults:
        lines.append("  faults:")
        for record in sorted(verdict.faults, key=lambda item: item.started_at):
            mark = "" if record.happened else "  (NO EFFECT)"
            when = f"{record.started_at:6.1f}s-{record.ended_at:5.1f}s"
            lines.append(f"    {when}  {record.kind:<12} {record.effect}{mark}")
    return "\n".join(lines)


__all__ = ["render_verdict"]
