"""The verdict can fail: each kind of loss, mismatch and unaccounted bad payload is reported.

Built from a ledger (what callers were acknowledged) and a snapshot (what the database holds)
written by hand, so every case is exact. The end-to-end run in test_demo_run.py checks the same
function against a real database.
"""

from __future__ import annotations

from guarded.deadletter import ParkedWrite
from guarded.demo.faults import FaultRecord
from guarded.demo.ledger import BadWrite, Ledger, WriteKind
from guarded.demo.readback import Snapshot, StoredPause
from guarded.demo.report import render_verdict
from guarded.demo.verdict import compute_verdict

EVENT = ("trace-1", "node_start", "planner-0", 1.5)


def ledger_and_snapshot() -> tuple[Ledger, Snapshot]:
    """One acknowledged write of every kind, and a database holding exactly them."""
    ledger, snapshot = Ledger(), Snapshot()
    ledger.event(EVENT, {"step": 1})
    snapshot.put(WriteKind.EVENT, EVENT, {"step": 1})
    ledger.append(WriteKind.UPDATE, ("s", "u1"), {"step": 1})
    snapshot.put(WriteKind.UPDATE, ("s", "u1"), {"step": 1})
    for revision in (1, 2, 3):
        ledger.upsert(WriteKind.MEMORY, "demo:u:s", {"turns": revision})
    snapshot.upserts[WriteKind.MEMORY]["demo:u:s"] = {"turns": 3}
    ledger.pauses["p-resumed"] = {"step": 1}
    ledger.resumed["p-resumed"] = {"step": 1}
    snapshot.pauses["p-resumed"] = StoredPause({"step": 1}, consumed=True)
    ledger.pauses["p-waiting"] = {"step": 2}
    snapshot.pauses["p-waiting"] = StoredPause({"step": 2}, consumed=False)
    ledger.artifacts["artifact-1"] = "sha-1"
    snapshot.artifacts["artifact-1"] = "sha-1"
    return ledger, snapshot


def test_a_database_holding_every_acknowledged_write_passes() -> None:
    ledger, snapshot = ledger_and_snapshot()
    verdict = compute_verdict(ledger, snapshot)
    assert verdict.passed
    assert (verdict.acknowledged, verdict.persisted, verdict.lost) == (8, 8, 0)
    assert verdict.writes[WriteKind.MEMORY].superseded == 2
    assert verdict.warnings == []
    assert render_verdict(verdict).startswith("verdict  PASS: 8 writes acknowledged, all 8 in PostgreSQL")


def test_a_missing_acknowledged_event_is_one_lost_write() -> None:
    ledger, snapshot = ledger_and_snapshot()
    del snapshot.appends[WriteKind.EVENT][EVENT]
    verdict = compute_verdict(ledger, snapshot)
    assert not verdict.passed
    assert verdict.lost == 1
    assert verdict.writes[WriteKind.EVENT].examples == [f"missing {EVENT!r}"]
    assert render_verdict(verdict).startswith(
        "verdict  FAIL: 1 lost, 0 mismatched (of 8 acknowledged writes)"
    )
    assert verdict.to_dict()["lost"] == 1


def test_different_content_under_the_same_identity_is_a_mismatch() -> None:
    ledger, snapshot = ledger_and_snapshot()
    snapshot.appends[WriteKind.UPDATE][("s", "u1")] = {"step": 2}
    verdict = compute_verdict(ledger, snapshot)
    assert (verdict.lost, verdict.mismatched, verdict.passed) == (0, 1, False)


def test_an_older_value_overwriting_newer_acknowledged_writes_loses_them() -> None:
    ledger, snapshot = ledger_and_snapshot()
    snapshot.upserts[WriteKind.MEMORY]["demo:u:s"] = {"turns": 1}  # a stale replay won
    verdict = compute_verdict(ledger, snapshot)
    tally = verdict.writes[WriteKind.MEMORY]
    assert (tally.persisted, tally.lost) == (1, 2)
    assert tally.examples == ["'demo:u:s' holds write 1 of 3 (newer ones overwritten)"]
    assert not verdict.passed


def test_a_missing_key_or_a_value_nobody_wrote_loses_every_write_of_the_key() -> None:
    ledger, snapshot = ledger_and_snapshot()
    snapshot.upserts[WriteKind.MEMORY]["demo:u:s"] = {"turns": 99}
    assert compute_verdict(ledger, snapshot).writes[WriteKind.MEMORY].lost == 3
    del snapshot.upserts[WriteKind.MEMORY]["demo:u:s"]
    assert compute_verdict(ledger, snapshot).writes[WriteKind.MEMORY].lost == 3


