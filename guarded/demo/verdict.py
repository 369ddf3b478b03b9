"""The demo's verdict: every acknowledged write looked up in what the database holds.

Computed from the :class:`~guarded.demo.ledger.Ledger` (what callers were acknowledged) and a
:class:`~guarded.demo.readback.Snapshot` (what PostgreSQL holds, read behind the store's back):

* appends (events, updates, steering, planner events) by identity: *persisted* when found with
  the same content, *mismatched* when found with other content, *lost* when missing;
* last-write-wins writes (tasks, memory, trajectories) per key: writes up to the stored value are
  in effect (the older ones *superseded*), later ones are *lost* (a missing key loses all);
* pauses (consume once): *persisted* when a resume got the payload back, or the row is in the
  database (still waiting, or consumed); *lost* when it is missing. Two resume problems are
  reported as warnings, not losses: a row consumed while its resume got nothing (the answer
  was lost), and a row still loadable after a resume got it (it could be resumed twice);
* artifacts: *persisted* when stored; an artifact the database could not take is held in the
  artifact spill file (outcome ``dead_lettered``) and expected in the database after the drain;
  a put the spill file could not hold either is refused (outcome ``refused``: never acknowledged,
  though it answers a reference outside strict mode) and counted apart;
* bad payloads: each must be parked with its reason (or rejected, for artifacts).

The run passes when nothing is lost or mismatched, no exception escaped the guard and every bad
payload was parked or rejected.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from guarded.deadletter import DeadLetterStats, ParkedWrite

from .faults import FaultRecord
from .ledger import APPEND_KINDS, UPSERT_KINDS, Ledger, WriteKind
from .readback import Snapshot

EXAMPLES = 3
"""Identities of lost or mismatched writes listed per kind."""


@dataclass
class KindTally:
    """The verdict for one kind of write."""

    acknowledged: int = 0
    persisted: int = 0
    lost: int = 0
    mismatched: int = 0
    superseded: int = 0
    duplicated: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        if len(self.examples) < EXAMPLES:
            self.examples.append(what)

    def to_dict(self) -> dict[str, Any]:
        return {
            "acknowledged": self.acknowledged,
            "persisted": self.persisted,
            "lost": self.lost,
            "mismatched": self.mismatched,
            "superseded": self.superseded,
            "duplicated": self.duplicated,
            "examples": list(self.examples),
        }


@dataclass
class PauseTally:
    """How the acknowledged pauses ended."""

    resumed: int = 0
    resumed_then_still_loadable: int = 0
    waiting_in_database: int = 0
    consumed_without_answer: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "resumed": self.resumed,
            "resumed_then_still_loadable": self.resumed_then_still_loadable,
            "waiting_in_database": self.waiting_in_database,
            "consumed_without_answer": self.consumed_without_answer,
        }


@dataclass(frozen=True, slots=True)
class BadPayloadResult:
    """What became of one bad payload: ``parked`` / ``rejected`` with the reason, or ``unaccounted``."""

    label: str
    method: str
    result: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"label": self.label, "method": self.method, "result": self.result, "reason": self.reason}


@dataclass
class Verdict:
    """Everything the demo reports at the end (``to_dict()`` is the ``--json`` document)."""

    writes: dict[WriteKind, KindTally]
    pauses: PauseTally
    artifacts_refused: int
    """Artifact puts answered ``refused``: not acknowledged, so not expected in the database."""
    bad_payloads: list[BadPayloadResult]
    unexpected_parked: list[BadPayloadResult]
    escaped: dict[str, int]
    faults: list[FaultRecord]
    outcomes: dict[str, int]
    dead_letters: dict[str, int]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """Problems that lose no acknowledged write but deserve attention."""
        found: list[str] = []
        pauses = self.pauses
        if pauses.consumed_without_answer:
            found.append(
                f"{pauses.consumed_without_answer} pauses were consumed in the database while their resume "
                "got nothing (the consume's answer was lost; a later resume gets None)"
            )
        if pauses.resumed_then_still_loadable:
            found.append(
                f"{pauses.resumed_then_still_loadable} pauses were resumed and are still loadable in the "
                "database (they could be resumed twice)"
            )
        if self.artifacts_refused:
            found.append(
                f"{self.artifacts_refused} artifact puts were refused: neither the database nor the "
                "artifact spill file could take them (outcome refused, never acknowledged)"
            )
        duplicated = sum(tally.duplicated for tally in self.writes.values())
        if duplicated:
            found.append(f"{duplicated} duplicated rows")
        if self.faults and not all(record.happened for record in self.faults):
            found.append("some faults had no effect (see the fault timeline)")
        return found

    @property
    def acknowledged(self) -> int:
        return sum(tally.acknowledged for tally in self.writes.values())

    @property
    def persisted(self) -> int:
        return sum(tally.persisted for tally in self.writes.values())

    @property
    def lost(self) -> int:
        return sum(tally.lost for tally in self.writes.values())

    @property
    def mismatched(self) -> int:
        return sum(tally.mismatched for tally in self.writes.values())

    @property
    def unaccounted_bad_payloads(self) -> int:
        return sum(1 for item in self.bad_payloads if item.result == "unaccounted")

    @property
    def passed(self) -> bool:
        return (
            self.lost == 0
            and self.mismatched == 0
            and not self.escaped
            and self.unaccounted_bad_payloads == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "acknowledged": self.acknowledged,
            "persisted": self.persisted,
            "lost": self.lost,
            "mismatched": self.mismatched,
            "writes": {kind.value: tally.to_dict() for kind, tally in self.writes.items()},
            "pauses": self.pauses.to_dict(),
            "artifacts_refused": self.artifacts_refused,
            "warnings": self.warnings,
            "bad_payloads": [item.to_dict() for item in self.bad_payloads],
            "unexpected_parked": [item.to_dict() for item in self.unexpected_parked],
            "escaped_exceptions": dict(self.escaped),
            "faults": [record.to_dict() for record in self.faults],
            "outcomes": dict(self.outcomes),
            "dead_letters": dict(self.dead_letters),
            **self.info,
        }


def _tally_appends(expected: Mapping[Hashable, Any], snapshot: Snapshot, kind: WriteKind) -> KindTally:
    tally = KindTally(acknowledged=len(expected))
    found, copies = snapshot.appends[kind], snapshot.copies[kind]
    for key, content in expected.items():
        if key not in found:
            tally.lost += 1
            tally.note(f"missing {key!r}")
        elif content is not None and found[key] != content:
            tally.mismatched += 1
            tally.note(f"different content for {key!r}")
        else:
            tally.persisted += 1
        if copies[key] > 1:
            tally.duplicated += copies[key] - 1
    return tally


_MISSING = object()


def _tally_upserts(expected: Mapping[Hashable, list[Any]], found: Mapping[Hashable, Any]) -> KindTally:
    tally = KindTally()
    for key, values in expected.items():
        tally.acknowledged += len(values)
        stored = found.get(key, _MISSING)
        matches = [index for index, value in enumerate(values) if value == stored]
        if not matches:
            tally.lost += len(values)
            tally.note(f"{'missing' if stored is _MISSING else 'unacknowledged value for'} {key!r}")
            continue
        in_effect = matches[-1] + 1
        tally.persisted += in_effect
        tally.superseded += in_effect - 1
        if in_effect < len(values):
            tally.lost += len(values) - in_effect
            tally.note(f"{key!r} holds write {in_effect} of {len(values)} (newer ones overwritten)")
    return tally


def _tally_pauses(ledger: Ledger, snapshot: Snapshot) -> tuple[KindTally, PauseTally]:
    tally, pauses = KindTally(acknowledged=len(ledger.pauses)), PauseTally()
    for token, payload in ledger.pauses.items():
        row = snapshot.pauses.get(token)
        resumed = ledger.resumed.get(token)
        if resumed is not None:
            if resumed == payload:
                tally.persisted += 1
                pauses.resumed += 1
                if row is not None and not row.consumed:
                    pauses.resumed_then_still_loadable += 1
            else:
                tally.mismatched += 1
                tally.note(f"resume of {token!r} returned another payload")
        elif row is None:
            tally.lost += 1
            tally.note(f"missing {token!r}")
        elif row.payload != payload:
            tally.mismatched += 1
            tally.note(f"different payload for {token!r}")
        elif row.consumed:
            tally.persisted += 1
            pauses.consumed_without_answer += 1
        else:
            tally.persisted += 1
            pauses.waiting_in_database += 1
    return tally, pauses


def _tally_artifacts(ledger: Ledger, snapshot: Snapshot, refused: int) -> tuple[KindTally, int]:
    tally = KindTally(acknowledged=len(ledger.artifacts))
    absent: list[str] = []
    for artifact_id, sha256 in ledger.artifacts.items():
        stored = snapshot.artifacts.get(artifact_id)
        if stored is None:
            absent.append(artifact_id)
        elif stored != sha256:
            tally.mismatched += 1
            tally.note(f"different content for artifact {artifact_id!r}")
        else:
            tally.persisted += 1
    # A refused put (outcome ``refused``) answered a reference all the same: it was never
    # acknowledged, so it is not expected in the database.
    not_acknowledged = min(len(absent), refused)
    tally.acknowledged -= not_acknowledged
    tally.lost = len(absent) - not_acknowledged
    for artifact_id in absent[not_acknowledged:][:EXAMPLES]:
        tally.note(f"missing artifact {artifact_id!r}")
    return tally, not_acknowledged


def _bad_payloads(
    ledger: Ledger, parked: Sequence[ParkedWrite], rejections: Mapping[str, int], reasons: Mapping[str, str]
) -> tuple[list[BadPayloadResult], list[BadPayloadResult]]:
    waiting: dict[str, list[ParkedWrite]] = defaultdict(list)
    for entry in parked:
        waiting[entry.method].append(entry)
    rejected_left = Counter(rejections)
    results: list[BadPayloadResult] = []
    for bad in ledger.bad:
        if bad.expect == "parked" and waiting[bad.method]:
            entry = waiting[bad.method].pop(0)
            results.append(BadPayloadResult(bad.label, bad.method, "parked", entry.reason))
        elif bad.expect == "rejected" and rejected_left[bad.method] > 0:
            rejected_left[bad.method] -= 1
            reason = reasons.get(bad.method, "refused by the backend")
            results.append(BadPayloadResult(bad.label, bad.method, "rejected", reason))
        else:
            results.append(BadPayloadResult(bad.label, bad.method, "unaccounted", f"not {bad.expect}"))
    unexpected = [
        BadPayloadResult("unexpected", entry.method, "parked", entry.reason)
        for entries in waiting.values()
        for entry in entries
    ]
    return results, unexpected


def compute_verdict(
    ledger: Ledger,
    snapshot: Snapshot,
    *,
    parked: Sequence[ParkedWrite] = (),
    call_counts: Mapping[tuple[str, str], int] | None = None,
    rejection_reasons: Mapping[str, str] | None = None,
    dead_letters: DeadLetterStats | None = None,
    faults: Sequence[FaultRecord] = (),
    info: Mapping[str, Any] | None = None,
) -> Verdict:
    """Judge the run: ``ledger`` against ``snapshot``, plus what the guard parked and counted.

    ``call_counts`` are the guard's calls by (method, outcome) (``controller(store).stats()``);
    ``rejection_reasons`` the reason logged per method for calls with outcome ``rejected``.
    """
    counts = dict(call_counts or {})
    writes: dict[WriteKind, KindTally] = {}
    for kind in APPEND_KINDS:
        writes[kind] = _tally_appends(ledger.appends[kind], snapshot, kind)
    for kind in UPSERT_KINDS:
        writes[kind] = _tally_upserts(ledger.upserts[kind], snapshot.upserts[kind])
    writes[WriteKind.PAUSE], pauses = _tally_pauses(ledger, snapshot)
    refused_puts = sum(
        count
        for (method, outcome), count in counts.items()
        if method.startswith("artifact_store.put_") and outcome == "refused"
    )
    writes[WriteKind.ARTIFACT], refused = _tally_artifacts(ledger, snapshot, refused_puts)
    rejections = {method: count for (method, outcome), count in counts.items() if outcome == "rejected"}
    bad, unexpected = _bad_payloads(ledger, parked, rejections, rejection_reasons or {})
    outcomes: Counter[str] = Counter()
    for (_, outcome), count in counts.items():
        outcomes[outcome] += count
    held: dict[str, int] = {}
    if dead_letters is not None:
        held = {
            "enqueued_total": dead_letters.enqueued_total,
            "replayed_total": dead_letters.replayed_total,
            "superseded_total": dead_letters.superseded_total,
            "dropped_total": dead_letters.dropped_total,
            "parked_total": dead_letters.parked_total,
            "left_after_drain": dead_letters.depth,
        }
    return Verdict(
        writes=writes,
        pauses=pauses,
        artifacts_refused=refused,
        bad_payloads=bad,
        unexpected_parked=unexpected,
        escaped=dict(ledger.escaped),
        faults=list(faults),
        outcomes=dict(outcomes.most_common()),
        dead_letters=held,
        info=dict(info or {}),
    )


__all__ = ["BadPayloadResult", "KindTally", "PauseTally", "Verdict", "compute_verdict"]
