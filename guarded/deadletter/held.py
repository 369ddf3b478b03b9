"""The in-memory index of a dead-letter buffer's held writes (no I/O, no event loop).

What waits (in memory, in the spill file, or both), indexed by last-write-wins key and by scope
(stream), with the memory caps, the writes parked in memory, the totals read from the file, the
replay history of each waiting write and the numbering (sequence numbers, file generation, the
epoch that says when sequence numbers read earlier may no longer name the same entries).
:class:`~.buffer.DeadLetterBuffer` and its collaborators share one :class:`HeldIndex`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..config import DeadLetterConfig
from .entries import DeadLetter, ParkedWrite, index_key_of_canonical
from .gate import Slot
from .spill import RowInfo, SetAside, SpillTotals


@dataclass(slots=True)
class ScopeCount:
    """The waiting entries of one ``(method, scope)``."""

    total: int = 0
    held: dict[int, None] = field(default_factory=dict)
    """Entries of the scope whose payload is in memory (held copies and memory-only entries)."""


@dataclass(slots=True)
class Retry:
    """The replay history of one held write (kept in memory while it waits)."""

    failures: int = 0
    """Failed attempts in a row (its backoff)."""
    attempts: int = 0
    """Failures counted toward parking it (``config.max_replay_attempts``)."""
    due: float = 0.0
    """When it may be tried again (the buffer's monotonic clock)."""
    failed_at: float = -math.inf
    reason: str = ""
    uncounted: bool = False
    """Its last failure was not counted (the backend may have been down): due at once after a success."""


def slot_of(entry: DeadLetter) -> Slot | None:
    """The index slot of ``entry``'s last-write-wins key (``None``: an append)."""
    return None if entry.key is None else (entry.method, index_key_of_canonical(entry.key))


class HeldIndex:
    """What a buffer holds and where (see the module docs)."""

    def __init__(self, config: DeadLetterConfig) -> None:
        self.config = config
        self.generation = 1
        """The generation of the file the writes of this process go to."""
        self.next_seq = 1
        self.epoch = 0
        """Changes whenever sequence numbers read earlier may no longer name the same entries."""

        self.memory: OrderedDict[int, DeadLetter] = OrderedDict()
        """Copies of entries the spill file holds, within the memory caps."""
        self.volatile: OrderedDict[int, DeadLetter] = OrderedDict()
        """Waiting entries the spill file does not hold (memory only, or not yet committed)."""
        self.memory_bytes = 0
        self.keys: dict[Slot, dict[int, tuple[int, int]]] = {}
        """Waiting entries of each last-write-wins key: seq -> (generation, stamp)."""
        self.keyed_scope: dict[int, str] = {}
        self.scopes: dict[tuple[str, str], ScopeCount] = {}
        self.recent: OrderedDict[Slot, int] = OrderedDict()
        """The stamp of the latest successful direct write of recently written keys."""
        self.recent_times: dict[Slot, int] = {}
        """The logical time of those direct writes, where known (the keys are among ``recent``'s):
        what an adopted orphan's write of the key is compared with."""
        self.pending_deletes: dict[int, bool] = {}
        """Waiting entries of the file to delete once it takes writes again (value: keyed; a
        keyed one is already forgotten, an unkeyed one still counts in the depth)."""
        self.depth = 0
        self.disk_bytes = 0
        self.oldest: float | None = None
        self.file_parked = 0
        self.file_parked_bytes = 0
        self.parked_memory: OrderedDict[int, ParkedWrite] = OrderedDict()
        self.parked_memory_bytes = 0
        self.file_quarantined = 0
        self.retries: dict[int, Retry] = {}
        """Replay histories of waiting writes that failed (by seq)."""
        self.healthy_at = -math.inf
        """When the backend last took a write (a replay, or a direct write of a key)."""

    @property
    def parked(self) -> int:
        return self.file_parked + len(self.parked_memory)

    def oldest_age(self, now: float) -> float:
        if self.depth == 0:
            return 0.0
        oldest = self.oldest
        try:
            first = next(iter(self.volatile.values())).enqueued_at
        except (StopIteration, RuntimeError):  # empty, or changing under a scrape thread
            first = None
        if first is not None and (oldest is None or first < oldest):
            oldest = first
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def held_entry(self, seq: int) -> DeadLetter | None:
        """The waiting entry ``seq`` when memory holds it."""
        return self.memory.get(seq) or self.volatile.get(seq)

    def still_waiting(self, entry: DeadLetter, *, has_file: bool) -> bool:
        """Whether ``entry`` still waits (``has_file``: the buffer has a spill file)."""
        if entry.seq in self.volatile:
            return True
        if entry.seq in self.pending_deletes:
            return False
        if entry.key is not None:
            seqs = self.keys.get((entry.method, index_key_of_canonical(entry.key)))
            return seqs is not None and entry.seq in seqs
        return has_file

    # --- finding slots ----------------------------------------------------------------------------

    def slot_of_row(self, seq: int, method: str | None, key: str | None) -> Slot | None:
        """The index slot holding ``seq``: the one its row names when that holds it, else found."""
        if method is not None and key is not None:
            try:
                slot: Slot = (method, index_key_of_canonical(key))
            except (ValueError, RecursionError):
                pass
            else:
                if seq in self.keys.get(slot, {}):
                    return slot
        return self.find_slot(seq)

    def find_slot(self, seq: int) -> Slot | None:
        """The index slot of a keyed waiting entry, found by its seq (slow: damaged rows only)."""
        for slot, seqs in self.keys.items():
            if seq in seqs:
                return slot
        return None

    def regenerate(self, previous: int, current: int) -> None:
        """Entries of this process carry the generation of the file they go to."""
        if previous == current:
            return
        for seqs in self.keys.values():
            for seq, (generation, stamp) in list(seqs.items()):
                if generation == previous:
                    seqs[seq] = (current, stamp)

    # --- adding -----------------------------------------------------------------------------------

    def _count_in_scope(self, method: str, scope: str, seq: int, *, held: bool) -> None:
        found = self.scopes.setdefault((method, scope), ScopeCount())
        found.total += 1
        if held:
            found.held[seq] = None

    def _key(self, slot: Slot, seq: int, position: tuple[int, int], scope: str | None) -> None:
        self.keys.setdefault(slot, {})[seq] = position
        if scope is not None:
            self.keyed_scope[seq] = scope

    def remember(self, entry: DeadLetter, slot: Slot | None) -> None:
        """A new waiting entry, held in memory until the file has it."""
        self.depth += 1
        self.volatile[entry.seq] = entry
        self.memory_bytes += entry.size
        self.make_room()
        if slot is not None:
            self._key(slot, entry.seq, (self.generation, entry.stamp), entry.scope)
        if entry.scope is not None:
            self._count_in_scope(entry.method, entry.scope, entry.seq, held=True)

    def index_row(self, row: RowInfo) -> None:
        """A waiting entry of the file."""
        self.depth += 1
        if row.key is not None:
            slot = (row.method, index_key_of_canonical(row.key))
            self._key(slot, row.seq, (row.generation, row.stamp), row.scope)
        if row.scope is not None:
            self._count_in_scope(row.method, row.scope, row.seq, held=row.seq in self.memory)

    def reindex(self, rows: Sequence[RowInfo]) -> None:
        """Rebuild the index from the file's ``rows`` and the memory-only entries."""
        positions = {seq: position for seqs in self.keys.values() for seq, position in seqs.items()}
        self.keys.clear()
        self.keyed_scope.clear()
        self.scopes.clear()
        self.depth = 0
        for row in rows:
            self.index_row(row)
        for entry in self.volatile.values():
            slot = slot_of(entry)
            self.depth += 1
            if slot is not None:
                position = positions.get(entry.seq, (self.generation, entry.stamp))
                self._key(slot, entry.seq, position, entry.scope)
            if entry.scope is not None:
                self._count_in_scope(entry.method, entry.scope, entry.seq, held=True)

    def apply_totals(self, totals: SpillTotals) -> None:
        self.file_quarantined = totals.quarantined
        self.disk_bytes = totals.pending_bytes
        self.file_parked = totals.parked
        self.file_parked_bytes = totals.parked_bytes
        self.oldest = None if totals.oldest is None else totals.oldest[1]

    # --- forgetting -------------------------------------------------------------------------------

    def forget(self, seq: int, method: str, slot: Slot | None, scope: str | None) -> None:
        self.retries.pop(seq, None)
        if slot is not None and seq not in self.keys.get(slot, {}):
            slot = self.find_slot(seq) or slot
        self.depth -= 1
        held = self.memory.pop(seq, None)
        if held is None:
            held = self.volatile.pop(seq, None)
        if held is not None:
            self.memory_bytes -= held.size
        if slot is not None:
            seqs = self.keys.get(slot)
            if seqs is not None:
                seqs.pop(seq, None)
                if not seqs:
                    del self.keys[slot]
            self.keyed_scope.pop(seq, None)
        if scope is not None:
            found = self.scopes.get((method, scope))
            if found is not None:
                found.total -= 1
                found.held.pop(seq, None)
                if found.total <= 0:
                    del self.scopes[(method, scope)]

    def forget_entry(self, entry: DeadLetter) -> None:
        self.forget(entry.seq, entry.method, slot_of(entry), entry.scope)

    def forget_row(self, row: RowInfo) -> None:
        if row.parked:
            return
        if row.damaged:
            slot = self.slot_of_row(row.seq, row.method, row.key)
            scope = self.keyed_scope.get(row.seq) if slot is not None else row.scope
            self.forget(row.seq, row.method, slot, scope)
            return
        slot = None if row.key is None else (row.method, index_key_of_canonical(row.key))
        self.forget(row.seq, row.method, slot, row.scope)

    def forget_rows(self, rows: Sequence[RowInfo]) -> None:
        for row in rows:
            self.forget_row(row)

    def forget_set_aside(self, item: SetAside) -> None:
        """A waiting entry of the file was set aside: it no longer waits."""
        seq = item.seq
        if seq is None:
            return
        if seq in self.pending_deletes:
            if not self.pending_deletes.pop(seq):  # unkeyed: still counted
                self.forget(seq, item.method or "", None, item.scope)
            return
        slot = self.slot_of_row(seq, item.method, item.key)
        if slot is not None:
            self.forget(seq, slot[0], slot, self.keyed_scope.get(seq))
        elif item.key is None:
            self.forget(seq, item.method or "", None, item.scope)

    def defer_delete(self, seq: int, slot: Slot | None) -> None:
        """The file cannot delete ``seq`` now: forget it (a keyed one) and delete it when it can."""
        if slot is not None:
            seqs = self.keys.get(slot)
            if seqs is None or seq not in seqs:
                return
            self.forget(seq, slot[0], slot, self.keyed_scope.get(seq))
        self.pending_deletes[seq] = slot is not None

    def clear_waiting(self) -> None:
        """The file and memory hold no waiting write any more (purged)."""
        self.memory.clear()
        self.volatile.clear()
        self.memory_bytes = 0
        self.keys.clear()
        self.keyed_scope.clear()
        self.scopes.clear()
        self.pending_deletes.clear()
        self.retries.clear()
        self.depth = 0
        self.oldest = None

    # --- memory caps ------------------------------------------------------------------------------

    def settle(self, entries: Sequence[DeadLetter]) -> None:
        """``entries`` are in the file now: keep copies in memory while the caps allow."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        for entry in entries:
            if self.volatile.pop(entry.seq, None) is None:
                continue
            if len(self.memory) + len(self.volatile) < cap_entries and self.memory_bytes <= cap_bytes:
                self.memory[entry.seq] = entry
            else:
                self.drop_payload(entry)

    def make_room(self) -> None:
        """Keep the memory caps with the writes waiting for their commit counted: the copies of
        writes already in the file go first, oldest first."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        memory = self.memory
        while memory and (self.memory_bytes > cap_bytes or len(memory) + len(self.volatile) > cap_entries):
            _, entry = memory.popitem(last=False)
            self.drop_payload(entry)

    def drop_payload(self, entry: DeadLetter) -> None:
        self.memory_bytes -= entry.size
        if entry.scope is not None:
            found = self.scopes.get((entry.method, entry.scope))
            if found is not None:
                found.held.pop(entry.seq, None)

    def enforce_memory(self) -> list[str]:
        """Without a usable spill file: keep memory within its caps by letting go of copies of
        what the file holds and of the oldest parked writes held in memory (bad data, answered
        ``rejected``); returns the methods of the parked writes dropped (to count and log).
        Waiting writes held in memory only were acknowledged: they are never dropped (new ones
        are refused at the caps instead)."""
        cap_entries, cap_bytes = self.config.max_memory_entries, self.config.max_memory_bytes
        while self.memory and (
            len(self.memory) + len(self.volatile) > cap_entries or self.memory_bytes > cap_bytes
        ):
            _, held = self.memory.popitem(last=False)
            self.drop_payload(held)
        dropped: list[str] = []
        while self.parked_memory and (
            len(self.parked_memory) > cap_entries or self.parked_memory_bytes > cap_bytes
        ):
            _, parked = self.parked_memory.popitem(last=False)
            self.parked_memory_bytes -= parked.size
            dropped.append(parked.method)
        return dropped

    def hold_parked(self, parked: ParkedWrite) -> None:
        """A parked write the file does not hold (yet)."""
        self.parked_memory[parked.seq] = parked
        self.parked_memory_bytes += parked.size

    def clear_parked_memory(self) -> None:
        self.parked_memory.clear()
        self.parked_memory_bytes = 0


__all__ = ["HeldIndex", "Retry", "ScopeCount", "slot_of"]