def test_a_pause_neither_resumed_nor_stored_is_lost() -> None:
    ledger, snapshot = ledger_and_snapshot()
    del snapshot.pauses["p-waiting"]
    verdict = compute_verdict(ledger, snapshot)
    assert verdict.writes[WriteKind.PAUSE].lost == 1
    assert not verdict.passed


def test_resume_problems_are_warnings_not_losses() -> None:
    ledger, snapshot = ledger_and_snapshot()
    snapshot.pauses["p-waiting"] = StoredPause({"step": 2}, consumed=True)  # consumed, answer lost
    snapshot.pauses["p-resumed"] = StoredPause({"step": 1}, consumed=False)  # resumable twice
    verdict = compute_verdict(ledger, snapshot)
    assert verdict.passed
    assert verdict.pauses.consumed_without_answer == 1
    assert verdict.pauses.resumed_then_still_loadable == 1
    assert len(verdict.warnings) == 2
    assert "warning  1 pauses were consumed in the database" in render_verdict(verdict)


def test_refused_artifact_puts_are_not_acknowledged_and_the_rest_are_lost() -> None:
    """A refused put answers a reference outside strict mode, but was never acknowledged: it is
    counted apart; an absent artifact no refusal accounts for is lost. Outcome ``fallback`` no
    longer excuses an absent artifact."""
    ledger, snapshot = ledger_and_snapshot()
    ledger.artifacts.update({"artifact-2": "sha-2", "artifact-3": "sha-3", "artifact-4": "sha-4"})
    counts = {("artifact_store.put_text", "refused"): 1, ("artifact_store.put_bytes", "fallback"): 1}
    verdict = compute_verdict(ledger, snapshot, call_counts=counts)
    assert verdict.artifacts_refused == 1
    tally = verdict.writes[WriteKind.ARTIFACT]
    assert (tally.acknowledged, tally.persisted, tally.lost) == (3, 1, 2)
    assert not verdict.passed
    assert any("1 artifact puts were refused" in warning for warning in verdict.warnings)
    assert "+1 refused (not acknowledged)" in render_verdict(verdict)
    assert verdict.to_dict()["artifacts_refused"] == 1


def test_bad_payloads_must_be_parked_or_rejected_with_a_reason() -> None:
    ledger, snapshot = ledger_and_snapshot()
    ledger.bad += [
        BadWrite("NaN in an event payload", "save_event", "parked"),
        BadWrite("lone surrogate in a memory state", "save_memory_state", "parked"),
        BadWrite("oversized artifact", "artifact_store.put_bytes", "rejected"),
    ]
    parked = [
        ParkedWrite(1, "save_event", None, "InvalidPayloadError: nan is not a valid JSON number", 0.0, 0),
        ParkedWrite(2, "save_task", None, "InvalidPayloadError: inf is not a valid JSON number", 0.0, 0),
    ]
    verdict = compute_verdict(
        ledger,
        snapshot,
        parked=parked,
        call_counts={("artifact_store.put_bytes", "rejected"): 1},
        rejection_reasons={"artifact_store.put_bytes": "ArtifactTooLargeError"},
    )
    results = [(item.method, item.result, item.reason) for item in verdict.bad_payloads]
    assert results == [
        ("save_event", "parked", "InvalidPayloadError: nan is not a valid JSON number"),
        ("save_memory_state", "unaccounted", "not parked"),
        ("artifact_store.put_bytes", "rejected", "ArtifactTooLargeError"),
    ]
    assert [item.method for item in verdict.unexpected_parked] == ["save_task"]
    assert verdict.unaccounted_bad_payloads == 1
    assert not verdict.passed
    assert "1 bad payloads neither parked nor rejected" in render_verdict(verdict)


def test_an_exception_escaping_the_guard_fails_the_run() -> None:
    ledger, snapshot = ledger_and_snapshot()
    ledger.escaped["ConnectionError"] += 1
    assert not compute_verdict(ledger, snapshot).passed


def test_a_fault_without_effect_is_a_warning() -> None:
    ledger, snapshot = ledger_and_snapshot()
    record = FaultRecord("kill", 1.0, 1.0, 2.0, "0 store connections terminated", happened=False)
    verdict = compute_verdict(ledger, snapshot, faults=[record])
    assert verdict.passed
    assert verdict.warnings == ["some faults had no effect (see the fault timeline)"]
    assert "(NO EFFECT)" in render_verdict(verdict)
